"""A prompt of exactly N tokens under a model's own tokenizer (BOS included), on stdout:
python3 scripts/prompt_of.py N MODEL.gguf > p.txt (cold/warm prefill against bench at one length)."""

import random
import sys

from minfer.gguf.loader import load_model
from minfer.text.tokenizer import Tokenizer

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
