#!/bin/bash
# One device call for MMQ end to end (issue 5 items 3, 4): models made there, `minfer check` on
# a synthetic 2-layer Llama-3-8B-shape Q4_K_M model, the 6-layer SmolLM2 slice (Q4_1: no MMQ
# weights) and its Q4_K_M requant (MMQ on ffn_down), the GPU tests, then the A/B bench on a
# synthetic 8-layer 8B-shape model. Every step has a cap inside one overall deadline; logs go to
# $OUT; a short summary prints last.
# Usage (device, carry .whl and .devdata): bash scripts/device_mmq_e2e.sh [deadline_s]
DEADLINE=${1:-560}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
M="python3 -m minfer"
step synth2 60 $M synth --preset llama3-8b --layers 2 --type q4_K_M --tokenizer-from none --quiet -o /tmp/s.gguf
step synth8 90 $M synth --preset llama3-8b --layers 8 --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8.gguf
step quant 60 $M quantize .devdata/smollm2-6l.gguf /tmp/smol6_q4km.gguf --type q4_K_M --quiet
step check_s8b 220 $M check -m /tmp/s.gguf
step prefill_mmq 40 $M prefill -m /tmp/s.gguf --backend cuda --mmq --mmq-kd 8 --greedy 8 -p "The capital of France is"
step bench 150 $M bench -m /tmp/s8.gguf --tokens 512 --ab "MINFER_MMQ=0" "MINFER_MMQ=1 MINFER_MMQ_RAW_KD=4" "MINFER_MMQ=1 MINFER_MMQ_RAW_KD=8"
MINFER_TEST_MODEL=/tmp/smol6_q4km.gguf step tests_mmq 150 python3 -m pytest -q -rs -s tests/gpu/test_backend_mmq.py tests/gpu/test_check.py
step check_smol_q41 70 $M check -m .devdata/smollm2-6l.gguf
step check_smol_q4km 70 $M check -m /tmp/smol6_q4km.gguf
step tests_rest 200 python3 -m pytest -q -x --ignore=tests/gpu/test_backend_mmq.py --ignore=tests/gpu/test_check.py tests/gpu
echo; echo "################ SUMMARY ################"
cat $OUT/steps.txt
echo "--- prefill --mmq"; grep -E "^(backend|gemm|prefill|greedy)" $OUT/prefill_mmq.log
for f in check_s8b check_smol_q41 check_smol_q4km; do
  echo "--- $f"; grep -E "^MMQ|^f16 |^mmq-|FAIL|tokenizer|\| (f16|mmq-[a-z0-9-]+) \| [0-9]+/|^check:|rror" $OUT/$f.log | head -20
done
for f in check_s8b check_smol_q4km; do  # parity rows start "| q4_K " / "| q6_K "
  echo "--- $f parity: $(grep -c '^| q.*| ok |$' $OUT/$f.log) ok, $(grep -c '^| q.*FAIL |$' $OUT/$f.log) FAIL, max rel err $(grep '^| q' $OUT/$f.log | awk -F'|' '{print $5}' | sort -g | tail -1)"
done
echo "--- tests"; tail -3 $OUT/tests_mmq.log; tail -2 $OUT/tests_rest.log
echo "--- bench"; grep -E "^  MMQ|backend cuda|^\| |^per-op|rror" $OUT/bench.log | grep -v "^| ---" | head -60
