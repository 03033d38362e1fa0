"""What the commands run, one place each (minfer.commands keeps the flags and their checks):
prefill/ (one prompt, a prompt file), bench/ (A/B prefill, batch, pooled jobs, the server load
generator, output formats), perplexity/ (windows, KL divergence, llama.cpp's files, the report),
embed, quantize (the whole-file requantizer) with quantize_mix (llama.cpp's type mix), synth
(synthetic models), gates (the identity gates)."""
