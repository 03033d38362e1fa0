# q6_K wgmma development call: checks + timing of variants ($WG_VARIANTS), ncu of the q4_K and
# q6_K kernels (issue, pipes, stalls, L2), and the GPU tests of the wgmma path and check.
DEADLINE=${1:-520}; source scripts/device_lib.sh >/dev/null 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
step wgmma 200 python3 scripts/mmq_wgmma_device.py --types q6_K $WG_VARIANTS
for v in $NCU_RUNS; do   # "q6_K:4096:14336:-DX=1" ...
  IFS=: read -r ty n k o <<< "$v"
  step "ncu_${ty}_${o}" 60 "$NCU" --clock-control none --kernel-name regex:mmq_wgmma --launch-skip 2 --launch-count 1 --metrics "$M" python3 scripts/ncu_wgmma.py $ty $n $k $o
done
export MINFER_TEST_MODEL=$PWD/.devdata/smollm2-slice.gguf
step pytest 200 python3 -m pytest -q -rfE tests/gpu/test_wgmma_device.py tests/gpu/test_check.py tests/gpu/test_backend_mmq.py
cat $OUT/steps.txt
echo "--- pytest"; tail -4 $OUT/pytest.log
for f in $OUT/ncu_*.log; do echo "--- $f"; grep -E "stalled|inst_executed|duration|pct" "$f" | awk '{print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'; done
echo "--- wgmma"; grep -v "^$" $OUT/wgmma.log | grep -v "q6_K split\|q6_K repack" | tail -40
