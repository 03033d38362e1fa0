#!/usr/bin/env python3
"""Slice a GGUF to its first N layers under a size cap, for the device (<= 64 MiB per call).

    python3 scripts/slice_model.py models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-sliced.gguf
    python3 scripts/slice_model.py IN OUT --layers 2          # exactly 2 layers (must fit the cap)
    python3 scripts/slice_model.py IN OUT --max-mib 40        # the most layers that fit 40 MiB

Keeps token_embd, output_norm, output (if present) and blk.0..N-1; metadata copied with its
types, block_count set to N (minfer/gguf/slice.py).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a bare checkout too

from minfer.errors import MinferError  # noqa: E402
from minfer.gguf.slice import slice_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="input GGUF")
    ap.add_argument("dst", help="output GGUF (written atomically)")
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="layers to keep (default: as many as fit --max-mib)",
    )
    ap.add_argument(
        "--max-mib", type=float, default=60.0, help="size cap of the output in MiB (default 60)"
    )
    a = ap.parse_args(argv)
    try:
        p = slice_model(a.src, a.dst, a.layers, a.max_mib, progress=sys.stderr.isatty())
    except MinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(
        f"{a.dst}: {p.layers} of {p.total_layers} layers, {p.bytes / 2**20:.2f} MiB "
        f"(cap {a.max_mib:g} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
