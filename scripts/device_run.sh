#!/bin/bash
# The one device call: install, GPU tests, CLI on a real (sliced) model, minfer check, synthetic
# 8B-shape model timing, the f16 GEMMs (scripts/gemm_device.py; ncu on the picks at M = 2048,
# scripts/ncu_gemm.py), interleaved A/B bench in both
# regimes (sustained samples, the default, and single prefills, --min-ms 0); a short summary
# last. DESIGN.md "Device recipe".
# Usage on the device (carry .whl and .devdata/smollm2-slice.gguf):
#   bash scripts/device_run.sh [deadline_s]
# Make the slice here first: python3 scripts/slice_model.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
#   .devdata/smollm2-slice.gguf --max-mib 54     (11 of 30 layers; the full model is over 64 MiB)
DEADLINE=${1:-480}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
M="python3 -m minfer"; S=.devdata/smollm2-slice.gguf
MINFER_TEST_MODEL=$S step tests 200 python3 -m pytest -q -rfEs tests/gpu
step prefill_cpu 40 $M prefill -m $S --backend cpu --json
step prefill_cuda 40 $M prefill -m $S --backend cuda --json
step quantize 30 $M quantize $S /tmp/slice-q4km.gguf --type q4_K_M --quiet
step check 150 $M check -m /tmp/slice-q4km.gguf
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] && step ncu 60 "$NCU" --clock-control none --kernel-name regex:mmq --csv \
  --metrics smsp__inst_executed.sum,gpu__time_duration.sum python3 scripts/ncu_mmq.py
step mmq_timing 60 python3 scripts/mmq_device.py --quick
step sb_timing 90 python3 scripts/mmq_sb_device.py
step synth 80 bash -c "time $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s32.gguf"
step gemm 60 python3 scripts/gemm_device.py
[ -n "$NCU" ] && step ncu_gemm 60 "$NCU" --clock-control none --kernel-name regex:wgmma_f16 \
  --launch-skip 1 --launch-count 3 --csv --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 scripts/ncu_gemm.py 2048
AB=("MINFER_MMQ=0" "MINFER_MMQ=0 MINFER_F16_ROPE=0" "MINFER_MMQ=1 MINFER_MMQ_SB=1 MINFER_MMQ_Q6K_F16=1")
step bench 150 $M bench -m /tmp/s32.gguf --tokens 512,2048 --repeats 6 --ab "${AB[@]}"
step bench_burst 150 $M bench -m /tmp/s32.gguf --tokens 512,2048 --repeats 6 --min-ms 0 --no-breakdown --ab "${AB[@]}"
echo; echo "################ SUMMARY ################"
cat "$OUT/steps.txt"
echo "--- tests"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -2; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -8
for f in prefill_cpu prefill_cuda; do echo "--- $f"; python3 - "$OUT/$f.log" <<'PY'
import json, sys
txt = open(sys.argv[1]).read(); s = txt[txt.find("{"):]
try:
    d = json.loads(s[: s.rfind("}") + 1])
    print(d["backend"], "prefill", round(d["prefill_tok_s"]), "tok/s; greedy", d["greedy_ids"])
except Exception as e:
    print("no JSON:", txt[-600:])
PY
done
echo "--- check"; grep -vE "^\s*$" "$OUT/check.log" | tail -22
echo "--- ncu (warp instructions per GMAC)"; python3 scripts/ncu_mmq.py --table "$OUT/ncu.log" 2>&1 | tail -6
echo "--- mmq timing"; grep -E "FAIL|ALL OK|FAILURES" "$OUT/mmq_timing.log"; sed -n '/^timing/,$p' "$OUT/mmq_timing.log" | grep -v "narrow\|prepass"
echo "--- sb timing"; grep -E "MISMATCH|FAIL|ALL OK|FAILURES" "$OUT/sb_timing.log"; grep -E "^\| q[46]_K" "$OUT/sb_timing.log" | grep -v split
echo "--- synth"; grep -E "real|rror" "$OUT/synth.log"
echo "--- gemm (f16, TFLOP/s)"; grep -E "FAIL|ALL OK|FAILURES" "$OUT/gemm.log"; grep -E "^\| [0-9]" "$OUT/gemm.log"
echo "--- ncu gemm (M = 2048: gate|up, attn_output, ffn_down)"; python3 scripts/ncu_gemm.py --table "$OUT/ncu_gemm.log"
for f in bench bench_burst; do echo "--- $f"; grep -E "^\| |MMQ|f16:|rror|noise|repeat" "$OUT/$f.log" | grep -v "^| ---" | head -30; done
