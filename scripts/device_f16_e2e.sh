#!/bin/bash
# One device call for the f16 path end to end (issue 4 item 6): synthetic 32-layer Llama-3-8B-shape
# Q4_K_M made there; bench (CUDA graphs + fused q|k|v, gate|up, rope_qkv, 2-stage attention);
# torch f16 comparison; GPU tests; eager (MINFER_CUDA_GRAPHS=0) bench with the pp2048 per-op
# breakdown; the previous commit's backend ("before", files in .devdata/before) if time is left.
# Usage (device, carry .whl and .devdata): bash scripts/device_f16_e2e.sh [deadline_s] [quick]
# quick: skip the "before" bench, run scripts/profile_ops.py (every op label) instead.
DEADLINE=${1:-290}; source scripts/device_lib.sh
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
M="python3 -m minfer"
step synth 70 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s32.gguf
step bench 70 $M bench -m /tmp/s32.gguf --tokens 512,2048 --repeats 3
step torch 45 python3 scripts/torch_f16_prefill.py --tokens 512,2048 --repeats 5
MINFER_TEST_MODEL=.devdata/smollm2-6l.gguf step tests 100 python3 -m pytest -q -rs tests/gpu/test_fused_layers.py tests/gpu/test_attention.py tests/gpu/test_layers.py tests/gpu/test_backend_graphs.py tests/gpu/test_backend.py tests/gpu/test_backend_mmq.py
MINFER_CUDA_GRAPHS=0 step eager 40 $M bench -m /tmp/s32.gguf --tokens 2048,512 --repeats 2
step profile 40 python3 scripts/profile_ops.py /tmp/s32.gguf --tokens 512,2048
[ "$2" = quick ] || {
rm -rf /tmp/before && mkdir /tmp/before && cp -r minfer kernels scripts pyproject.toml /tmp/before/ && cp -r .devdata/before/* /tmp/before/
(cd /tmp/before && PYTHONPATH=/tmp/site:/tmp/before step before 45 $M bench -m /tmp/s32.gguf --tokens 512,2048 --repeats 3)
}
echo; echo "################ SUMMARY ################"
cat $OUT/steps.txt
echo "--- tests"; grep -E "passed|failed|error" $OUT/tests.log | tail -3; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -8
for f in bench eager before; do echo "--- $f"; grep -E "^\| |^per-op|rror|graph" $OUT/$f.log | grep -v "^| ---" | head -24; done
echo "--- torch"; grep -E "^\||rror" $OUT/torch.log
echo "--- profile"; grep -E "^\||tokens|rror" $OUT/profile.log | head -30
