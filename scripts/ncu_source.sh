#!/bin/bash
# ncu source-level warp-state sampling of one kernel: SASS lines with their stall samples, as
# CSV in $OUT/src.csv (analyse off the device). Usage (after device_lib.sh):
#   bash scripts/ncu_source.sh KERNEL_REGEX python3 SCRIPT...
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
k=$1; shift
"$NCU" --clock-control none --set none --section SourceCounters --section WarpStateStats \
  --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 -f -o /tmp/src "$@" > "$OUT/src_run.log" 2>&1
"$NCU" --import /tmp/src.ncu-rep --page source --print-source sass --csv > "$OUT/src.csv" 2>> "$OUT/src_run.log"
wc -l "$OUT/src.csv"
