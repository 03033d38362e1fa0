"""One shape for ncu: an SB MMQ kernel at M=512 (3 launches; profile the 3rd).

python3 scripts/ncu_sb.py [sb|sb6] [N K] [-DOPT ...]   (default sb 28672 4096; sb6: q6_K)"""
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq_sb import mmq_sb_linear, repack_sb, sb_tokens, split_q8s
from minfer.cuda.runtime import get_runtime

sys.path.insert(0, "scripts")
from mmq_device import rand_weights  # noqa: E402

args = sys.argv[1:]
opts = tuple(a for a in args if a.startswith("-D"))
args = [a for a in args if not a.startswith("-D")]
kind = args[0] if args else "sb"
N, K = (int(args[1]), int(args[2])) if len(args) >= 3 else (28672, 4096)
qt = 14 if kind == "sb6" else 12
rt = get_runtime()
rng = np.random.default_rng(0)
M = 512
raw = da.to_device(rt, rand_weights(rng, qt, N, K))
w = repack_sb(rt, raw, qt, N, K)
x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
sq = split_q8s(rt, x, signed=qt == 14)
if qt == 12:
    sq = (*sq, sb_tokens(rt, *sq))
out = da.empty(rt, (M, N), np.float32)
for _ in range(3):
    mmq_sb_linear(rt, sq, w, M, N, K, out, build_opts=opts)
rt.synchronize()
