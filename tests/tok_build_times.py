"""Times of building a Gemma-size (262,144-token) SentencePiece tokenizer, cold (the merge ids
derived and written to MINFER_CACHE) and warm (read from it), printed, not asserted:

    PYTHONPATH=$PWD python3 tests/tok_build_times.py [runs]

Each run uses a fresh empty cache folder, in one process (the tokenizers module imported
before the first timing). The encodings of both builds are compared."""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from test_tokenizer_cache import TEXT, spm_meta  # noqa: E402

from minfer.text import tokenizer as T  # noqa: E402


def main(runs: int = 3) -> None:
    import tokenizers  # noqa: F401  (its import is no part of a build)

    meta = spm_meta(262144)
    for r in range(runs):
        with tempfile.TemporaryDirectory() as d:
            os.environ["MINFER_CACHE"] = d
            t0 = time.perf_counter()
            cold = T.Tokenizer(meta)
            t1 = time.perf_counter()
            warm = T.Tokenizer(meta)
            t2 = time.perf_counter()
            assert warm.encode(TEXT) == cold.encode(TEXT)
            print(
                f"run {r + 1}: cold {t1 - t0:.2f} s, warm (from the cache) {t2 - t1:.2f} s",
                flush=True,
            )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
