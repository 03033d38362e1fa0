#!/bin/bash
# wgmma MMQ development call: bitwise layouts, parity and interleaved timing of the wgmma
# q4_K kernel against the wide mma.sync kernel (scripts/mmq_wgmma_device.py, variants in
# $WG_VARIANTS as "name=-DOPT ..."), SASS opcode mix, ncu issue / stall metrics.
# Usage on the device (carry .whl): [WG_VARIANTS="a= b=-DMMQ_WG_BN=128"] bash scripts/device_wgmma.sh [deadline_s]
DEADLINE=${1:-420}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
cat > /tmp/sass.sh <<'X'
nvcc -cubin -arch=sm_90a -O3 -std=c++17 -I kernels -o /tmp/wg.cubin kernels/mmq_wgmma_q4k.cu &&
  cuobjdump -sass -fun mmq_wgmma_q4k /tmp/wg.cubin | tee $OUT/wg.sass | python3 scripts/sass_hist.py
X
export OUT; step sass 60 bash /tmp/sass.sh
step wgmma 240 python3 scripts/mmq_wgmma_device.py $WG_VARIANTS
[ -n "$NCU" ] && step ncu 90 "$NCU" --clock-control none --kernel-name regex:wgmma_q4k \
  --launch-skip 2 --launch-count 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active" python3 scripts/ncu_wgmma.py
echo; echo "################ SUMMARY ################"; cat "$OUT/steps.txt"
echo "--- sass"; tail -25 "$OUT/sass.log"
echo "--- ncu"; grep -E "stalled|inst_executed|duration|pct" "$OUT/ncu.log" 2>/dev/null | awk '$NF+0 > 0.05 || /inst|duration|pct/' | sed 's/  */ /g' | head -30
echo "--- wgmma"; grep -vE "^$" "$OUT/wgmma.log" | tail -60
