"""Every kernel a CUDA backend will load, built before anything is timed.

A cold kernel cache used to be compiled inside the first timed prefill (106 tok/s printed for a
~40,000 tok/s path, issue 20). Here:
- `load_kernels(routes)`: the modules the weight upload launches (dequant, and each route's
  path's own: GemmPath.load_kernels), built before load_weights;
- `needed_kernels(backend, lengths)`: the modules the forward of each prompt length loads,
  found by a dry pass: the backend's own Forward runs against a `Recorder` runtime that
  notes every (source, options) the launchers ask for and launches nothing, so the list follows
  the routes, shapes and flags exactly as the real run will (a list recorded by a previous run
  would be empty on a cold cache, a declared list would drift from the launchers);
- `prebuild(specs, arch)`: the missing cubins compiled in parallel (one nvcc subprocess per
  thread, as many threads as CPUs), one progress line on a terminal;
- `warmup(backend, lengths)`: the above, then one untimed forward per length (modules load,
  each chunk shape's CUDA graph is recorded), so the timed prefill replays graphs as bench's do.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

Spec = tuple[str, tuple[str, ...]]  # (kernels/<name>.cu, nvcc options): Runtime.module's key


@dataclass
class Prep:
    """What preparing cost: kernels compiled (0 on a warm cache) and the seconds apart."""

    n_compiled: int = 0
    compile_s: float = 0.0
    capture_s: float = 0.0


class _DryFunction:
    def __init__(self, entry: str):
        self._minfer_name = entry


class Recorder:
    """A runtime for a dry pass: records the modules launchers ask for; launches, poison fills
    and synchronizes do nothing; everything else (arch, SM count, workspaces) is the real one's."""

    def __init__(self, rt):
        self._rt = rt
        self.specs: set[Spec] = set()

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def module(self, name: str, options: tuple[str, ...] = ()):
        self.specs.add((name, tuple(options)))

    def function(self, name: str, entry: str, options: tuple[str, ...] = (), dyn_smem: int = 0):
        self.specs.add((name, tuple(options)))
        return _DryFunction(entry)

    def launch(self, *args, **kw) -> None:
        pass

    def poison(self, *args, **kw) -> None:
        pass

    def synchronize(self) -> None:
        pass


def chunk_shapes(lengths, ubatch: int) -> list[tuple[int, bool]]:
    """The distinct (T, last) chunks CudaBackend.forward_device runs for prompts of `lengths`."""
    out: set[tuple[int, bool]] = set()
    for n in lengths:
        for s in range(0, int(n), ubatch):
            t = min(ubatch, int(n) - s)
            out.add((t, s + t == int(n)))
    return sorted(out)


def load_kernels(routes: dict[str, tuple[str, str]]) -> list[Spec]:
    """Modules weights.load_weights launches: dequant (the embedding rows, f16 routes), and
    each route's path's own (GemmPath.load_kernels: a requantizing path's kernel)."""
    from minfer.cuda.ops.dequant import KERNEL
    from minfer.cuda.paths import TABLE

    out = [(KERNEL, ())]
    for name in sorted({p for p, _ in routes.values() if p in TABLE}):
        out += [s for s in TABLE[name].load_kernels() if s not in out]
    return out


def needed_kernels(backend, lengths=(1,)) -> list[Spec]:
    """Every module backend.forward loads for prompts of `lengths`: a dry pass of the
    backend's own Forward (minfer.cuda.forward) on a recording runtime."""
    rec = Recorder(backend.rt)
    fwd = backend.fwd.with_runtime(rec)
    for T, last in chunk_shapes([min(int(n), backend.max_tokens) for n in lengths], backend.ubatch):
        fwd.chunk(T, T, last)
    return sorted(rec.specs)


def missing(specs, arch: str) -> list[Spec]:
    from minfer.cuda.runtime.build import cubin_path

    return [s for s in dict.fromkeys(specs) if not cubin_path(s[0], arch, s[1]).exists()]


def prebuild(specs, arch: str, progress: bool = False, workers: int | None = None) -> Prep:
    """Compile the specs' missing cubins in parallel; Prep(n compiled, wall seconds)."""
    from minfer.cuda.runtime.build import compile_cubin

    todo = missing(specs, arch)
    if not todo:
        return Prep()
    t0 = time.perf_counter()
    from minfer.host.progress import bar as progress_bar

    bar = progress_bar(
        progress,
        total=len(todo),
        unit="kernel",
        desc=f"compiling {len(todo)} kernel{'s' * (len(todo) > 1)} for {arch} (first run only)",
    )
    ex = ThreadPoolExecutor(max_workers=max(1, min(len(todo), workers or os.cpu_count() or 1)))
    try:
        for f in as_completed([ex.submit(compile_cubin, n, arch, o) for n, o in todo]):
            f.result()  # an nvcc failure: GPUError naming the source
            if bar is not None:
                bar.update()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    return Prep(len(todo), time.perf_counter() - t0)


def warmup(backend, lengths, progress: bool = False) -> Prep:
    """Build what forwards of `lengths` need, then run one of each (untimed; the KV cache is
    reset after): modules load and every chunk shape's CUDA graph is recorded."""
    lengths = sorted({min(int(n), backend.max_tokens) for n in lengths if int(n) > 0})
    prep = prebuild(needed_kernels(backend, lengths), backend.rt.arch, progress)
    t0 = time.perf_counter()
    for n in lengths:
        backend.reset()
        backend.forward(np.zeros(n, np.int32), 0)
    backend.reset()
    backend.synchronize()
    prep.capture_s = time.perf_counter() - t0
    return prep
