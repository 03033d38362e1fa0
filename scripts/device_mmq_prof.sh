#!/bin/bash
# MMQ kernel development call: [GPU tests], SASS opcode mix of the wide kernels, parity + timing
# of every MMQ variant (scripts/mmq_device.py), interleaved A/B of wide build variants
# (scripts/mmq_variants.py, specs in $MMQ_VARIANTS), ncu stall reasons of the wide q4_K kernel.
# Usage on the device (carry .whl): [MMQ_VARIANTS="a=4: b=8:-DX=1"] bash scripts/device_mmq_prof.sh
#   [deadline_s] [--tests]
DEADLINE=${1:-420}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ "$2" = "--tests" ] && step tests 170 python3 -m pytest -q -rs -x tests/gpu
cat > /tmp/sass.sh <<'X'
for v in "mmq_q4k mmq_raw_wide_nt_kernel" "mmq_q6k mmq_q6k_raw_wide_nt_kernel"; do
  set -- $v
  nvcc -cubin -arch=sm_90 -O3 -DMMQ_KD=4 -I kernels -o /tmp/$1.cubin kernels/$1.cu &&
    echo "$2:" && cuobjdump -sass -fun $2 /tmp/$1.cubin | tee $OUT/$1.sass | python3 scripts/sass_hist.py
done
X
export OUT; step sass 60 bash /tmp/sass.sh
step timing 150 python3 scripts/mmq_device.py --quick
[ -n "$MMQ_VARIANTS" ] && step variants 150 python3 scripts/mmq_variants.py $MMQ_VARIANTS
[ -n "$NCU" ] && step ncu_stall 90 "$NCU" --clock-control none --kernel-name regex:wide \
  --launch-skip 1 --launch-count 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active" python3 scripts/ncu_mmq.py
echo; echo "################ SUMMARY ################"; cat "$OUT/steps.txt"
echo "--- tests"; grep -E "passed|failed|error" "$OUT/tests.log" 2>/dev/null | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" 2>/dev/null | head -8
echo "--- sass"; cat "$OUT/sass.log"
echo "--- ncu"; grep -E "stalled|inst_executed|duration|pct" "$OUT/ncu_stall.log" | awk '$NF+0 > 0.05 || /inst|duration|pct/' | sed 's/  */ /g' | head -40
echo "--- timing"; grep -E "FAIL|ALL OK|FAILURES" "$OUT/timing.log"; sed -n '/^timing/,$p' "$OUT/timing.log"
echo "--- variants"; tail -20 "$OUT/variants.log" 2>/dev/null
