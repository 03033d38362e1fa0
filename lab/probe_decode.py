"""Probe: a prompt's greedy ids alone (single.run), in a one-prompt batch, and in the 11-prompt
batch of `minfer check`, per GEMM path; and the lone run's logits at a decode step against a
batched forward of the same tokens at M = 1, 16. Usage: probe_decode.py MODEL PATH..."""

import sys

from minfer.batch import single
from minfer.cuda.plan.config import GemmChoice
from minfer.engine.api import Engine
from minfer.gguf.loader import load_model
from minfer.tools.check import batch_prompts, decode_gap

model = load_model(sys.argv[1])
ps = batch_prompts(model, 64)
for path in sys.argv[2:]:
    eng = Engine(model, "cuda", GemmChoice(path), 64)
    full = {}
    eng.run(enumerate(ps), [len(p) for p in ps], 32, lambda r: full.__setitem__(r.key, r))
    for i in (3, 9):
        one = {}
        eng.run(enumerate([ps[i]]), [len(ps[i])], 32, lambda r: one.__setitem__(r.key, r))
        lone = single.run(eng.backend, ps[i], 32, 64, warmup=False)
        f, o, l_ = full[i].greedy, one[0].greedy, lone.greedy_ids
        k = lambda a, b: next((j for j in range(32) if a[j] != b[j]), 32)  # noqa: E731
        print(
            f"{path} prompt {i}: batch==lone through {k(f, l_)}, one-batch==lone through "
            f"{k(o, l_)}, batch==one-batch through {k(f, o)}"
        )
        gap = decode_gap(eng.backend, ps[i], l_[:5], 16)  # a decode step, M = 1 vs 16
        print(f"   decode step: |d logsumexp|, |d top logit| at M = 1 vs 16: {gap:.5f}")
    del eng
