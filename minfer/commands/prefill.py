"""`minfer prefill`: run a prompt through a model, report prefill/decode tok/s and greedy ids.

With no arguments: the default model (SmolLM2-135M-Instruct Q4_1) on golden prompt 0, on the
GPU when one is usable, else on the CPU reference. Validation (prompt, --greedy, context) runs
before the weights are loaded. Progress bars go to stderr (and only on a terminal); --json
prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import click

from minfer.commands.gemm_flags import gemm_config, gemm_options
from minfer.errors import BadInput, GPUError

DEFAULT_PROMPT = "The name of the capital city of France is"  # golden prompt 0


def read_prompt_file(path: str) -> str:
    """UTF-8 text of a prompt file; BadInput naming the file (and byte offset) otherwise."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such prompt file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a prompt file") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read prompt file ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: invalid UTF-8 at byte offset {e.start} "
                       f"(byte 0x{data[e.start]:02x})") from None


def pick_backend_kind(requested: str | None) -> tuple[str, str]:
    """(kind, why): the requested backend, else cuda when a GPU is usable, else cpu."""
    if requested:
        return requested, "requested"
    from minfer.cuda.runtime import gpu_available

    if gpu_available():
        return "cuda", "auto: GPU found"
    return "cpu", "auto: no usable GPU"


def check_backend(kind: str, dtype: str | None) -> None:
    """Fail fast (before the model loads) when the requested backend cannot run."""
    if kind == "cpu":
        return
    if dtype is not None:
        raise BadInput("--dtype applies to --backend cpu only")
    try:
        import minfer.cuda.backend  # noqa: F401
    except ImportError as e:
        raise GPUError(f"the cuda backend cannot be imported ({e}); "
                       "use --backend cpu to run on the CPU reference") from None
    from minfer.cuda.runtime import gpu_available

    if not gpu_available():
        raise GPUError("no usable CUDA GPU (or pycuda missing); "
                       "use --backend cpu to run on the CPU reference")


def make_backend(kind: str, model, dtype: str | None, max_tokens: int, ubatch: int,
                 gemm=None):
    if kind == "cpu":
        import numpy as np

        from minfer.reference.forward import ReferenceBackend

        be = ReferenceBackend(model, dtype=np.float64 if dtype == "f64" else np.float32,
                              max_tokens=max_tokens)
        be.preload(progress=True)
        return be
    check_backend(kind, None)
    from minfer.cuda.backend import CudaBackend

    return CudaBackend(model, gemm, max_tokens=max_tokens, ubatch=ubatch, progress=True)


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else float(x)


@click.command("prefill")
@click.option("-m", "--model", "model_path", type=click.Path(dir_okay=False),
              help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once).")
@click.option("-p", "--prompt", default=None, help=f"Prompt text (default: {DEFAULT_PROMPT!r}).")
@click.option("--prompt-file", type=click.Path(), default=None, help="Read the prompt (UTF-8).")
@click.option("--greedy", "n_greedy", type=int, default=32, show_default=True,
              help="Greedy ids to decode after the prompt (argmax, no stop at EOS).")
@click.option("--backend", "backend_kind", type=click.Choice(["cpu", "cuda"]), default=None,
              help="cuda (our kernels) or cpu (numpy reference); default: cuda if a GPU is usable.")
@click.option("--ubatch", type=int, default=512, show_default=True,
              help="Prompt tokens per forward call.")
@click.option("--dtype", type=click.Choice(["f32", "f64"]), default=None,
              help="CPU reference precision (default f32).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@gemm_options
def prefill(model_path, prompt, prompt_file, n_greedy, backend_kind, ubatch, dtype,
            as_json, gemm) -> None:
    """Prefill a prompt, print tok/s (prefill and decode apart) and the greedy ids and text."""
    from minfer import engine
    from minfer.loader import load_model
    from minfer.tokenizer import Tokenizer

    if prompt is not None and prompt_file is not None:
        raise BadInput("give either -p/--prompt or --prompt-file, not both")
    text = read_prompt_file(prompt_file) if prompt_file is not None else (
        DEFAULT_PROMPT if prompt is None else prompt)
    if model_path is None:
        from minfer.fetch import default_model_path

        model_path = default_model_path()
    kind, why = pick_backend_kind(backend_kind)
    check_backend(kind, dtype)

    t0 = time.perf_counter()
    model = load_model(model_path)
    tok = Tokenizer.from_metadata(model.metadata)
    ids = tok.encode(text)
    engine.validate(len(ids), n_greedy, ubatch, model.config.n_ctx)  # before loading weights
    backend = make_backend(kind, model, dtype, len(ids) + n_greedy, ubatch,
                           gemm_config(gemm=gemm))
    load_s = time.perf_counter() - t0

    res = engine.run(backend, ids, n_greedy=n_greedy, ubatch=ubatch, progress=True)
    greedy_text = tok.decode(res.greedy_ids)
    out = {
        "model": str(model_path),
        "backend": backend.name,
        "backend_choice": why,
        "gemm_routes": getattr(backend, "route_summary", lambda: None)(),
        "n_prompt": len(res.prompt_ids),
        "prompt_ids": res.prompt_ids,
        "greedy_ids": res.greedy_ids,
        "greedy_text": greedy_text,
        "load_s": load_s,
        "prefill_s": res.prefill_s,
        "decode_s": res.decode_s,
        "prefill_tok_s": _num(res.prefill_tok_s),
        "decode_tok_s": _num(res.decode_tok_s),
    }
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"model    {model.describe()}")
    click.echo(f"backend  {backend.name} ({why})")
    if hasattr(backend, "route_summary"):
        click.echo(f"gemm     {backend.route_summary()}")
    click.echo(f"prompt   {len(ids)} tokens")
    click.echo(f"load     {load_s:.2f} s")
    click.echo(f"prefill  {res.prefill_tok_s:,.1f} tok/s ({res.prefill_s * 1e3:.1f} ms)")
    if n_greedy > 1:
        click.echo(f"decode   {res.decode_tok_s:,.1f} tok/s ({n_greedy - 1} single-token steps, "
                   f"{res.decode_s * 1e3:.1f} ms)")
    click.echo(f"greedy   {res.greedy_ids}")
    click.echo(f"text     {greedy_text!r}")
    sys.stdout.flush()
