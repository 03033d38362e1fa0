"""minfer: a prefill inference engine for llama-style GGUF models on NVIDIA GPUs.

The Python API: `minfer.Engine` (minfer.engine.api), imported on first use so that `import minfer`
stays light (the CLI's start-up)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("Engine", "Completion"):
        from minfer.engine import api

        return getattr(api, name)
    if name == "MinferPredictor":  # Ray Data's actor class (the ray extra): minfer.engine.ray
        from minfer.engine.ray import predictor

        return predictor.MinferPredictor
    raise AttributeError(f"module 'minfer' has no attribute {name!r}")
