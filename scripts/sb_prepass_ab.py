"""A/B of the SB path's prepass launches (run under ncu for GPU durations; session 10): the
token operand from f16 activations (q8s_sb_operand_f16) and the fused rmsnorm operand
(rmsnorm_sb_operand) of the current build against the same entries of an older cubin of
quantize_q8_1.cu (the bytes must be identical), and rope_qkv's two-pairs-per-thread kernel
against the scalar one (same launcher, wide=True / False; bytes identical).

python3 scripts/sb_prepass_ab.py [OLD_quantize_q8_1.cubin]
ncu --clock-control none --metrics gpu__time_duration.sum \\
    -k regex:"q8s_sb|rmsnorm_sb|rope_qkv" python3 scripts/sb_prepass_ab.py OLD.cubin"""
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.layers import RopeTable, rope_qkv
from minfer.cuda.mmq_sb import sb_operand, sb_operand_rmsnorm
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_wgmma_ref import pad_rows

rt = get_runtime()
old = rt.drv.module_from_file(sys.argv[1]) if len(sys.argv) > 1 else None
rng = np.random.default_rng(0)
ok = True


def same(a, b) -> bool:
    return np.array_equal(a.get().view(np.uint8), b.get().view(np.uint8))


for M, K in ((512, 4096), (512, 14336), (2048, 14336)):
    x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float16))
    new = sb_operand(rt, x).tt
    if old is not None:
        tt = da.empty(rt, new.shape, new.dtype)
        warps = pad_rows(M) * (K // 256)
        old.get_function("q8s_sb_operand_f16")(
            da.arg(x), da.arg(tt), np.int32(M), np.int32(K), np.int32(pad_rows(M)),
            block=(256, 1, 1), grid=((warps + 7) // 8, 1))
        rt.synchronize()
        ok &= same(new, tt)
        verdict = "IDENTICAL" if same(new, tt) else "DIFFER"
        print(f"q8s_sb_operand_f16 [{M}, {K}]: old and new {verdict}")
for M, K in ((512, 4096), (2048, 4096)):
    x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
    w = da.to_device(rt, (1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
    new = sb_operand_rmsnorm(rt, x, w, 1e-5).tt
    if old is not None:
        tt = da.empty(rt, new.shape, new.dtype)
        old.get_function("rmsnorm_sb_operand")(
            da.arg(x), da.arg(w), np.float32(1e-5), np.uintp(0), da.arg(tt), np.int32(M),
            np.int32(K), np.int32(pad_rows(M)), block=(256, 1, 1), grid=(pad_rows(M), 1))
        rt.synchronize()
        ok &= same(new, tt)
        verdict = "IDENTICAL" if same(new, tt) else "DIFFER"
        print(f"rmsnorm_sb_operand [{M}, {K}]: old and new {verdict}")
Hq, Hkv, D = 32, 8, 128   # the 8B shape, one fused q|k|v GEMM output
for T in (512, 2048):
    qkv = da.to_device(rt, rng.standard_normal((T, (Hq + 2 * Hkv) * D)).astype(np.float32))
    table = RopeTable.build(rt, T, 500000.0, D)
    pos = da.to_device(rt, np.array([0], np.int32))
    outs = []
    for wide in (True, False):
        q16 = da.empty(rt, (T, Hq, D), np.float16)
        kc, vc = (da.empty(rt, (T, Hkv, D), np.float16) for _ in range(2))
        rope_qkv(rt, q16, qkv, qkv, qkv, kc, vc, table, 0, pos, D, False,
                 (0, Hq * D, (Hq + Hkv) * D), wide=wide)
        outs.append((q16, kc, vc))
    rt.synchronize()
    eq = all(same(a, b) for a, b in zip(*outs))
    ok &= eq
    print(f"rope_qkv T={T}: wide and scalar {'IDENTICAL' if eq else 'DIFFER'}")
print("AB", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
