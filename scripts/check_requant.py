"""Requantize the default model with `minfer quantize` to every golden type and compare each
tensor's bytes with llama.cpp's (tests/golden/llamacpp-requant-tensors.json).

    python scripts/check_requant.py [--types q4_K_M,q6_K,q8_0,f16] [--threads N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
KINDS = {"q4_K_M": "smollm2-135m-q4_k_m", "q6_K": "smollm2-135m-q6_k",
         "q8_0": "smollm2-135m-q8_0", "f16": "smollm2-135m-f16"}


def main() -> int:
    from minfer.fetch import default_model_path
    from minfer.quants.requant import quantize_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(KINDS))
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    golden = json.loads((REPO / "tests/golden/llamacpp-requant-tensors.json").read_text())
    src = default_model_path(fetch=True)
    ok_all = True
    with tempfile.TemporaryDirectory() as d:
        for ft in a.types.split(","):
            out = Path(d) / f"{ft}.gguf"
            st = quantize_model(src, out, ft, threads=a.threads, progress=False)
            want = golden[KINDS[ft]]
            r = gguf.GGUFReader(str(out))
            same, diff = 0, []
            for t in r.tensors:
                h = hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()
                e = want.get(t.name)
                if e and e["type"] == t.tensor_type.name and e["sha256"] == h:
                    same += 1
                else:
                    diff.append(t.name)
            ok = same == len(want) == len(r.tensors)
            ok_all &= ok
            print(f"{ft:7s} {same}/{len(want)} tensors identical, {out.stat().st_size:,} bytes, "
                  f"{st.n_weights / 1e6:.1f} M weights in {st.seconds:.1f} s "
                  f"({st.weights_per_s / 1e6:.1f} M/s){'' if ok else '  DIFF: ' + ', '.join(diff[:5])}")
            out.unlink()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
