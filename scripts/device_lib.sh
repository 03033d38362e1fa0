# Sourced by the scripts/device_*.sh calls: installs the carried wheels, sets up $OUT and the
# deadline, and defines `step NAME CAP_S CMD...` (run with min(CAP, time left before the
# deadline), log to $OUT/NAME.log, one status line to $OUT/steps.txt).
# Usage: DEADLINE=<seconds>; source scripts/device_lib.sh
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MINFER_CACHE=/tmp/mcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=${DEADLINE:-480}
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( DEADLINE - ($(date +%s) - T0) ))
  (( left < cap )) && cap=$left
  if (( cap < 10 )); then echo "== $name: SKIPPED (deadline)" | tee -a "$OUT/steps.txt"; return; fi
  local t=$(date +%s)
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - t )) s (cap $cap)" | tee -a "$OUT/steps.txt"
}
