"""One shape for ncu: the wgmma q4_K kernel at M=512, N=K=4096 (3 launches; profile the 3rd)."""
import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack_q4k, split_q8_1
from minfer.cuda.runtime import get_runtime
import sys
sys.path.insert(0, "scripts")
from mmq_device import rand_weights  # noqa: E402

rt = get_runtime()
rng = np.random.default_rng(0)
M, N, K = 512, 4096, 4096
w = repack_q4k(rt, da.to_device(rt, rand_weights(rng, 12, N, K)), N, K)
sp = split_q8_1(rt, da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32)))
out = da.empty(rt, (M, N), np.float32)
for _ in range(3):
    mmq_wgmma_linear(rt, sp, w, M, N, K, out)
rt.synchronize()
