"""Probe: a prompt's greedy ids alone (engine.run), in a one-prompt batch, and in the 11-prompt
batch of `minfer check`, per GEMM path; and the lone run's logits at a decode step against a
batched forward of the same tokens at M = 1, 16. Usage: probe_decode.py MODEL PATH..."""
import sys

import numpy as np

from minfer import engine
from minfer.batch.api import Engine
from minfer.commands.check import batch_prompts
from minfer.cuda.plan.config import GemmChoice
from minfer.gguf.loader import load_model

model = load_model(sys.argv[1])
ps = batch_prompts(model, 64)
for path in sys.argv[2:]:
    eng = Engine(model, "cuda", GemmChoice(path), 64)
    full = {}
    eng.run(enumerate(ps), [len(p) for p in ps], 32, lambda r: full.__setitem__(r.key, r))
    for i in (3, 9):
        one = {}
        eng.run(enumerate([ps[i]]), [len(ps[i])], 32, lambda r: one.__setitem__(r.key, r))
        lone = engine.run(eng.backend, ps[i], 32, 64, warmup=False)
        f, o, l_ = full[i].greedy, one[0].greedy, lone.greedy_ids
        k = lambda a, b: next((j for j in range(32) if a[j] != b[j]), 32)  # noqa: E731
        print(f"{path} prompt {i}: batch==lone through {k(f, l_)}, one-batch==lone through "
              f"{k(o, l_)}, batch==one-batch through {k(f, o)}")
        # one decode token at M = 1 (forward) vs in a packed call padded to 16 rows
        seq = np.concatenate([ps[i], np.array(l_[:5], np.int32)])
        be = eng.backend
        be.reset()
        be.forward(seq[:-1], 0)
        a = be.forward(seq[-1:], len(seq) - 1)
        be.reset()
        be.forward(seq[:-1], 0)
        tok = np.array([[len(seq) - 1, 0]] * 16, np.int32)
        st = be.packed(np.repeat(seq[-1:], 16), tok, np.array([0]), np.array([-1]))
        m = a.max()
        lse = m + np.log(np.exp(a - m).sum())
        print(f"   decode token: M=1 argmax {a.argmax()} lse {lse:.5f} | packed M=16 argmax "
              f"{int(st[0, 0])} lse {st[0, 3]:.5f}")
    del eng
