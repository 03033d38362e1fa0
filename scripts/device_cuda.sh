#!/bin/bash
# One device call: GPU tests (layers, attention, backend greedy gate), then the f16-path bench
# on a synthetic Llama-3-8B-shape Q4_K_M model made here, and torch's f16 forward for comparison.
# Usage (device): bash scripts/device_cuda.sh [tests|bench|all]
set -o pipefail
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MINFER_CACHE=/tmp/mcache
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
what=${1:-all}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
if [[ $what == tests || $what == all ]]; then
  timeout 120 python3 scripts/debug_backend_nan.py 2>&1 | tee $OUT/debug.log
  timeout 120 python3 scripts/debug_backend_nan.py .devdata/smollm2-6l.gguf 2>&1 | tee -a $OUT/debug.log
  MINFER_TEST_MODEL=$PWD/.devdata/smollm2-6l.gguf timeout 240 python3 -m pytest -q -s \
    ${GPU_TESTS:-tests/gpu/test_layers.py tests/gpu/test_attention.py tests/gpu/test_backend.py} 2>&1 \
    | tee $OUT/tests.log | tail -40
fi
if [[ $what == bench || $what == all ]]; then
  t0=$(date +%s)
  timeout 200 python3 -c "
from minfer.synth import SynthOptions, make_synthetic_model
make_synthetic_model('/tmp/l8b.gguf', SynthOptions(preset='llama3-8b', qtype='q4_K_M', tokenizer_from=None, workers=16), progress=False)
" || echo "synth failed"
  echo "synth: $(( $(date +%s) - t0 )) s"
  timeout 200 python3 -m minfer bench -m /tmp/l8b.gguf --tokens 512,2048 --repeats 3 2>&1 \
    | tee $OUT/bench.log
  timeout 120 python3 scripts/torch_f16_prefill.py --tokens 512,2048 2>&1 | tee $OUT/torch.log
fi
