#!/usr/bin/env python3
"""Synthetic production-shape GGUF maker: a thin wrapper over `minfer synth` (minfer/synth.py).

    python3 scripts/make_synthetic_model.py --preset llama3-8b --type q4_K_M -o /tmp/l3-8b.gguf
    python3 scripts/make_synthetic_model.py --preset llama3-8b --layers 2 -o /tmp/l2.gguf
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a bare checkout too

from minfer.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["synth", *sys.argv[1:]])
