"""A prompt of exactly N tokens under a model's own tokenizer (BOS included), on stdout:
python3 scripts/prompt_of.py N MODEL.gguf > p.txt (cold/warm prefill against bench at one length).

python3 scripts/prompt_of.py --lines N OUT: N plain-text prompts, one a line (3 to 60
pseudo-random words each, seeded), for `minfer prefill --prompts OUT --prompts-format lines`."""

import random
import sys

if sys.argv[1] == "--lines":
    n, out, r = int(sys.argv[2]), sys.argv[3], random.Random(0)
    syl = [
        f"{a}{b}"
        for a in ("ka", "lo", "mi", "ne", "su", "ta", "ro", "vi")
        for b in ("", "n", "ri", "to", "lem", "sa", "dor", "quin", "pe", "mo")
    ]
    with open(out, "w") as f:
        for _ in range(n):
            f.write(" ".join(r.choice(syl) for _ in range(r.randint(3, 60))) + "\n")
    raise SystemExit(0)

from minfer.gguf.loader import load_model  # noqa: E402  (the --lines mode needs no minfer)
from minfer.text.tokenizer import Tokenizer  # noqa: E402

n, r = int(sys.argv[1]), random.Random(0)
tok = Tokenizer.from_metadata(load_model(sys.argv[2]).metadata)


def count(w: list[str]) -> int:
    return len(tok.encode(" ".join(w)))


vocab, words = "the of and model prefill token kernel".split(), []
while count(words) < n - 64:  # in blocks of words, then a word at a time, then letters
    words += [r.choice(vocab) for _ in range(16)]
while count(words) > n:
    words.pop()
for c in "xqzjkv" * 200:
    if count(words) == n or count(words + [c]) > n:
        continue
    words.append(c)
print(" ".join(words), end="")
print(f"prompt of {count(words)} tokens (wanted {n})", file=sys.stderr)
