#!/usr/bin/env bash
# One device call for gemm_f16: install wheels, GPU tests, SASS summary, benchmark table.
# Usage on the device (carry .whl and .cubin_cache):  bash scripts/device_gemm.sh [bench args]
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export MINFER_CACHE=$PWD/.cubin_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_gemm_f16.py tests/test_gemm_f16_cpu.py \
  >"$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error|error" "$OUT/pytest.log" | tail -12
cub=$(ls "$MINFER_CACHE"/cubin/gemm_f16*.cubin)
if command -v cuobjdump >/dev/null; then
  for c in $cub; do cuobjdump -sass "$c"; done >"$OUT/sass.txt" 2>&1
  python3 - "$OUT/sass.txt" <<'PY'
import re, sys, collections
fn=None; cnt=collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m=re.search(r"Function : (\S+)", line)
    if m: fn=m.group(1); continue
    m=re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
    if fn and m: cnt[fn][m.group(1)]+=1
for f in sorted(cnt):
    c=cnt[f]; print("sass", f.replace("gemm_f16_nt_","").replace("wgmma_f16_nt_","WG"), {k:c[k] for k in ("HGMMA","HMMA","LDSM","LDGSTS","BAR","LDL","STL","LDG") if c[k]})
PY
fi
python3 scripts/bench_gemm.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
