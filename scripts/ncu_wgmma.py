"""One shape for ncu: a wgmma MMQ kernel at M=512 (3 launches; profile the 3rd).

python3 scripts/ncu_wgmma.py [q4_K|q6_K] [N K] [-DOPT ...]   (default q4_K 4096 4096)"""
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack, split6_q8_1, split_q8_1
from minfer.cuda.runtime import get_runtime

sys.path.insert(0, "scripts")
from mmq_device import rand_weights  # noqa: E402

args = sys.argv[1:]
opts = tuple(a for a in args if a.startswith("-D"))
args = [a for a in args if not a.startswith("-D")]
qt = 14 if args and args[0] == "q6_K" else 12
N, K = (int(args[1]), int(args[2])) if len(args) >= 3 else (4096, 4096)
rt = get_runtime()
rng = np.random.default_rng(0)
M = 512
w = repack(rt, da.to_device(rt, rand_weights(rng, qt, N, K)), qt, N, K)
x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
sp = (split6_q8_1 if qt == 14 else split_q8_1)(rt, x)
out = da.empty(rt, (M, N), np.float32)
for _ in range(3):
    mmq_wgmma_linear(rt, sp, w, M, N, K, out, build_opts=opts)
rt.synchronize()
