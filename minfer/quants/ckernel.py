"""The C k-quantizers (minfer/quants/kquants.c): built at run time, cached, loaded with ctypes.

Same idea as minfer/cuda/runtime/build.py for cubins: the shared library is compiled once per
(source, flags, compiler version, machine) with the system C compiler (`$CC`, else cc / gcc / clang) into
`$MINFER_CACHE/cc/` (default ~/.cache/minfer/cc), written to a temporary name and renamed so
concurrent builders never see half a file. No compiler, a failed build, or a big-endian host:
`library()` is None and minfer/quants/quantize.py uses its numpy twins (same bytes, slower).

The flags keep float32 semantics exact (the C code relies on it, see kquants.c): no FMA
contraction, no fast-math; -fno-math-errno only lets sqrtf be one instruction (same result).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from minfer.errors import BadInput

SOURCE = Path(__file__).resolve().parent / "kquants.c"
FLAGS = ("-O3", "-std=gnu11", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno")
# tried in order: the host's vector width first (AVX2: ~2x SSE2), then the portable baseline
VARIANTS = (FLAGS + ("-march=native",), FLAGS)

# type -> (C entry point, bytes per 256-weight super-block)
ENTRIES = {
    "Q4_K": ("minfer_quantize_q4_K", 144),
    "Q5_K": ("minfer_quantize_q5_K", 176),
    "Q6_K": ("minfer_quantize_q6_K", 210),
}


def cache_dir() -> Path:
    from minfer.host.fileio import cache_root

    d = cache_root("cc")
    d.mkdir(parents=True, exist_ok=True)
    return d


def compiler() -> str | None:
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@lru_cache(maxsize=1)
def cpu_id() -> str:
    """What -march=native depends on: a library built for one CPU may not run on another that
    shares the cache directory, so this goes into the cache key."""
    try:
        with open("/proc/cpuinfo") as f:
            keep = [
                ln
                for ln in f
                if ln.split(":")[0].strip()
                in ("flags", "Features", "model name", "CPU part", "isa")
            ]
        return "".join(sorted(set(keep)))
    except OSError:
        return platform.processor() + platform.platform()


def build(cc: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """Compile kquants.c (or find it in the cache) -> path of the shared library.

    Raises OSError / subprocess.CalledProcessError when the compiler fails.
    """
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(repr((flags, platform.machine(), sys.platform)).encode())
    if "-march=native" in flags:
        h.update(cpu_id().encode())
    h.update(_version(cc).encode())
    out = cache_dir() / f"kquants-{h.hexdigest()[:32]}.so"
    if out.is_file():
        return out
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, "-o", tmp, str(SOURCE), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@lru_cache(maxsize=None)
def load(flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """kquants.c built with these flags and loaded, or None if that fails."""
    cc = compiler()
    if cc is None or sys.byteorder != "little" or not SOURCE.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(build(cc, flags)))
    except (OSError, subprocess.SubprocessError):
        return None
    f32p, u8p, u16p = (ctypes.POINTER(t) for t in (ctypes.c_float, ctypes.c_uint8, ctypes.c_uint16))
    for name, _ in ENTRIES.values():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [f32p, u8p, ctypes.c_int64], ctypes.c_int
    lib.minfer_f32_to_f16.argtypes, lib.minfer_f32_to_f16.restype = (
        [f32p, u16p, ctypes.c_int64],
        None,
    )
    return lib


def library() -> ctypes.CDLL | None:
    """The C quantizers of the first variant that builds, or None (numpy fallback)."""
    for flags in VARIANTS:
        lib = load(flags)
        if lib is not None:
            return lib
    return None


def _ptr(a: np.ndarray, t):
    return a.ctypes.data_as(ctypes.POINTER(t))


def quantize_k(xb: np.ndarray, name: str, lib: ctypes.CDLL | None = None) -> np.ndarray:
    """C twin of quantize_k.quantize_{q4,q5,q6}_K. xb: [nsb, 256] float32 -> uint8 [nsb, bytes].

    lib: a load() result (default: library()).
    """
    lib = lib or library()
    if lib is None:
        raise BadInput("the C quantizers are not available (no C compiler or the build failed)")
    if name not in ENTRIES:
        raise BadInput(f"no C quantizer for {name} (have {', '.join(ENTRIES)})")
    if xb.dtype != np.float32 or xb.ndim != 2 or xb.shape[1] != 256:
        raise BadInput(f"quantize_k: expected float32 [nsb, 256], got {xb.dtype} {list(xb.shape)}")
    xb = np.ascontiguousarray(xb)
    entry, nbytes = ENTRIES[name]
    out = np.empty((xb.shape[0], nbytes), dtype=np.uint8)
    getattr(lib, entry)(_ptr(xb, ctypes.c_float), _ptr(out, ctypes.c_uint8), xb.shape[0])
    return out


def f32_to_f16_bits(x: np.ndarray, lib: ctypes.CDLL | None = None) -> np.ndarray:
    """The C fp32 -> fp16 conversion (for tests): float32 [n] -> uint16 [n]."""
    lib = lib or library()
    if lib is None:
        raise BadInput("the C quantizers are not available (no C compiler or the build failed)")
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.shape, dtype=np.uint16)
    lib.minfer_f32_to_f16(_ptr(x, ctypes.c_float), _ptr(out, ctypes.c_uint16), x.size)
    return out
