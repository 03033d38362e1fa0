#!/bin/bash
# One device call for the dequant family: GPU tests, memcheck, throughput table.
# run with: carry=[".whl"], command: bash scripts/device_dequant.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.mem --format=csv,noheader
python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_dequant.py \
    >"$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -25 "$OUT/pytest.log"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then
  timeout 180 "$CS" --tool memcheck --error-exitcode 9 python3 scripts/memcheck_dequant.py \
      >"$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -5 "$OUT/memcheck.log"
else
  echo "compute-sanitizer not found"
fi
python3 scripts/bench_dequant.py --grids 0,16 2>&1 | tee "$OUT/bench.txt"
