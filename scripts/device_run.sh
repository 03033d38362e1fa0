#!/bin/bash
# The device calls, one mode each (a call is capped at 10 minutes); a short table last.
#   gates: pytest tests/gpu on a real (sliced) model, `minfer check` over the path table on its
#          Q4_K_M requant, and the wheel installed non-editable into a clean target, run from
#          another directory (its kernels from the package data).
#   big:   a 70B-shape `minfer synth` model (~40 GB): prefill at 2048 with `--gemm auto` choosing
#          by free memory (bench at 512 and 2048 with BENCH70=1), then `--gemm blk`; peak memory.
#          VOCAB70=128256: Llama-3's vocab; HOLD_GB=N: a co-tenant process holds N GiB of the
#          GPU first (with 12 the f16 plan no longer fits and auto runs blk).
#   blk:   the block int8 path: its device tests, isolated GEMMs at 512, 2,048 and 16,384
#          tokens (gemm_blk_bench.py), an 8B-shape bench against f16 (AB="f16 blk ..." for more
#          paths), single and sustained, and blk's per-op breakdown at pp2048.
#   split: blk-split (`--gemm blk-split`, opt-in; never run on a GPU before): its GPU tests
#          (kernels vs twins, the route vs split_linear_ref, greedy-32 and parity), a llama3.1-8b
#          Q4_K_M synth `bench --ab blk blk-split --tokens 512,2048` (the GPU calibration first),
#          and with the slice carried its perplexity / KLD on blk and blk-split against f16's
#          logits, then `minfer check --gemm blk-split` on its Q4_K_M requant.
#   final: the whole GPU suite, the blk GEMMs, bench (single and sustained), the slice's
#          perplexity, `minfer check` on its Q4_K_M requant, blk's per-op breakdown at pp2048.
#   closing: Ray's identity with the actors' KV planned for the whole job, then pooled (embeddings
#          and rerank with the scheduler's overlap) and the embeddings without it (NOOVERLAP=1);
#          CLOSING_MOE=1 the blk experts' forward test.
#   llamacpp: the peer row: llama.cpp's CUDA llama-bench (-p 512,2048 -n 0 -r 3 -fa 1, all layers
#          on the GPU) and `minfer bench --gemm blk` on the same synth files, llama3.1-8b and
#          qwen3-30b-a3b (MOE_LAYERS: 48); carry .whl and .llamacuda (llama-bench built on the
#          host for sm_90, static ggml, against cuBLAS 13 from the nvidia-cublas wheel; xz).
#   owed:  the last stop's unmeasured rows, most wanted first, in one call (carry .whl,
#          .cubin_cache and .devdata): the GPU tests of its changes, the MoE blk tests with
#          --runxfail, lab/moe_persist.py (the persistent expert GEMMs' A/B), olmo2 / qwen3-8b
#          beside their llama twins (house), `minfer check`
#   combo: the serving table (SERVE_CFGS: the engine process "on", "thread", prefix cache "off";
#          SERVE_TESTS=1 the GPU serving tests first), the new families' blk checks, the MoE
#          kernels' tests, each capped by what the deadline leaves.
#   house: the new families' blk checks (MOE_TESTS=1: the MoE kernels' tests first), their speed
#          beside llama's and their llama twins' (`synth --as-llama`; FAMILY_PRESETS, one bench
#          process), bench A B A at pp512
#          against .old/ where carried, `minfer check` on the slice's Q4_K_M requant where
#          .devdata is carried, each capped by what the deadline leaves. HOUSE_PYTEST="FILES":
#          those GPU tests first; HOUSE_BREAKDOWN="PRESETS": blk's per-op breakdown at 2,048 of
#          each and of its twin.
#   refactor: a restructure checked against the tree in .old/ (git archive OLD minfer kernels):
#          every path's logits bitwise on the slice's Q4_K_M and a 2-layer 8B shape, `minfer
#          check`, and bench A B A (new, old, new) at pp512 / pp2048.
#   families: the GPU suite (the RoPE-scaled families against llama.cpp's logits included), and
#          `bench --ab f16 blk` on the llama3-8b, llama3.1-8b (rope_freqs) and qwen3-8b shapes, one
#          after the other (FAMILY_PRESETS to choose: every preset runs on the GPU, gemma2-9b /
#          gemma3-12b at head_dim 256 and phi3-mini at 96 included; FAMILY_TESTS=0 skips the
#          suite, BREAKDOWN=1 adds blk's per-op breakdown at 2048 per preset).
#   profile: ncu on the blk gate|up GEMM (per-token operand, as the forward), attn_output (per
#          block) and f16's gate|up at M = 2048 (PROF_M=16384: a long prompt's, where blk's
#          GEMMs ran 20-25 % slower); the installed wheel's check (as gates).
#   packed: the packed layout's GPU tests (attention, rope, backend, graphs, blk) and the first
#          batch figures (256 x 128 on f16 and blk, a shared prefix, decode of 64), one call.
#   many:  every many-prompts row of docs/perf.md in one call (8B-shape synth model): 256 x 128 and
#          1024 x 32 on f16 and blk, the log-uniform file, a shared prefix on / off, decode of
#          64, a 10,000-prompt file end to end (peak host and GPU memory).
#   attn:  the prefill attention alone (scripts/attn_one.py: 2,048 .. 32,768 tokens, the wgmma
#          kernel persistent or a block per item, K/V by TMA or cp.async, interleaved; attention.cu
#          at 8,192; the wgmma kernel's timing builds without its loads / its ex2) and ncu on the
#          wgmma kernel at 8,192.
#   serve: the top log-probs' and the server's GPU tests, then `minfer serve` on an 8B-shape synth
#          model under `minfer bench-serve`: 256 clients of 128-token scoring requests, lm-eval's
#          shape (512-token context, 4 endings of 16) with the prefix cache on and off, one
#          512-token request on an idle server; `bench --batch 256 --tokens 128` and a single
#          512-token prefill as the baselines, in the same call. SERVE_S: seconds per load.
#   pooled: issue 52's figures on a qwen3-8b-shape Q4_K_M synth model: `bench --batch 4096
#          --tokens 256` (the baseline), then minfer.tools.bench.pooling: embeddings of the same
#          4,096 x 256 prompts against their batch prefill in the same process, and reranking
#          1 query x 1,000 documents of 200 tokens after a 64-token query, its prefix shared or
#          not (documents/s); the pooled jobs' GPU tests first.
#   moe:   issue 54's CUDA mixture of experts: tests/gpu/test_moe_device.py and the MoE families
#          against llama.cpp (MOE_TESTS=0 skips both), then a qwen3-30b-a3b-shape Q4_K_M synth
#          model (MOE_LAYERS=48: ~58 GB of f16 experts on the GPU) under `bench --tokens
#          512,2048` with its per-op breakdown (MOE_WMMA=1: the simple grouped GEMM at 2048 too;
#          MOE_BENCH=0 skips the model and the bench).
#   moeblk: issue 54's blk int8 experts: tests/gpu/test_moe_blk_device.py and test_moe_device.py
#          (MOE_TESTS=0 skips them; MOE_FAMILIES=1 adds the MoE families' `minfer check`, blk
#          experts included), then a qwen3-30b-a3b-shape Q4_K_M synth model of MOE_LAYERS (16:
#          its f16 experts ~19 GB, so f16 fits beside blk) under `bench --ab f16 blk --tokens
#          512,2048` (blk alone past 16 layers: f16 beside it does not fit) and blk's per-op
#          breakdown at 2048 (MOE_BENCH=0 skips them). One call: deadline 590.
#   ray:   issue 55: tests/gpu/test_engine_threads.py (an Engine across threads, as an actor's),
#          then a 10,000-prompt file through `--ray auto` (one GPU actor) between two
#          single-process runs of it, tok/s and the records compared byte for byte.
#   perf:  an 8B-shape `minfer synth` model; `minfer prefill` at 512 and 3001 prompt tokens on a
#          cold then a warm kernel cache against `minfer bench --min-ms 0` at the same lengths;
#          `minfer bench` over the paths (single prefills and sustained); with .old/ carried
#          (minfer/ and kernels/ of an earlier commit) the same bench on that tree for before/after.
# Prepare here (the device starts bare and takes <= 64 MiB per call):
#   mkdir -p .whl && cp ../shared/device-wheels/*.whl .whl/
#   (serve / pooled: the server's wheels too, not on the device image; cp312, no deps:)
#   (cd .whl && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
#     --implementation cp --platform manylinux2014_x86_64 fastapi==0.165.0 starlette==1.10.0
#     uvicorn==0.55.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection
#     opentelemetry-api==1.45.3 orjson==3.13.0)
#   (ray: a ray wheel without ray/jars, ray/dashboard/client, ray/rllib (zip them out, RECORD's
#     lines too: 42 MB) and jsonschema, jsonschema-specifications, referencing, rpds-py in .raywhl/)
#   python3 scripts/slice_model.py models/SmolLM2-135M-Instruct.Q4_1.gguf .devdata/smollm2-slice.gguf --max-mib 54
#   python3 -m pip wheel . --no-deps -w .devdata/minfer-wheel          (gates: the install check)
#   mkdir -p .old && git archive OLD minfer kernels pyproject.toml | tar -x -C .old  (perf, refactor, stop)
#   (llamacpp: llama-bench for sm_90, ~30 min on 2 cores: pip download nvidia-cublas (cu13), unzip
#     it to /tmp/cublas, symlink lib/libcublas{,Lt}.so, then in ../shared/llamacpp's tree: cmake
#     -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
#     -DGGML_CUDA_NO_VMM=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
#     -DCMAKE_LIBRARY_PATH=/tmp/cublas/nvidia/cu13/lib -DCMAKE_{CUDA,CXX}_FLAGS=-I/tmp/cublas/nvidia/cu13/include;
#     ninja llama-bench; strip it; xz -9 -c > .llamacuda/llama-bench.xz: 41 MB)
# On the device (carry .whl, .devdata[, .old]): bash scripts/device_run.sh gates|perf|big [deadline_s]
MODE=${1:-gates}; DEADLINE=${2:-560}

# The carried wheels, $OUT, the deadline, and `step NAME CAP_S CMD...` (run with min(CAP, time
# left before the deadline), log to $OUT/NAME.log, one status line to $OUT/steps.txt).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MINFER_CACHE=/tmp/mcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# cubins built on the host (carry .cubin_cache: `MINFER_CACHE=.cubin_cache scripts/prebuild.py`);
# their cache key holds nvcc's version, so a device with another nvcc rebuilds
[ -d .cubin_cache/cubin ] && mkdir -p $MINFER_CACHE/cubin && cp -n .cubin_cache/cubin/* $MINFER_CACHE/cubin/
# only 8 files come back from $OUT: at exit every log goes into logs.tgz (steps.txt stays)
trap '(cd "$OUT" && tar czf /tmp/logs-$MODE.tgz --exclude="logs-*.tgz" . && rm -f ./*.log && mv /tmp/logs-$MODE.tgz .)' EXIT
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
# peak_rss CMD...: its exit status, wall time and peak resident memory (the children's maximum
# RSS, getrusage) on stderr last; as `step NAME CAP python3 -c "$PEAK_RSS" CMD...`
PEAK_RSS='import resource, subprocess, sys, time
t0 = time.perf_counter(); rc = subprocess.call(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"peak_rss: rc={rc}, wall {time.perf_counter() - t0:.1f} s, peak host RSS {peak:.0f} MiB", file=sys.stderr)
sys.exit(rc)'
REPO=$PWD; M="python3 -m minfer"; S=${SLICE:-.devdata/smollm2-slice.gguf}
# the whole GPU suite in 4 processes (the image's pytest-xdist), a file per worker: 183 s on a
# cold kernel cache (H100, 16 cores) where one process needed over 500 s, mostly compiling
XDIST="-n 4 --dist loadfile"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

tests_summary() {   # tests_summary LOG...: each test log's count line, failures, first errors
  for f in "$@"; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "passed|failed" "$OUT/$f.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -16
    grep -E "^E  " "$OUT/$f.log" | head -12; done
}

installed_check() {   # the wheel installed non-editable into a clean target, run from /tmp
  rm -rf /tmp/x && python3 -m pip install -q --no-index --no-deps --target /tmp/x \
    .devdata/minfer-wheel/minfer-*.whl .whl/*.whl 2>/dev/null
  (cd /tmp && step installed 120 env PYTHONPATH=/tmp/x MINFER_CACHE=/tmp/cache_inst python3 -c \
    "import minfer.cuda.runtime.build as b; print('KERNEL_DIR', b.KERNEL_DIR); \
from minfer.cli import main; main(['prefill', '--backend', 'cuda', '-m', '$REPO/$S', '-n', '8'])")
}

if [ "$MODE" = gates ]; then
  MINFER_TEST_MODEL=$S step tests 340 python3 -m pytest -q -rfEs $XDIST tests/gpu
  step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
  step check 160 $M check -m /tmp/slice-q4km.gguf
  installed_check
  echo; echo "################ SUMMARY gates ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -12
  echo "--- check"; grep -E "FAIL|PASS|exact|/32|rel err|max" "$OUT/check.log" | tail -34
  echo "--- installed (cwd /tmp, PYTHONPATH=/tmp/x only)"; grep -vE "^\s*$" "$OUT/installed.log" | tail -9
  exit 0
fi

if [ "$MODE" = refactor ]; then   # a restructure's before / after (.old/: the earlier tree)
  step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --quiet --type q4_K_M --allow-requantize
  step synth2 60 $M synth --preset llama3-8b --layers 2 --type q4_K_M --vocab 8192 \
    --tokenizer-from none --quiet -o /tmp/l8b2.gguf
  for m in slice-q4km l8b2; do   # every path's logits, new tree then old tree, bitwise
    step new_$m 90 python3 scripts/logits_dump.py /tmp/$m.gguf /tmp/new_$m.npz
    (cd .old && step old_$m 90 env PYTHONPATH=/tmp/site:$REPO/.old python3 \
      $REPO/scripts/logits_dump.py /tmp/$m.gguf /tmp/old_$m.npz)
    python3 scripts/logits_dump.py --compare /tmp/old_$m.npz /tmp/new_$m.npz > "$OUT/cmp_$m.txt"
  done
  step check 120 $M check -m /tmp/slice-q4km.gguf
  step synth8b 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  for t in new old new2; do   # A B A: the trees one after the other, the noise from the repeat
    d=$REPO; [ $t = old ] && d=$REPO/.old
    (cd $d && step bench_$t 60 env PYTHONPATH=/tmp/site:$d python3 -m minfer bench -m /tmp/s8b.gguf \
      --tokens 512,2048 --min-ms 0 --repeats 3 --no-breakdown --ab f16 blk)
  done
  echo; echo "################ SUMMARY refactor ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for m in slice-q4km l8b2; do echo "--- logits old vs new: $m"; cat "$OUT/cmp_$m.txt"; done
  echo "--- check"; grep -E "FAIL|PASS|/32 \|" "$OUT/check.log" | tail -12
  for t in new old new2; do echo "--- bench $t"; grep -E "^\| [a-z]" "$OUT/bench_$t.log"; done
  exit 0
fi

if [ "$MODE" = packed ]; then   # one call for the packed layout: its GPU tests, then the first figures
  MINFER_TEST_MODEL=$S step tests 200 python3 -m pytest -q -s -rfEs tests/gpu/test_packed.py \
    tests/gpu/test_attention.py tests/gpu/test_fused_layers.py tests/gpu/test_f16_rope.py \
    tests/gpu/test_backend.py tests/gpu/test_backend_graphs.py tests/gpu/test_blk_device.py
  step synth 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  B="$M bench -m /tmp/s8b.gguf --no-breakdown"
  step b256x128 100 $B --batch 256 --tokens 128 --repeats 2 --ab f16 blk
  step bprefix 70 $B --batch 256 --tokens 64 --shared-prefix 1024 --repeats 1
  step bdecode 60 $B --batch 64 --tokens 128 -n 65 --repeats 1
  echo; echo "################ SUMMARY packed ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)|packed GPU vs CPU" "$OUT/tests.log" | head -16
  for f in b256x128 bprefix bdecode; do echo "--- $f"; grep -E "^\| |rror|prompts," \
    "$OUT/$f.log" | grep -v "| ---"; done
  exit 0
fi

if [ "$MODE" = packed2 ]; then   # the packed backend test, check's batch rows, the other targets
  MINFER_TEST_MODEL=$S step tests 60 python3 -m pytest -q -s -rfEs tests/gpu/test_packed.py
  step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
  step checkb 150 $M check -m /tmp/slice-q4km.gguf --identity-only
  [ -f /tmp/s8b.gguf ] || step synth 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  B="$M bench -m /tmp/s8b.gguf --no-breakdown"
  step b1024x32 60 $B --batch 1024 --tokens 32 --repeats 2 --ab f16 blk
  step blogu 100 $B --batch 2000 --log-uniform 16:2048 --repeats 1
  echo; echo "################ SUMMARY packed2 ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  grep -E "passed|failed|^FAILED|packed vs alone|packed GPU" "$OUT/tests.log" | head -8
  echo "--- check"; grep -E "FAIL|PASS|exact|/32|/11" "$OUT/checkb.log" | tail -24
  for f in b1024x32 blogu; do echo "--- $f"; grep -E "^\| |rror|prompts," \
    "$OUT/$f.log" | grep -v "| ---"; done
  exit 0
fi

if [ "$MODE" = many ]; then   # issue 34's rows, one call
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader -lms 250 > "$OUT/mem.log" &
  step synth 60 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  B="$M bench -m /tmp/s8b.gguf --no-breakdown"
  step b256x128 90 $B --batch 256 --tokens 128 --repeats 2 --ab f16 blk
  step b1024x32 70 $B --batch 1024 --tokens 32 --repeats 2 --ab f16 blk
  step blogu 90 $B --batch 2000 --log-uniform 16:2048 --repeats 1
  step bprefix 60 $B --batch 256 --tokens 64 --shared-prefix 1024 --repeats 1
  step bdecode 50 $B --batch 64 --tokens 128 -n 65 --repeats 2
  python3 scripts/prompt_of.py --lines 10000 /tmp/p10k.txt
  step file10k 100 python3 -c "$PEAK_RSS" $M prefill -m /tmp/s8b.gguf --prompts /tmp/p10k.txt \
    --prompts-format lines -n 8 -o /tmp/o10k.jsonl
  kill $(jobs -p) 2>/dev/null
  echo; echo "################ SUMMARY many ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for f in b256x128 b1024x32 blogu bprefix bdecode; do echo "--- $f"; grep -E "^\| |rror|prompts," \
    "$OUT/$f.log" | grep -v "| ---"; done
  echo "--- file10k"; grep -vE "^\s*$" "$OUT/file10k.log" | tail -9; wc -l /tmp/o10k.jsonl
  echo "peak GPU memory: $(cut -d, -f1 "$OUT/mem.log" | sort -n | tail -1) of $(head -1 "$OUT/mem.log" | cut -d, -f2)"
  exit 0
fi

if [ "$MODE" = stop ]; then   # one short call: the merged tree's GPU tests of what changed,
  # every path's logits against the tree in .old/ bitwise (LOGIT_PATHS), check, the MoE kernels
  [ "${STOP_TESTS:-1}" = 1 ] && MINFER_TEST_MODEL=$S step tests_serve 70 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_packed.py \
    tests/gpu/test_serve_device.py tests/gpu/test_serve_faults_device.py tests/gpu/test_paths_device.py \
    tests/gpu/test_overlap.py
  step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --quiet --type q4_K_M --allow-requantize
  [[ "${LOGIT_MODELS:-l8b2}" == *l8b2* ]] && step synth2 40 $M synth --preset llama3-8b --layers 2 \
    --type q4_K_M --vocab 8192 --tokenizer-from none --quiet -o /tmp/l8b2.gguf
  LP=${LOGIT_PATHS:-f16,blk,wide-kd4}
  for m in ${LOGIT_MODELS:-slice-q4km l8b2}; do
    step new_$m 60 python3 scripts/logits_dump.py /tmp/$m.gguf /tmp/new_$m.npz --paths $LP
    (cd .old && step old_$m 60 env PYTHONPATH=/tmp/site:$REPO/.old python3 \
      $REPO/scripts/logits_dump.py /tmp/$m.gguf /tmp/old_$m.npz --paths $LP)
    python3 scripts/logits_dump.py --compare /tmp/old_$m.npz /tmp/new_$m.npz > "$OUT/cmp_$m.txt"
  done
  if [ "${STOP_ABA:-0}" = 1 ]; then   # bench A B A: new, old, new (the noise from the repeat)
    step synth8b 40 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
    for t in new old new2; do
      d=$REPO; [ $t = old ] && d=$REPO/.old
      (cd $d && step bench_$t 30 env PYTHONPATH=/tmp/site:$d python3 -m minfer bench -m /tmp/s8b.gguf \
        --tokens ${ABA_TOKENS:-2048} --min-ms 0 --repeats 2 --no-breakdown)
    done
  fi
  [ "${STOP_CHECK:-1}" = 1 ] && step check 100 $M check -m /tmp/slice-q4km.gguf
  [ "${STOP_MOE:-1}" = 1 ] && step tests_moe 120 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_moe_device.py
  echo; echo "################ SUMMARY stop ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for f in tests_serve tests_moe; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "passed|failed" "$OUT/$f.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -10
    grep -E "^E  " "$OUT/$f.log" | head -6; done
  for m in ${LOGIT_MODELS:-slice-q4km l8b2}; do echo "--- logits old vs new: $m"; cat "$OUT/cmp_$m.txt"; done
  for t in new old new2; do [ -f "$OUT/bench_$t.log" ] && echo "--- bench $t" && grep -E "^\| [a-z]" "$OUT/bench_$t.log"; done
  [ -f "$OUT/check.log" ] && echo "--- check" && grep -E "FAIL|PASS|/32 \||rror" "$OUT/check.log" | tail -14
  exit 0
fi

if [ "$MODE" = serve ] || [ "$MODE" = serve_loads ]; then   # issue 49's table, one call
  [ -f /tmp/s8b.gguf ] || step synth 60 $M synth --preset llama3.1-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  step batch 70 $M bench -m /tmp/s8b.gguf --no-breakdown --batch 256 --tokens 128 --repeats 2
  step single 50 $M bench -m /tmp/s8b.gguf --no-breakdown --tokens 512 --min-ms 0 --repeats 3
  D=${SERVE_S:-15}; BS="$M bench-serve --url http://127.0.0.1:8080 --duration $D --json --workers ${SERVE_WORKERS:-8}"
  # a server per configuration (name, its flags, the loads it takes); each load's line gets
  # the server's CPU seconds over it (utime + stime from /proc: its event loop and engine
  # thread together) and the GPU's mean utilization (nvidia-smi, 100 ms samples)
  cpu_of() {  # a process's and its children's (the engine process's) utime + stime, in ticks
    local t=0; for p in $1 $(pgrep -P $1); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
  load() {  # load NAME ARGS...: bench-serve against the running server $SP
    local name=$1; shift
    local c0=$(cpu_of $SP)
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > /tmp/util.txt &
    local NP=$!
    step $name 70 $BS "$@"
    kill $NP; local c1=$(cpu_of $SP)
    echo "   $name: server cpu $(awk "BEGIN {printf \"%.1f\", ($c1 - $c0) / 100}") s, gpu util mean $(awk '{s+=$1} END {printf "%.0f", s/NR}' /tmp/util.txt) %" | tee -a "$OUT/steps.txt"
  }
  for cfg in ${SERVE_CFGS:-on off}; do
    case $cfg in off) flags=--no-prefix-cache ;; thread) flags="--prefix-cache --engine thread" ;;
      *) flags=--prefix-cache ;; esac
    $M serve -m /tmp/s8b.gguf -c 4096 --port 8080 $flags > "$OUT/serve_$cfg.log" 2>&1 &
    SP=$!
    for i in $(seq 150); do grep -q "on http" "$OUT/serve_$cfg.log" && break
      kill -0 $SP 2>/dev/null || break; sleep 1; done
    echo "== server $cfg ($flags) up after $i s" | tee -a "$OUT/steps.txt"
    case $cfg in
      on) load idle512_$cfg -c 1 --prompt-tokens 512 --no-echo --max-tokens 1 --requests 10
          if [ -n "$SERVE_PROF" ]; then  # py-spy (carried) on the server under 256 clients
            (sleep 5; /tmp/site/bin/py-spy record -p $SP -d 8 -r 250 --threads --subprocesses --nonblocking \
              -f raw -o "$OUT/prof_all.txt"; /tmp/site/bin/py-spy record -p $SP -d 6 -r 250 \
              --threads --gil --nonblocking -f raw -o "$OUT/prof_gil.txt") > "$OUT/pyspy.log" 2>&1 &
          fi
          load score128_$cfg -c 256 --prompt-tokens 128
          load lmeval_$cfg -c 256 --prompt-tokens 512 --endings 4 --ending-tokens 16 ;;
      thread) load score128_$cfg -c 256 --prompt-tokens 128
          load lmeval_$cfg -c 256 --prompt-tokens 512 --endings 4 --ending-tokens 16 ;;
      *)  load lmeval_$cfg -c 256 --prompt-tokens 512 --endings 4 --ending-tokens 16 ;;
    esac
    kill -TERM $SP; wait $SP; echo "== server $cfg exit $?" | tee -a "$OUT/steps.txt"
  done
  [ "$MODE" = serve ] && MINFER_TEST_MODEL=$S step tests 200 python3 -m pytest -q -rfEs $XDIST \
    tests/gpu/test_packed.py tests/gpu/test_serve_device.py tests/gpu/test_overlap.py ${SERVE_MORE_TESTS:-}
  exec > >(tee "$OUT/summary.txt")
  echo; echo "################ SUMMARY serve ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -12
  grep -E "^E  " "$OUT/tests.log" | head -20
  for f in batch single; do echo "--- $f"; grep -E "^\| |rror|prompts," "$OUT/$f.log" | grep -v "| ---"; done
  for f in "$OUT"/idle512_*.log "$OUT"/score128_*.log "$OUT"/lmeval_*.log; do
    echo "--- $(basename $f .log)"; tail -1 "$f" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ('requests','errors','prompt_tok_s','latency_p50_ms','latency_p99_ms','host_ms_per_request','forwards','tokens_per_forward','prefix_rows_copied','engine_ms_per_forward','client_cpu_max')})" 2>&1 | tail -1
  done
  grep -iE "error|Traceback" "$OUT"/serve_*.log | head -5
  exit 0
fi

if [ "$MODE" = pooled ]; then   # issue 52: embeddings / rerank against the batch prefill
  # (the sliced default model too when carried; with .raywhl it does not fit the 64 MiB)
  [ "${POOLED_TESTS:-1}" = 1 ] && MINFER_TEST_MODEL=$([ -f "$S" ] && echo "$S") step tests 150 python3 -m pytest -q -rfEs \
    tests/gpu/test_pooled.py tests/gpu/test_overlap.py
  step synth 60 $M synth --preset qwen3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/q8b.gguf
  [ "${POOLED_BATCH:-1}" = 1 ] && step batch 120 $M bench -m /tmp/q8b.gguf --no-breakdown --batch 4096 --tokens 256 --repeats 2
  step pooled 200 python3 -m minfer.tools.bench.pooling -m /tmp/q8b.gguf --batch 4096 \
    --tokens 256 --docs 1000 --doc-tokens 200 --query-tokens 64 --repeats 2
  echo; echo "################ SUMMARY pooled ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -12
  echo "--- batch"; grep -E "^\| |rror|prompts," "$OUT/batch.log" | grep -v "| ---"
  echo "--- pooled"; tail -4 "$OUT/pooled.log"
  exit 0
fi

if [ "$MODE" = ray ]; then   # issue 55: --ray (one GPU actor) against the single process, one file
  # carry .whl and .raywhl (a ray wheel without its Java jars, dashboard client and rllib, and
  # jsonschema's wheels: the device image has no ray), not .devdata: the tree must stay < 64 MiB
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .raywhl/*.whl || exit 1
  # (an Engine made on one thread, called on another: the actors' pattern, without Ray)
  step tests 60 python3 -m pytest -q -rfEs tests/gpu/test_engine_threads.py
  [ -f /tmp/s8b.gguf ] || step synth 60 $M synth --preset llama3.1-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  python3 scripts/prompt_of.py --lines 10000 /tmp/p10k.txt
  P10K="-m /tmp/s8b.gguf --prompts /tmp/p10k.txt --prompts-format lines -n 8"
  step single 150 $M prefill $P10K -o /tmp/o_single.jsonl
  step ray 240 $M prefill $P10K -o /tmp/o_ray.jsonl --ray auto
  [ "${RAY_TWICE:-1}" = 1 ] && step single2 150 $M prefill $P10K -o /tmp/o_single2.jsonl
  echo; echo "################ SUMMARY ray ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  tests_summary tests
  for f in single ray single2; do echo "--- $f"; grep -vE "^\s*$" "$OUT/$f.log" | tail -4; done
  for f in ray single2; do [ -f /tmp/o_$f.jsonl ] && cmp /tmp/o_single.jsonl /tmp/o_$f.jsonl && echo "$f: records identical"; done
  wc -l /tmp/o_*.jsonl
  exit 0
fi

if [ "$MODE" = attn ]; then   # the prefill attention alone, and ncu on the wgmma kernel
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  step time 90 python3 scripts/attn_one.py --tokens 2048,8192,16384,32768 --grid sm,items --loads tma,cp
  step timemma 40 python3 scripts/attn_one.py --tokens 8192 --impl mma
  for o in -DATT_WG_NOLOAD -DATT_WG_NOEXP -DATT_WG_NOLOAD,-DATT_WG_NOEXP; do   # timing builds
    step "time_${o//[^A-Z_]/}" 40 python3 scripts/attn_one.py --tokens 8192,16384 --opts=$o
  done
  step ncu 90 "$NCU" --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
    -k regex:attn_wg --launch-skip 2 --launch-count 1 python3 scripts/attn_one.py --tokens 8192 --launches 1
  echo; echo "################ SUMMARY attn ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  cat "$OUT/time.log" "$OUT/timemma.log" "$OUT"/time_*.log
  grep -E "Throughput|Duration|SM Frequency|Issue Slots|Pipe|highest|Registers Per|Spilling" "$OUT/ncu.log"
  exit 0
fi

if [ "$MODE" = families ]; then   # RoPE-scaled files: the GPU suite, llama.cpp's logits, speed
  [ "${FAMILY_TESTS:-1}" = 1 ] && MINFER_TEST_MODEL=$S step tests 300 python3 -m pytest -q -rfEs $XDIST tests/gpu
  for p in ${FAMILY_PRESETS:-llama3-8b llama3.1-8b qwen3-8b}; do
    step synth_$p 90 $M synth --preset $p --type q4_K_M --tokenizer-from none --quiet -o /tmp/$p.gguf
    step bench_$p 110 $M bench -m /tmp/$p.gguf --tokens 512,2048 --min-ms 0 --repeats 3 \
      --no-breakdown --ab f16 blk
    [ "${BREAKDOWN:-0}" = 1 ] && step brk_$p 40 $M bench -m /tmp/$p.gguf --tokens 2048 --min-ms 0 \
      --repeats 1 --gemm blk
    rm -f /tmp/$p.gguf
  done
  echo; echo "################ SUMMARY families ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)|^family|^cuda f16" "$OUT/tests.log" | head -16
  for p in ${FAMILY_PRESETS:-llama3-8b llama3.1-8b qwen3-8b}; do echo "--- bench $p"; grep -E "^\| |^model|rror" \
    "$OUT/bench_$p.log" | grep -v "| ---"; [ -f "$OUT/brk_$p.log" ] && grep -E \
    "^\| (gemm|attention|rest|all)" "$OUT/brk_$p.log"; done
  exit 0
fi

if [ "$MODE" = moe ]; then   # issue 54's CUDA MoE: its GPU tests, then a qwen3-30b-a3b-shape bench
  if [ "${MOE_TESTS:-1}" = 1 ]; then
    step tests 330 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_moe_device.py
    step families 200 python3 -m pytest -q -rfEs tests/gpu/test_families_device.py -k "qwen3moe or qwen2moe or mixtral"
  fi
  if [ "${MOE_BENCH:-1}" = 1 ]; then
    step synth_q30 240 $M synth --preset qwen3-30b-a3b --layers ${MOE_LAYERS:-48} --type q4_K_M \
      --tokenizer-from none --quiet -o /tmp/q30.gguf
    step bench_q30 200 $M bench -m /tmp/q30.gguf --tokens 512,2048 --min-ms 0 --repeats 3
    [ "${MOE_WMMA:-0}" = 1 ] && step bench_q30_wmma 150 env MINFER_MOE_GEMM=wmma $M bench \
      -m /tmp/q30.gguf --tokens 2048 --min-ms 0 --repeats 2 --no-breakdown
  fi
  echo; echo "################ SUMMARY moe ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for f in tests families; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "passed|failed" "$OUT/$f.log" | tail -1; grep -E "^(FAILED|ERROR)|^moe " "$OUT/$f.log" | head -16; done
  for f in bench_q30 bench_q30_wmma; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "^\| |^model|^gemm|rror" "$OUT/$f.log" | grep -v "| ---" | head -40; done
  exit 0
fi

if [ "$MODE" = moeblk ]; then   # issue 54's blk int8 experts: GPU tests, then f16 vs blk experts
  if [ "${MOE_TESTS:-1}" = 1 ]; then
    step tests 280 python3 -m pytest -q -rfEsxX $XDIST tests/gpu/test_moe_blk_device.py tests/gpu/test_moe_device.py
  fi
  [ "${MOE_FAMILIES:-0}" = 1 ] && step families 200 python3 -m pytest -q -rfEs \
    tests/gpu/test_families_device.py -k "qwen3moe or qwen2moe or mixtral"
  if [ "${MOE_BENCH:-1}" = 1 ]; then
    step synth_q30 120 $M synth --preset qwen3-30b-a3b --layers ${MOE_LAYERS:-16} --type q4_K_M \
      --tokenizer-from none --quiet -o /tmp/q30.gguf
    # (f16's 58 GB of experts at 48 layers do not fit an H100 beside blk's: blk alone there)
    AB="--ab f16 blk"; [ "${MOE_LAYERS:-16}" -gt 16 ] && AB="--gemm blk"
    step bench_q30_ab 200 $M bench -m /tmp/q30.gguf --tokens 512,2048 --min-ms 0 --repeats 3 $AB
    step brk_q30 60 $M bench -m /tmp/q30.gguf --tokens 2048 --min-ms 0 --repeats 1 --gemm blk
  fi
  echo; echo "################ SUMMARY moeblk ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for f in tests families; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "passed|failed" "$OUT/$f.log" | tail -1; grep -E "^(FAILED|ERROR)|^moe " "$OUT/$f.log" | head -24; done
  for f in synth_q30 bench_q30_ab brk_q30; do [ -f "$OUT/$f.log" ] || continue; echo "--- $f"
    grep -E "^\| |^model|^gemm|^memory|experts|rror" "$OUT/$f.log" | grep -v "| ---" | head -50; done
  exit 0
fi

if [ "$MODE" = closing ]; then   # issue 55's Ray identity (actors planned for the whole job),
  # issue 52's pooled figures with the overlap, and its A/B without (carry .whl, .raywhl)
  step ray 150 env RAY_TWICE=0 OUT=$OUT/ray bash scripts/device_run.sh ray 140
  # (the pooling tool's own baseline: the batch prefill of the same prompts, interleaved;
  # POOLED_BATCH=1 adds `bench --batch`, NOOVERLAP=1 the embeddings without the overlap)
  step pooled 260 env POOLED_TESTS=0 POOLED_BATCH=${POOLED_BATCH:-0} OUT=$OUT/pooled \
    bash scripts/device_run.sh pooled 255
  [ "${CLOSING_MOE:-0}" = 1 ] && step tests_moeblk 90 python3 -m pytest -q -rfEsx tests/gpu/test_moe_blk_device.py \
    -k "forward_matches_the_grid_reference or operand or upload"
  [ "${NOOVERLAP:-0}" = 1 ] && step nooverlap 130 python3 -m minfer.tools.bench.pooling \
    -m /tmp/q8b.gguf --batch 4096 --tokens 256 --docs 0 --repeats 2 --no-overlap
  echo; echo "################ SUMMARY closing ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- ray"; grep -vE "^WARNING: Target" "$OUT/ray.log" | tail -12
  echo "--- pooled"; tail -8 "$OUT/pooled.log"
  [ -f "$OUT/nooverlap.log" ] && echo "--- no overlap" && tail -3 "$OUT/nooverlap.log"
  tests_summary tests_moeblk; grep -sE "XFAIL|XPASS|rel |positions" "$OUT/tests_moeblk.log" | head -12
  exit 0
fi

if [ "$MODE" = llamacpp ]; then   # the peer row: llama.cpp's CUDA llama-bench on minfer's files
  # (built on the host for sm_90 against cuBLAS 13: .llamacuda/llama-bench.xz, the header's recipe;
  # the device's libcublas.so.13 found where its toolkit or PyTorch keeps it)
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llamacuda/llama-bench.xz'), \
open('/tmp/llama-bench', 'wb'))" && chmod +x /tmp/llama-bench
  CUBLAS=$(find /usr/local/cuda*/ /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)
  CUDART=$(find /usr/local/cuda*/ /opt /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH=$(dirname "${CUBLAS:-/x/y}"):$(dirname "${CUDART:-/x/y}"):$LD_LIBRARY_PATH
  echo "cublas: ${CUBLAS:-none found}; cudart: ${CUDART:-none found}" | tee -a "$OUT/steps.txt"
  ldd /tmp/llama-bench | grep -E "not found|cublas|cudart" | tee -a "$OUT/steps.txt"
  for p in ${LLAMACPP_PRESETS:-llama3.1-8b qwen3-30b-a3b}; do
    L=""; [ "$p" = qwen3-30b-a3b ] && L="--layers ${MOE_LAYERS:-48}"
    step synth_$p 120 $M synth --preset $p $L --type q4_K_M --tokenizer-from none --quiet -o /tmp/$p.gguf
    step llama_$p 150 /tmp/llama-bench -m /tmp/$p.gguf -p 512,2048 -n 0 -r 3 -ngl 99 -fa 1
    step minfer_$p 120 $M bench -m /tmp/$p.gguf --tokens 512,2048 --min-ms 0 --repeats 3 \
      --no-breakdown --gemm blk
    rm -f /tmp/$p.gguf
  done
  echo; echo "################ SUMMARY llamacpp ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for p in ${LLAMACPP_PRESETS:-llama3.1-8b qwen3-30b-a3b}; do echo "--- $p"
    grep -E "^\| |rror|failed" "$OUT/llama_$p.log" | grep -v "| ---" | head -8
    grep -E "^\| [a-z]|rror" "$OUT/minfer_$p.log" | head -4; done
  exit 0
fi

if [ "$MODE" = owed ]; then   # what the last stop left unmeasured, most wanted first, one call
  # (carry .whl, .cubin_cache and .devdata: ~51 MB): the GPU tests of its unrun changes (an
  # Engine's pooled jobs on another thread; q/k norms in the rope's launch; olmo2's operand
  # forms), the MoE blk tests with the forward's xfail reasons (--runxfail) and the persistent
  # expert GEMMs (bitwise, then timed: lab/moe_persist.py), olmo2 and qwen3-8b beside their llama
  # twins with olmo2's breakdown, then `minfer check` on the slice's Q4_K_M requant
  step tests 200 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_engine_threads.py \
    tests/gpu/test_fused_layers.py tests/gpu/test_blk_device.py tests/gpu/test_families_device.py \
    "tests/gpu/test_families_new_device.py::test_check_at_the_real_shapes[olmo2-7b-blk]"
  step house 200 env HOUSE_TESTS=0 FAMILY_PRESETS="olmo2-7b qwen3-8b" HOUSE_BREAKDOWN=olmo2-7b \
    OUT=$OUT/house bash scripts/device_run.sh house 195
  step tests_moe 150 python3 -m pytest -q -rfEs --runxfail tests/gpu/test_moe_blk_device.py \
    -k "grouped or grid_reference"
  step moe_persist 60 python3 lab/moe_persist.py --tokens 512,2048,8192
  if [ -f "$S" ]; then
    step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
    step check 120 $M check -m /tmp/slice-q4km.gguf; fi
  echo; echo "################ SUMMARY owed ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  tests_summary tests tests_moe
  grep -E "moe cuda blk" "$OUT/tests_moe.log" | head -8
  echo "--- the expert GEMMs one CTA a tile / persistent"; grep -E "^\||rror" "$OUT/moe_persist.log"
  grep -vE "^WARNING: Target" "$OUT/house.log" | sed -n '/SUMMARY/,$p' | grep -v "^== " | head -60
  [ -f "$OUT/check.log" ] && echo "--- check" && grep -E "FAIL|PASS|/32 \|" "$OUT/check.log" | tail -12
  rm -f "$OUT"/house/gpu.txt "$OUT"/house/steps.txt
  exit 0
fi

if [ "$MODE" = combo ]; then   # the serving table (engine process, thread, prefix cache off),
  # the new families' blk checks, the MoE kernels' tests: what the deadline leaves says SKIPPED
  [ "${SERVE_TESTS:-0}" = 1 ] && step tests_serve 100 python3 -m pytest -q -rfEs $XDIST \
    tests/gpu/test_serve_device.py tests/gpu/test_serve_faults_device.py
  step serve 300 env SERVE_S=${SERVE_S:-12} SERVE_CFGS="${SERVE_CFGS:-on thread off}" OUT=$OUT/serve \
    bash scripts/device_run.sh serve_loads 290
  [ "${COMBO_FAMILIES:-1}" = 1 ] && step tests_families 300 python3 -m pytest -q -rfEs $XDIST \
    tests/gpu/test_families_new_device.py -k blk
  step tests_moe 180 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_moe_device.py
  echo; echo "################ SUMMARY combo ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  tests_summary tests_serve tests_families tests_moe
  echo "--- serve"; cat "$OUT/serve/summary.txt" 2>/dev/null
  exit 0
fi

if [ "$MODE" = house ]; then   # issue 51's last rows and issue 54's first: the MoE kernels' tests,
  # the new families' blk checks, and each family's speed per weight beside llama's (one process)
  [ "${MOE_TESTS:-0}" = 1 ] && step tests_moe 180 python3 -m pytest -q -rfEs $XDIST tests/gpu/test_moe_device.py
  [ -n "$HOUSE_PYTEST" ] && step tests_extra 200 python3 -m pytest -q -rfEs $XDIST $HOUSE_PYTEST  # (GPU test files)
  # (three 4-layer real-shape checks with their CPU reference: over 150 s on the H100)
  [ "${HOUSE_TESTS:-1}" = 1 ] && step tests_families 300 python3 -m pytest -q -rfEs $XDIST \
    tests/gpu/test_families_new_device.py -k blk
  # each family beside its llama twin (`synth --as-llama`: its dimensions, no family ops)
  MS=""; for p in ${FAMILY_PRESETS:-llama3-8b granite-3-8b olmo2-7b smollm3-3b}; do
    step synth_$p 60 $M synth --preset $p --type q4_K_M --tokenizer-from none --quiet -o /tmp/$p.gguf
    MS="$MS -m /tmp/$p.gguf"
    [ "${p#llama}" = "$p" ] && step synth_${p}_twin 60 $M synth --preset $p --as-llama --type q4_K_M \
      --tokenizer-from none --quiet -o /tmp/$p-llama.gguf && MS="$MS -m /tmp/$p-llama.gguf"; done
  step bench_fam 200 $M bench $MS --tokens 512,2048 --min-ms 0 --repeats 2 --no-breakdown --gemm blk
  for p in $HOUSE_BREAKDOWN; do   # blk's per-op breakdown at 2,048, the family's then its twin's
    for f in $p $p-llama; do step brk_$f 60 $M bench -m /tmp/$f.gguf --tokens 2048 --min-ms 0 \
      --repeats 1 --gemm blk; done; done
  if [ -f "$S" ]; then   # the gates on the slice's Q4_K_M requant (carry .devdata)
    step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
    step check 160 $M check -m /tmp/slice-q4km.gguf; fi
  if [ -d .old ]; then for t in new old new2; do   # issue 51's A B A (new, old, new) at pp512
    d=$REPO; [ $t = old ] && d=$REPO/.old
    (cd $d && step bench_$t 60 env PYTHONPATH=/tmp/site:$d python3 -m minfer bench -m /tmp/llama3-8b.gguf \
      --tokens ${ABA_TOKENS:-512} --min-ms 0 --repeats 3 --no-breakdown); done; fi
  echo; echo "################ SUMMARY house ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  tests_summary tests_moe tests_extra tests_families
  echo "--- bench"; grep -E "^\| |^model|rror" "$OUT/bench_fam.log" | grep -v "| ---"
  for t in new old new2; do [ -f "$OUT/bench_$t.log" ] && echo "--- A B A $t" && grep -E "^\| [a-z]" "$OUT/bench_$t.log"; done
  [ -f "$OUT/check.log" ] && echo "--- check" && grep -E "FAIL|PASS|exact|/32|rel err|max" "$OUT/check.log" | tail -34
  for p in $HOUSE_BREAKDOWN; do for f in $p $p-llama; do echo "--- breakdown $f"
    grep -E "^\| [a-z]|^\| all" "$OUT/brk_$f.log" | grep -v "| config"; done; done
  exit 0
fi

if [ "$MODE" = blk ]; then   # the block-scaled int8 path: kernels, isolated GEMMs, end to end
  MINFER_TEST_MODEL=$S step tests 150 python3 -m pytest -q -rfEs tests/gpu/test_blk_device.py \
    tests/gpu/test_upload.py
  step gemm 150 python3 scripts/gemm_blk_bench.py --tokens 512,2048,16384 --variants=-
  step synth 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  step bench 120 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --min-ms 0 --repeats 3 --no-breakdown \
    --ab ${AB:-f16 blk}
  step sustained 90 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --repeats 3 --no-breakdown \
    --ab ${AB:-f16 blk}
  step breakdown 60 $M bench -m /tmp/s8b.gguf --tokens 2048 --min-ms 0 --repeats 1 --gemm blk
  echo; echo "################ SUMMARY blk ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)|Error" "$OUT/tests.log" | head -12
  echo "--- gemm"; cat "$OUT/gemm.log" | tail -14
  echo "--- bench"; grep -E "^\| |rror" "$OUT/bench.log" "$OUT/sustained.log" | grep -v "| ---"
  echo "--- breakdown"; grep -vE "^\s*$" "$OUT/breakdown.log" | tail -24
  exit 0
fi

if [ "$MODE" = split ]; then   # blk-split: GPU tests, bench against blk, gate 6 on the slice
  MINFER_TEST_MODEL=$S step tests 200 python3 -m pytest -q -rfEs tests/gpu/test_blk_split_device.py
  step synth 90 $M synth --preset llama3.1-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  step bench 150 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --min-ms 0 --repeats 3 --no-breakdown \
    --ab blk blk-split
  if [ -f "$S" ]; then
    step ppl_f16 40 $M perplexity -m "$S" --backend cuda --gemm f16 --chunks 8 --save-logits /tmp/f16.logits
    step ppl_blk 40 $M perplexity -m "$S" --backend cuda --gemm blk --kld-base /tmp/f16.logits
    step ppl_split 60 $M perplexity -m "$S" --backend cuda --gemm blk-split --kld-base /tmp/f16.logits
    step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
    step check 120 $M check -m /tmp/slice-q4km.gguf --gemm blk-split
  fi
  echo; echo "################ SUMMARY split ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  tests_summary tests
  echo "--- bench"; grep -E "^\| |rror" "$OUT/bench.log" | grep -v "| ---"
  for f in ppl_f16 ppl_blk ppl_split; do [ -f "$OUT/$f.log" ] && { echo "--- $f"; tail -7 "$OUT/$f.log"; }; done
  [ -f "$OUT/check.log" ] && { echo "--- check"; grep -E "FAIL|PASS|exact|/32|rel err|max" "$OUT/check.log" | tail -24; }
  exit 0
fi

if [ "$MODE" = final ]; then   # the whole GPU suite, the blk path's figures, the gate on the slice
  MINFER_TEST_MODEL=$S step tests 250 python3 -m pytest -q -rfEs $XDIST tests/gpu
  step gemm 90 python3 scripts/gemm_blk_bench.py --tokens 512,2048 --variants=-
  step synth 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
  step bench 90 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --min-ms 0 --repeats 3 --no-breakdown \
    --ab f16 blk
  step sustained 60 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --repeats 3 --no-breakdown --ab f16 blk
  step ppl_f16 40 $M perplexity -m "$S" --backend cuda --gemm f16 --chunks 8 --save-logits /tmp/f16.logits
  step ppl_blk 40 $M perplexity -m "$S" --backend cuda --gemm blk --kld-base /tmp/f16.logits
  step quantize 30 $M quantize "$S" /tmp/slice-q4km.gguf --type q4_K_M --quiet --allow-requantize
  step check 150 $M check -m /tmp/slice-q4km.gguf
  step breakdown 60 $M bench -m /tmp/s8b.gguf --tokens 2048 --min-ms 0 --repeats 1 --gemm blk
  echo; echo "################ SUMMARY final ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  echo "--- tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -12
  echo "--- gemm"; tail -26 "$OUT/gemm.log"
  echo "--- bench"; grep -E "^\| |rror" "$OUT/bench.log" "$OUT/sustained.log" | grep -v "| ---"
  echo "--- perplexity (slice, GPU f16 base)"; tail -2 "$OUT/ppl_f16.log"; tail -7 "$OUT/ppl_blk.log"
  echo "--- check"; grep -E "FAIL|PASS|exact|/32|rel err|max" "$OUT/check.log" | tail -24
  echo "--- breakdown"; grep -E "^\| " "$OUT/breakdown.log" | tail -12
  exit 0
fi

if [ "$MODE" = profile ]; then   # ncu on the blk GEMM and its FFMA-only fold; the installed wheel
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for g in "blk-tok 28672" "blk 4096" "f16 28672"; do   # gate|up as the forward runs it, attn_output
    set -- $g
    step ncu_$1_$2 60 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats -k regex:'mmq_blk|wgmma_f16' --launch-skip 2 \
      --launch-count 1 python3 scripts/gemm_blk_bench.py --one "$1,$2,4096,${PROF_M:-2048}"
  done
  installed_check
  echo; echo "################ SUMMARY profile ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  for f in "$OUT"/ncu*.log; do echo "--- $(basename "$f")"; grep -E "Duration|SM Frequency|Compute \(SM\)|Issue Slots|Issued Warp|No Eligible|Stall|Tensor is|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Warp Cycles Per Issued" "$f" | head -16; done
  echo "--- installed (cwd /tmp, PYTHONPATH=/tmp/x only)"; grep -vE "^\s*$" "$OUT/installed.log" | tail -9
  exit 0
fi

if [ "$MODE" = big ]; then   # a 70B-shape Q4_K_M (~40 GB): what --gemm auto picks by memory
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader -lms 250 > "$OUT/mem.log" &
  if [ -n "$HOLD_GB" ]; then   # a co-tenant process holding HOLD_GB GiB of the GPU (a shared GPU)
    python3 -c "import torch, time; x = torch.empty($HOLD_GB << 30, dtype=torch.uint8, device='cuda'); \
print('holding', flush=True); time.sleep(3600)" > "$OUT/hold.log" 2>&1 &
    for _ in $(seq 60); do grep -q holding "$OUT/hold.log" && break; sleep 1; done
    echo "co-tenant holds $HOLD_GB GiB: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) used"
  fi
  step synth70 240 $M synth --preset llama3-70b --type q4_K_M --tokenizer-from none --quiet \
    ${VOCAB70:+--vocab $VOCAB70} -o /tmp/s70.gguf
  for n in 512 2048; do python3 scripts/prompt_of.py "$n" /tmp/s70.gguf > /tmp/p$n.txt; done
  step prefill70 200 $M prefill -m /tmp/s70.gguf --backend cuda --prompt-file /tmp/p2048.txt -n 4
  if [ -n "$BENCH70" ]; then   # single prefills, sustained, the per-op breakdown at pp2048
    step bench70 200 $M bench -m /tmp/s70.gguf --tokens 512,2048 --min-ms 0 --repeats 3 --no-breakdown
    step sustained70 120 $M bench -m /tmp/s70.gguf --tokens 512,2048 --repeats 3 --no-breakdown
    step breakdown70 90 $M bench -m /tmp/s70.gguf --tokens 2048 --min-ms 0 --repeats 1
  fi
  [ -z "$HOLD_GB" ] && step prefill70blk 150 $M prefill -m /tmp/s70.gguf --backend cuda --gemm blk \
    --prompt-file /tmp/p2048.txt -n 4   # (with HOLD_GB auto runs blk already)
  kill $(jobs -p) 2>/dev/null
  echo; echo "################ SUMMARY big ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
  grep -E "^(model|gemm|memory|prompt|load|prefill)|error" "$OUT"/prefill70*.log
  for f in bench70 sustained70 breakdown70; do
    [ -f "$OUT/$f.log" ] && grep -E "^\| |rror|gemm|backend" "$OUT/$f.log" | grep -v "^| ---"
  done
  echo "peak GPU memory: $(cut -d, -f1 "$OUT/mem.log" | sort -n | tail -1) of $(head -1 "$OUT/mem.log" | cut -d, -f2)"
  exit 0
fi

step synth 90 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s8b.gguf
for n in 512 3001; do   # a prompt of exactly n tokens (BOS included) under the model's tokenizer
  python3 scripts/prompt_of.py "$n" /tmp/s8b.gguf > /tmp/p$n.txt
  for run in cold warm; do
    step ${run}_$n 120 env MINFER_CACHE=/tmp/cache_$n $M prefill -m /tmp/s8b.gguf --backend cuda \
      --prompt-file /tmp/p$n.txt -n 4
  done
done
step bench_len 120 $M bench -m /tmp/s8b.gguf --tokens 512,3001 --min-ms 0 --repeats 6 --no-breakdown
AB=(${AB:-f16 blk wide-kd4 wide-kd8})
step bench_single 150 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --min-ms 0 --repeats 4 \
  --no-breakdown --ab "${AB[@]}"
if [ -d .old/minfer ]; then
  (cd .old && step bench_old 100 python3 -m minfer bench -m /tmp/s8b.gguf --tokens 512,2048 \
    --min-ms 0 --repeats 4 --no-breakdown --ab f16 mmq)
fi
step bench_sustained 100 $M bench -m /tmp/s8b.gguf --tokens 512,2048 --repeats 3 --no-breakdown \
  --ab f16 blk
echo; echo "################ SUMMARY perf ($(cat "$OUT/gpu.txt"))"; cat "$OUT/steps.txt"
for f in cold_512 warm_512 cold_3001 warm_3001; do
  echo "--- prefill $f"; grep -E "^(prompt|load|prefill)|error" "$OUT/$f.log"; done
for f in bench_len bench_single bench_old bench_sustained; do
  [ -f "$OUT/$f.log" ] || continue
  echo "--- $f"; grep -E "^\| |rror" "$OUT/$f.log" | grep -v "^| ---" | head -14
done
