"""Summarise an ncu source-page CSV (scripts/ncu_source.sh): stall samples per opcode and the
hottest SASS lines. python3 scripts/src_stalls.py src.csv [top_n]"""
import csv
import sys
from collections import Counter, defaultdict

rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
cols = rows[hdr]
ix = {c: i for i, c in enumerate(cols)}
stall_cols = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
per_op = defaultdict(Counter)
lines = []
total = 0
for r in rows[hdr + 1:]:
    if len(r) < len(cols):
        continue
    src = r[ix["Source"]].strip()
    op = src.split()[0] if src else "?"
    if op.startswith("@"):
        op = src.split()[1]
    op = op.split(".")[0]
    n = int(float(r[ix["Warp Stall Sampling (All Samples)"]] or 0))
    total += n
    per_op[op]["samples"] += n
    for c in stall_cols:
        v = float(r[ix[c]] or 0)
        per_op[op][c] += v
    lines.append((n, r[ix["Address"]], src, {c: float(r[ix[c]] or 0) for c in stall_cols}))
print(f"total samples {total}")
print("op: samples% | top stalls")
for op, c in sorted(per_op.items(), key=lambda kv: -kv[1]["samples"])[:16]:
    top = sorted(((v, k) for k, v in c.items() if k != "samples"), reverse=True)[:3]
    print(f"{op:12} {100 * c['samples'] / total:5.1f}% | " +
          ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for v, k in top))
print("hottest lines:")
for n, a, src, st in sorted(lines, reverse=True)[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]:
    top = sorted(((v, k) for k, v in st.items()), reverse=True)[:2]
    print(f"{a} {100 * n / total:4.1f}% {src[:60]:60} " + ", ".join(f"{k[6:]} {v:.0f}" for v, k in top))
