"""`minfer bench` and `minfer bench-serve`, the tools behind the two commands (minfer.commands
keeps their flags): ab.py, interleaved A/B prefill of one prompt and the per-op breakdown;
batch.py, many prompts as one packed run beside one alone (--batch, --prompts); pooling.py, the
pooled jobs' figures (python3 -m minfer.tools.bench.pooling); out.py, llama-bench's output
formats and the plot; serve.py, the closed-loop load generator against a server."""
