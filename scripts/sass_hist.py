"""Opcode histogram of one kernel's SASS (cuobjdump -sass output on stdin).

cuobjdump -sass -fun mmq_raw_wide_nt_kernel x.cubin | python3 scripts/sass_hist.py
Prints the total, the top opcodes and any local-memory (spill) instructions: a static view of
the instruction mix (which pipe the inner loop leans on) without a GPU run.
"""

import collections
import re
import sys

ops = collections.Counter()
for line in sys.stdin:
    m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
    if m:
        ops[m.group(2)] += 1
total = sum(ops.values())
print(f"{total} SASS instructions; local memory: LDL {ops['LDL']} STL {ops['STL']}")
print(", ".join(f"{k} {v}" for k, v in ops.most_common(24)))
