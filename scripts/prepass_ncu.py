"""ncu driver for the q8_1 prepass: the current quantize_q8_1.cu entries and, when a cubin of
another build is given, the same entries from it (old vs new in one ncu run; ncu's
gpu__time_duration is the GPU time, which the event-timed batches of scripts/mmq_device.py do
not give for a ~5 us kernel: pycuda's host launch cost dominates there). Also checks that both
builds write the same bytes.

python3 scripts/prepass_ncu.py [OLD.cubin]   (M = 512; K = 4096 and 14336; f16 input)"""
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq import quantize_q8_1
from minfer.cuda.mmq_wgmma import split6_q8_1, split_q8_1
from minfer.cuda.runtime import get_runtime

rt = get_runtime()
drv = rt.drv
old = drv.module_from_file(sys.argv[1]) if len(sys.argv) > 1 else None
rng = np.random.default_rng(0)
M = 512
for K in (4096, 14336):
    x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float16))
    for name, fn in (("split", split_q8_1), ("split6", split6_q8_1), ("raw", quantize_q8_1)):
        outs = fn(rt, x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        new = [o.get().copy() for o in outs]
        if old is None:
            continue
        entry = {"split": "quantize_q8_1_split_f16", "split6": "quantize_q8_1_split6_f16",
                 "raw": "quantize_q8_1_raw_f16"}[name]
        f = old.get_function(entry)
        args = [da.arg(x), *(da.arg(o) for o in outs), np.int32(M), np.int32(K)]
        if name == "split":
            args.append(np.int32(outs[1].shape[1]))
        for o in outs:
            drv.memset_d8(da.ptr(o), 0, int(o.nbytes))
        nblk = M * (K // 32)
        f(*args, block=(256, 1, 1), grid=((nblk + 7) // 8, 1))
        rt.synchronize()
        same = all(np.array_equal(a.view(np.uint8), o.get().view(np.uint8)) for a, o in zip(new, outs))
        print(f"{name} K={K}: old and new builds {'IDENTICAL' if same else 'DIFFER'}", flush=True)
