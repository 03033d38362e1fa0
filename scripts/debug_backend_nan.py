"""Debug: where do NaNs appear in CudaBackend on a tiny synthetic model (device only)."""
import sys

import numpy as np

from minfer.cuda.backend import CudaBackend
from minfer.loader import load_model
from minfer.reference.forward import ReferenceBackend

paths = sys.argv[1:]
if not paths:
    from minfer.synth import SynthOptions, make_synthetic_model
    for q in ("q4_K_M", "q8_0", "f16"):
        p = f"/tmp/tiny-{q}.gguf"
        make_synthetic_model(p, SynthOptions(preset="tiny", qtype=q, seed=3, vocab=1024,
                                             tokenizer_from=None), progress=False)
        paths.append(p)
for p in paths:
    m = load_model(p)
    print(m.describe(), {n: t.type_name for n, t in list(m.tensors.items())[:12]})
    prompt = np.random.default_rng(0).integers(0, m.config.vocab_size, 37).astype(np.int32)
    cpu = ReferenceBackend(m, max_tokens=128).forward(prompt, 0)
    for ub in (64, 16):
        b = CudaBackend(m, max_tokens=128, ubatch=ub)
        for n, w in b.w.items():
            a = w.get()
            if not np.all(np.isfinite(a)):
                print("  non-finite weight", n, a.dtype, a.shape)
        out = b.forward(prompt, 0)
        bad = {k: int((~np.isfinite(getattr(b, k).get().astype(np.float32))).sum())
               for k in ("x", "h16", "q16", "a16", "f16", "g32")}
        rel = np.linalg.norm(out - cpu) / np.linalg.norm(cpu)
        print(f"  ubatch {ub}: logits finite {np.isfinite(out).all()}, rel {rel:.2e}, "
              f"argmax {np.argmax(out)} vs {np.argmax(cpu)}, nonfinite {bad}")
