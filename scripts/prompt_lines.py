"""Write N plain-text prompts, one a line (3 to 60 pseudo-random words each, seeded), for
`minfer prefill --prompts FILE --prompts-format lines`. Usage: prompt_lines.py N OUT"""

import random
import sys

n, out = int(sys.argv[1]), sys.argv[2]
r = random.Random(0)
words = [
    f"{a}{b}"
    for a in ("ka", "lo", "mi", "ne", "su", "ta", "ro", "vi")
    for b in ("", "n", "ri", "to", "lem", "sa", "dor", "quin", "pe", "mo")
]
with open(out, "w") as f:
    for _ in range(n):
        f.write(" ".join(r.choice(words) for _ in range(r.randint(3, 60))) + "\n")
