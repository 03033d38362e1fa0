"""Per-op CUDA-event profile of one CudaBackend prefill, every label (device machine).

python3 lab/profile_ops.py MODEL.gguf [--tokens 512,2048]
Prints per label: calls, total µs, µs per call, and for GEMMs TFLOP/s. Runs eagerly (events
need the launches one by one), after one unprofiled warm-up prefill of the same length.
--spin-ms N queues the profiled forward behind an N ms spin kernel (smoke.cu spin_cycles), so
its launches are already queued when the GPU reaches them: each op's events then time the GPU
work alone, not the host's launch rate (eager Python launches are 10-30 µs apiece).
"""

import argparse

from minfer.cuda.backend import CudaBackend, OpProfile
from minfer.gguf.loader import load_model
from minfer.tools.bench.ab import prompt_ids

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--tokens", default="512,2048")
ap.add_argument("--spin-ms", type=float, default=0.0)
a = ap.parse_args()
toks = [int(t) for t in a.tokens.split(",")]
m = load_model(a.model)
b = CudaBackend(m, max_tokens=max(toks), ubatch=max(toks), graphs=False)
for n in toks:
    ids = prompt_ids(m, n)
    b.reset()
    b.forward(ids, 0)
    b.reset()
    b.profile = OpProfile(b.rt, a.spin_ms)
    b.forward(ids, 0)
    tot = b.profile.collect()
    b.profile = None
    print(f"\n{n} tokens: | op | calls | µs | µs/call | TFLOP/s |")
    for k in sorted(tot, key=lambda k: -tot[k][0]):
        ms, fl, c = tot[k]
        tf = f"{fl / (ms * 1e-3) / 1e12:.0f}" if fl else ""
        print(f"| {k} | {c} | {ms * 1e3:,.0f} | {ms * 1e3 / c:,.1f} | {tf} |")
