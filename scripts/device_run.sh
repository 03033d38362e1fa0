#!/bin/bash
# The one device call: install the carried wheels, GPU tests, `minfer check` on a real (sliced)
# model, an 8B-shape synthetic model, `minfer bench` sustained and in single prefills; a short
# table last. Each step runs under min(its cap, time left before the deadline).
# Prepare here (the device starts bare and takes <= 64 MiB per call):
#   mkdir -p .whl && cp /work/shared/device-wheels/*.whl .whl/
#   python3 scripts/slice_model.py models/SmolLM2-135M-Instruct.Q4_1.gguf .devdata/smollm2-slice.gguf --max-mib 54
# On the device (carry .whl and .devdata): bash scripts/device_run.sh [deadline_s]
#   AB="MINFER_MMQ=0;MINFER_MMQ=1" picks the bench configs (';'-separated --ab strings).
DEADLINE=${1:-540}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
M="python3 -m minfer"; S=${SLICE:-.devdata/smollm2-slice.gguf}
IFS=';' read -r -a AB <<< "${AB:-MINFER_MMQ=0;MINFER_MMQ=1}"
MINFER_TEST_MODEL=$S step tests 200 python3 -m pytest -q -rfEs tests/gpu
step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet
step check 120 $M check -m /tmp/slice-q4km.gguf
step synth 80 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
step bench 150 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --repeats 6 --no-breakdown --ab "${AB[@]}"
step bench_single 120 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --repeats 6 --min-ms 0 \
  --no-breakdown --ab "${AB[@]}"
echo; echo "################ SUMMARY ($(cat "$OUT/gpu.txt"))"
cat "$OUT/steps.txt"
echo "--- tests";  grep -E "passed|failed|error" "$OUT/tests.log" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -8
echo "--- check";  grep -E "FAIL|PASS|OK|exact|/32" "$OUT/check.log" | tail -16
for f in bench bench_single; do
  echo "--- $f (tok/s: median, spread)"
  grep -E "^\| |rror|noise" "$OUT/$f.log" | grep -v "^| ---" | head -16
done
