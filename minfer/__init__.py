"""minfer: a prefill inference engine for llama-style GGUF models on NVIDIA GPUs."""

__version__ = "0.1.0"
