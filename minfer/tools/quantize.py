"""Quantize a whole model file the way `llama_model_quantize` does (no imatrix): `minfer
quantize`'s tool (here, not in quants/, because it reads and writes GGUF files: quants/ stays
below gguf/).

Each tensor gets the type minfer.tools.quantize_mix picks; a tensor whose type does not change is
copied byte for byte (llama.cpp does the same), any other is dequantized to float32 (the
reference dequant, = ggml's to_float) and quantized with minfer.quants.quantize. Work is split into row
chunks run by a process pool (every core), results come back in order and stream into
minfer.gguf.write.write_gguf, which writes atomically (temporary name, then rename).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minfer.errors import BadInput

# weights per work item: big enough to amortize the pool, small enough to balance the cores
_CHUNK_WEIGHTS = 1 << 20


@dataclass(frozen=True)
class QuantizeStats:
    n_tensors: int
    n_quantized: int  # tensors whose type changed
    n_weights: int  # weights that went through a quantizer
    seconds: float
    in_bytes: int
    out_bytes: int
    types: dict[str, str]  # name -> type written

    @property
    def weights_per_s(self) -> float:
        return self.n_weights / self.seconds if self.seconds > 0 else 0.0


# One opened model per worker process and the pool's stop event, set by the pool initializer
# (workers are separate processes; this is their private state, not configuration).
_worker_model = None
_worker_stop = None


def _worker_init(path: str, forked: bool, stop) -> None:
    global _worker_model, _worker_stop
    from minfer.host.signals import ignore_in_worker

    ignore_in_worker()  # the parent handles SIGINT/SIGTERM/SIGHUP and drains us (see _drain)
    _worker_stop = stop
    if not forked:  # a forked worker already has the parent's opened (memory-mapped) model
        from minfer.gguf.loader import load_model

        _worker_model = load_model(path)


def _work(item: tuple[str, int, int, str]) -> np.ndarray | None:
    """(tensor, first row, end row, target type) -> quantized bytes [rows, row_bytes]; None
    once the parent has set the stop event."""
    from minfer.quants.quantize import quantize

    if _worker_stop.is_set():
        return None
    name, r0, r1, ty = item
    x = _worker_model.dequant(name, rows=slice(r0, r1))
    return quantize(np.ascontiguousarray(x, dtype=np.float32), ty)


def _drain(pool, stop) -> None:
    """Stop a pool whose results are no longer wanted (Ctrl-C, a write error) without
    terminating workers mid-task: Pool.terminate() kills them where they are, and one killed
    while sending its result leaves a partial message in the result pipe, on which the pool's
    result thread then waits forever (the hang a Ctrl-C could meet). Workers finish their
    current chunk and skip the rest; then the pool closes normally."""
    stop.set()
    pool.close()
    pool.join()


def check_output_path(in_path: Path, out_path: Path) -> None:
    from minfer.host.fileio import output_target

    # a directory is refused; a device or FIFO written through; a link's target replaced
    target, through = output_target(out_path)
    parent = target.parent
    if not through and not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{parent}: output directory is not writable")
    if out_path.exists() and not os.access(out_path, os.W_OK):
        raise BadInput(f"{out_path}: exists and is not writable")
    if out_path.exists() and in_path.exists() and out_path.samefile(in_path):
        raise BadInput(f"{out_path}: output would overwrite the input file")


# source types llama-quantize converts without --allow-requantize (ggml_is_quantized: false)
_PLAIN = {"F32", "F16", "BF16", "F64"}


def check_requantize(types: dict[str, str], src: dict[str, str], ftype: str) -> None:
    """llama-quantize's rule: converting a tensor whose type is already quantized (not
    F32/F16/BF16) to another type needs --allow-requantize (quality is lost twice). BadInput
    naming the first such tensor and the count; a tensor kept as it is does not count."""
    requant = [n for n, ty in types.items() if ty != src[n] and src[n] not in _PLAIN]
    if requant:
        from minfer.host.words import plural

        first = requant[0]
        raise BadInput(
            f"{first} is {src[first]} already: requantizing "
            f"{plural(len(requant), 'quantized tensor')} to {ftype} loses quality "
            "twice; pass --allow-requantize to do it anyway (as llama-quantize)"
        )


def quantize_model(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    ftype: str,
    threads: int | None = None,
    progress: bool = True,
    allow_requantize: bool = True,
) -> QuantizeStats:
    import gguf

    from minfer.gguf.loader import load_model
    from minfer.gguf.write import metadata_from_reader, write_gguf
    from minfer.tools.quantize_mix import (
        FTYPES,
        GGML_QNT_VERSION,
        MixModel,
        TensorDesc,
        ftype_key,
        plan_types,
    )

    in_path, out_path = Path(in_path), Path(out_path)
    ftype = ftype_key(ftype)
    check_output_path(in_path, out_path)
    model = load_model(in_path)
    c = model.config
    mix = MixModel(
        c.arch,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        int(model.metadata.get(f"{c.arch}.expert_count", 0) or 0),
    )
    descs = [TensorDesc(n, t.shape, t.type_name) for n, t in model.tensors.items()]
    types = plan_types(descs, ftype, mix)  # in llama.cpp's tensor order
    if not allow_requantize:
        check_requantize(types, {n: t.type_name for n, t in model.tensors.items()}, ftype)

    meta = metadata_from_reader(model)
    for k in ("split.no", "split.count", "split.tensors.count"):
        meta.pop(k, None)
    U32 = gguf.GGUFValueType.UINT32
    meta["general.quantization_version"] = gguf.GGUFValue(GGML_QNT_VERSION, U32)
    meta["general.file_type"] = gguf.GGUFValue(FTYPES[ftype][0], U32)

    # work items, in write order
    items: list[tuple[str, int, int, str]] = []
    n_weights = 0
    for name, ty in types.items():
        t = model.tensors[name]
        if ty == t.type_name:
            continue
        rows, cols = (t.shape[0], t.shape[1]) if len(t.shape) == 2 else (1, t.shape[0])
        if len(t.shape) > 2:
            raise BadInput(f"{name}: {len(t.shape)}-D tensors are not supported by quantize")
        step = max(1, _CHUNK_WEIGHTS // cols)
        items += [(name, r, min(rows, r + step), ty) for r in range(0, rows, step)]
        n_weights += rows * cols

    threads = max(1, threads or os.cpu_count() or 1)
    from minfer.quants import ckernel

    ckernel.library()  # build (or find in the cache) the C quantizers once, before the fork
    t0 = time.perf_counter()
    import multiprocessing as mp

    global _worker_model
    forked = sys.platform.startswith("linux")
    ctx = mp.get_context("fork" if forked else "spawn")
    _worker_model = model  # inherited by forked workers (opening the model again takes seconds)
    # the pool is made before any progress-bar thread exists (fork copies no running thread)
    stop = ctx.Event()
    from minfer.host.pools import start_pool
    from minfer.host.signals import deferred

    with deferred():  # a signal now would leave started workers behind: take it after
        pool = start_pool(
            ctx,
            min(threads, max(1, len(items))),
            initializer=_worker_init,
            initargs=(str(in_path), forked, stop),
        )
    bar = None
    try:
        results = pool.imap(_work, items)  # ordered; workers run ahead of the writer
        from minfer.host.progress import bar as progress_bar

        bar = progress_bar(
            progress, total=n_weights, unit="w", unit_scale=True, desc=f"quantizing {ftype}"
        )

        def produce(name: str, ty: str):
            t = model.tensors[name]
            if ty == t.type_name:  # same type: llama.cpp copies the bytes
                return lambda: np.asarray(t.data).reshape(-1).view(np.uint8)

            def get():
                rows = t.shape[0] if len(t.shape) == 2 else 1
                parts, got = [], 0
                while got < rows:
                    part = next(results)
                    parts.append(part)
                    got += part.shape[0]
                    if bar is not None:
                        bar.update(part.shape[0] * t.shape[-1])
                return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

            return get

        entries = [
            (name, int(gguf.GGMLQuantizationType[ty]), model.tensors[name].shape, produce(name, ty))
            for name, ty in types.items()
        ]
        write_gguf(out_path, c.arch, meta, entries, progress=False)
    finally:
        # every way out stops the workers the same way (they ignore signals, so
        # Pool.terminate's SIGTERM would not): skip what is left, close, join
        with deferred():  # a signal during the join would leave the pool half-stopped
            _drain(pool, stop)
        if bar is not None:
            bar.close()
    _worker_model = None
    seconds = time.perf_counter() - t0
    return QuantizeStats(
        n_tensors=len(types),
        n_quantized=sum(1 for n, ty in types.items() if ty != model.tensors[n].type_name),
        n_weights=n_weights,
        seconds=seconds,
        in_bytes=in_path.stat().st_size,
        out_bytes=out_path.stat().st_size,
        types=types,
    )
