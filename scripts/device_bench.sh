# Bench-only device call: the synthetic 8B Q4_K_M model, f16 path vs default MMQ, interleaved.
DEADLINE=200; source scripts/device_lib.sh >/dev/null 2>&1
M="python3 -m minfer"
step synth 80 $M synth --preset llama3-8b --type q4_K_M --tokenizer-from none --quiet -o /tmp/s32.gguf
step bench 200 $M bench -m /tmp/s32.gguf --tokens 512,2048 --repeats 3 --ab "MINFER_MMQ=0" "MINFER_MMQ=1"
cat $OUT/steps.txt; grep -E "^\| |^per-op" $OUT/bench.log | grep -v "^| ---" | grep -E "tok|config|prepass|ffn_down|per-op|all ops|MINFER"
