# q8_1 prepass call: old (the source in $OLD_SRC, default .devdata/tmp/old_quantize.cu) vs current entries under ncu, bitwise
# comparison, then the wgmma tests (bitwise layouts against the twins).
DEADLINE=${1:-300}; source scripts/device_lib.sh >/dev/null 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
OLD=${OLD_SRC:-.devdata/tmp/old_quantize.cu}
nvcc -cubin -arch=sm_90 -O3 -std=c++17 -I kernels -o /tmp/old_q.cubin $OLD || echo "old build failed"
step ncu 120 "$NCU" --clock-control none --kernel-name regex:quantize --metrics gpu__time_duration.sum python3 scripts/prepass_ncu.py /tmp/old_q.cubin
step pytest 150 python3 -m pytest -q -rfE tests/gpu/test_wgmma_device.py -k "bitwise or parity" tests/gpu/test_mmq.py
cat $OUT/steps.txt; tail -3 $OUT/pytest.log
grep -E "IDENTICAL|DIFFER" $OUT/ncu.log
python3 - $OUT/ncu.log <<'PY'
import re, sys
rows = []; name = None
for ln in open(sys.argv[1]):
    m = re.match(r'\s*(quantize_q8_1\w+)', ln)
    if m: name = m.group(1)
    m = re.search(r'gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)', ln)
    if m and name: rows.append((name, m.group(1), m.group(2)))
for r in rows: print(*r)
PY
