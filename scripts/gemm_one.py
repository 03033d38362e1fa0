"""One GEMM, launched a few times, for `ncu` (device machine):

python3 scripts/gemm_one.py PATH N K M [nvcc -D options...]
PATH f16 | blk | blk-tok (blk on a per-token operand: the GEMMs after an rmsnorm); the gate|up
shape (N = 28672) runs the swiglu epilogue. Under ncu, profile the third launch: ncu -k regex:'mmq_blk|wgmma_f16' --launch-skip 2 --launch-count 1 ..."""

import sys

import numpy as np

from minfer.cuda.ops.gemm import gemm_f16_nt
from minfer.cuda.ops.mmq_blk import blk_operand, blk_weight, mmq_blk_linear
from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.runtime import get_runtime

path, N, K, M = sys.argv[1], *map(int, sys.argv[2:5])
opts = tuple(sys.argv[5:])
rt = get_runtime()
rng = np.random.default_rng(0)
glu = N == 28672
x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float16))
w16 = da.to_device(rt, (rng.standard_normal((N, K)) * 0.02).astype(np.float16))
out = da.empty(rt, (M, N // 2) if glu else (M, N), np.float16 if glu else np.float32, "out")
if path.startswith("blk"):
    wb, tt = blk_weight(rt, w16), blk_operand(rt, x, per_token=path == "blk-tok")
for _ in range(4):
    if path.startswith("blk"):
        mmq_blk_linear(rt, tt, wb, M, N, K, out, build_opts=opts, glu=glu)
    else:
        gemm_f16_nt(x, w16, np.float16 if glu else np.float32, out=out, rt=rt, glu=glu)
rt.synchronize()
print("ok")
