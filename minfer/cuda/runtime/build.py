"""Kernel build and cache: kernels/*.cu -> cubin with nvcc, once per (source, options, arch).

Works without a GPU (CI compiles every kernel and reads ptxas's resource report), so nothing
here imports pycuda. The cache key is the sha256 of the source, every header it includes from
kernels/, the options, the arch and the nvcc version; cubins are written to a temporary name
and renamed, so two processes building the same kernel never see a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from minfer.errors import GPUError


def find_kernel_dir(pkg: Path = Path(__file__).resolve().parents[1]) -> Path:  # noqa: B008
    """The CUDA sources for the minfer/cuda package `pkg`: a source checkout's (or editable
    install's) top-level kernels/, else the copy a wheel ships as package data
    (minfer/cuda/kernels, setup.py's build_py). The checkout needs its pyproject.toml too, so a
    stray site-packages/kernels is never taken."""
    root = pkg.parent.parent
    if (root / "kernels").is_dir() and (root / "pyproject.toml").is_file():
        return root / "kernels"
    return pkg / "kernels"


KERNEL_DIR = find_kernel_dir()

DEFAULT_OPTIONS = ("-O3", "-std=c++17")


def cache_dir() -> Path:
    from minfer.host.fileio import cache_root

    d = cache_root("cubin")
    d.mkdir(parents=True, exist_ok=True)
    return d


def kernel_path(name: str) -> Path:
    p = KERNEL_DIR / (name if name.endswith(".cu") else name + ".cu")
    if not p.is_file():
        raise GPUError(f"kernel source {p} not found")
    return p


@lru_cache(maxsize=1)
def nvcc() -> str:
    exe = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if exe is None:
        raise GPUError(
            "nvcc not found on PATH: the CUDA toolkit is needed to build minfer's "
            "kernels (or run with --backend cpu)"
        )
    return exe


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    return subprocess.run([nvcc(), "--version"], capture_output=True, text=True).stdout


def _includes(src: Path, seen: set[Path] | None = None) -> list[Path]:
    """Local headers a source pulls in with #include "x.cuh", transitively."""
    seen = set() if seen is None else seen
    for m in re.finditer(r'#include\s+"([^"]+)"', src.read_text()):
        h = (src.parent / m.group(1)).resolve()
        if h.is_file() and h not in seen:
            seen.add(h)
            _includes(h, seen)
    return sorted(seen)


def cache_key(src: Path, arch: str, options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for f in [src, *_includes(src)]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(repr((arch, options)).encode())
    h.update(nvcc_version().encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report for one entry: what CI checks (no spills, smem within budget)."""

    name: str
    registers: int
    smem_static: int
    stack: int
    spill_stores: int
    spill_loads: int


def parse_ptxas(report: str) -> dict[str, KernelResources]:
    out: dict[str, KernelResources] = {}
    cur = None
    vals: dict[str, int] = {}
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line) or re.search(
            r"Function properties for (\S+)", line
        )
        if m:
            if cur and "registers" in vals:
                out[cur] = _res(cur, vals)
            if "Compiling entry" in line or cur != m.group(1):
                cur, vals = m.group(1), {}
            continue
        if cur is None:
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m:
            vals["stack"], vals["ss"], vals["sl"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            vals["registers"] = int(m.group(1))
            m2 = re.search(r"(\d+) bytes smem", line)
            vals["smem"] = int(m2.group(1)) if m2 else 0
    if cur and "registers" in vals:
        out[cur] = _res(cur, vals)
    return out


def _res(name: str, v: dict[str, int]) -> KernelResources:
    return KernelResources(
        name, v["registers"], v.get("smem", 0), v.get("stack", 0), v.get("ss", 0), v.get("sl", 0)
    )


def cubin_path(name: str, arch: str = "sm_90", options: tuple[str, ...] = ()) -> Path:
    """Where compile_cubin(name, arch, options) keeps its cubin (present: nothing to build)."""
    src = kernel_path(name)
    key = cache_key(src, arch, tuple(DEFAULT_OPTIONS) + tuple(options))
    return cache_dir() / f"{src.stem}-{arch}-{key}.cubin"


def compile_cubin(
    name: str, arch: str = "sm_90", options: tuple[str, ...] = (), report: bool = False
) -> tuple[Path, str]:
    """Compile kernels/<name>.cu for `arch`; return (cubin path, ptxas report).

    Cached: a second call with the same inputs returns the cached cubin, and with
    report=True the ptxas report saved beside it at build time (no recompile).
    """
    src = kernel_path(name)
    opts = tuple(DEFAULT_OPTIONS) + tuple(options)
    out = cubin_path(name, arch, options)
    log = out.with_suffix(".ptxas.txt")  # ptxas's report, kept beside the cubin
    if out.exists() and (not report or log.exists()):
        return out, log.read_text() if report else ""
    cmd = [nvcc(), "-cubin", f"-arch={arch}", *opts, "-Xptxas", "-v", "-I", str(src.parent), "-o"]
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    os.close(fd)
    try:
        r = subprocess.run([*cmd, tmp, str(src)], capture_output=True, text=True)
        if r.returncode != 0:
            raise GPUError(f"nvcc failed on {src.name} for {arch}:\n{r.stderr.strip()}")
        _atomic_write_text(log, r.stderr)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, r.stderr


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
