"""pycuda runtime: the primary context, module loading from cached cubins, checked launches.

One `Runtime` per process (made by `get_runtime()`), passed explicitly to launchers. It owns:
- the device and its primary context (retained, pushed; popped at exit);
- modules: kernels/<name>.cu compiled by build.compile_cubin for the device's arch, loaded once;
- `launch(...)`: every kernel launch goes through it; in debug mode (RuntimeConfig.debug or
  MINFER_CUDA_DEBUG=1) it synchronizes after each launch and names the kernel and geometry
  that failed;
- `poison(ptr, nbytes)`: in debug or poison mode (RuntimeConfig.poison, MINFER_CUDA_DEBUG=poison;
  `minfer check` turns it on) callers NaN-fill a kernel's output before its launch
  (devarray.poison), so a launch that did not run leaves NaN, never stale plausible numbers.
MINFER_CUDA_DEBUG: 1 (sync after every launch, poison, no CUDA graphs) or a comma list of
`poison` (NaN-fill only, graphs kept) and `nographs` (eager launches, debug_flags()).
Importing this module needs pycuda; everything that must work without a GPU lives elsewhere.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from dataclasses import dataclass, field

import numpy as np

from minfer.errors import GPUError


def debug_flags(env=None) -> set[str]:
    """MINFER_CUDA_DEBUG's values: "1" is {"sync", "poison", "nographs"}; else a comma list of
    sync, poison, nographs ("" / "0": none)."""
    v = (os.environ if env is None else env).get("MINFER_CUDA_DEBUG", "0").strip().lower()
    if v in ("", "0"):
        return set()
    if v == "1":
        return {"sync", "poison", "nographs"}
    flags = {f.strip() for f in v.split(",") if f.strip()}
    bad = flags - {"sync", "poison", "nographs"}
    if bad:
        from minfer.errors import BadInput

        raise BadInput(
            f"MINFER_CUDA_DEBUG={v!r}: expected 1 or a comma list of sync, poison, "
            f"nographs (not {', '.join(sorted(bad))})"
        )
    return flags


@dataclass
class RuntimeConfig:
    device: int = 0
    debug: bool = field(default_factory=lambda: "sync" in debug_flags())
    # NaN-fill outputs before their launches (also on in debug mode); unlike debug it keeps
    # CUDA graphs (the fills are captured with the launches)
    poison: bool = field(default_factory=lambda: "poison" in debug_flags())


# every byte 0xFF: 0xFFFF (f16) and 0xFFFFFFFF (f32) are NaNs, int32 -1 is no valid id or index
POISON_BYTE = 0xFF


def _import_pycuda():
    try:
        import pycuda.driver as drv
    except ImportError:
        raise GPUError(
            'pycuda is not installed (pip install -e ".[cuda]"); '
            "use --backend cpu to run without a GPU"
        ) from None
    return drv


class Runtime:
    def __init__(self, cfg: RuntimeConfig | None = None):
        self.cfg = cfg or RuntimeConfig()
        drv = _import_pycuda()
        self.drv = drv
        try:
            drv.init()
            n = drv.Device.count()
        except Exception as e:
            raise GPUError(
                f"CUDA driver unavailable ({e}); use --backend cpu to run without a GPU"
            ) from None
        if n == 0:
            raise GPUError("no CUDA GPU found; use --backend cpu to run without a GPU")
        if self.cfg.device >= n:
            raise GPUError(f"GPU {self.cfg.device} requested but only {n} present")
        self.device = drv.Device(self.cfg.device)
        self.ctx = self.device.retain_primary_context()
        self.ctx.push()
        atexit.register(self._close)
        cc = self.device.compute_capability()
        self.arch = f"sm_{cc[0]}{cc[1]}"
        A = drv.device_attribute
        self.sm_count = self.device.get_attribute(A.MULTIPROCESSOR_COUNT)
        self.smem_optin = self.device.get_attribute(A.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.name = self.device.name()
        self._modules: dict[tuple, object] = {}
        self._functions: dict[tuple, object] = {}
        self._workspaces: dict[str, tuple] = {}  # key -> (allocation, bytes): workspace()
        # launches with stream=None go here (None: the legacy default stream); CudaBackend
        # points it at its capture stream while recording a CUDA graph
        self.stream = None

    def _close(self) -> None:
        try:
            self.ctx.pop()
        except Exception:
            pass

    @contextlib.contextmanager
    def on_thread(self):
        """The context current on the calling thread while inside: pycuda's context stack is
        per thread, so work on a thread other than the one that made the runtime (Ray Data
        calls an actor's batches on another thread than its constructor; the server's engine
        thread) would find none and fail with "invalid device context". Pushed only where it
        is not current already, popped on the way out."""
        cur = self.drv.Context.get_current()
        if cur is not None and _handle(cur) == _handle(self.ctx):
            yield
            return
        self.ctx.push()
        try:
            yield
        finally:
            self.ctx.pop()

    # -- modules ----------------------------------------------------------------------------
    def module(self, name: str, options: tuple[str, ...] = ()):
        key = (name, options)
        mod = self._modules.get(key)
        if mod is None:
            from minfer.cuda.runtime.build import compile_cubin

            path, _ = compile_cubin(name, self.arch, options)
            try:
                mod = self.drv.module_from_file(str(path))
            except self.drv.Error as e:
                raise GPUError(f"loading kernels/{name}.cu for {self.arch} failed: {e}") from None
            self._modules[key] = mod
        return mod

    def function(self, name: str, entry: str, options: tuple[str, ...] = (), dyn_smem: int = 0):
        """The entry `entry` of kernels/<name>.cu; dyn_smem > 48 KB is opted in here."""
        key = (name, entry, options)
        fn = self._functions.get(key)
        if fn is None:
            fn = self.module(name, options).get_function(entry)
            fn._minfer_name = entry
            fn._minfer_smem = 0
            self._functions[key] = fn
        if dyn_smem > fn._minfer_smem:
            if dyn_smem > self.smem_optin:
                raise GPUError(
                    f"{entry}: {dyn_smem} B of dynamic shared memory exceeds the "
                    f"device's opt-in cap of {self.smem_optin} B"
                )
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dyn_smem)
            fn._minfer_smem = dyn_smem
        return fn

    # -- launches ---------------------------------------------------------------------------
    def launch(
        self, fn, grid: tuple, block: tuple, args: tuple, smem: int = 0, stream=None
    ) -> None:
        """Launch fn; args are device pointers (DeviceAllocation or int) and numpy scalars."""
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        if min(grid) <= 0:
            return  # empty problem: nothing to launch
        if stream is None:
            stream = self.stream
        try:
            fn(*args, grid=grid, block=block, shared=smem, stream=stream)
            if self.cfg.debug:
                self.drv.Context.synchronize()
        except self.drv.Error as e:
            raise GPUError(
                f"kernel {getattr(fn, '_minfer_name', fn)} failed "
                f"(grid {grid}, block {block}, smem {smem} B): {e}"
            ) from None

    @property
    def poisoning(self) -> bool:
        return bool(self.cfg.debug or self.cfg.poison)

    def poison(self, ptr: int, nbytes: int) -> None:
        """Fill [ptr, ptr + nbytes) with POISON_BYTE (NaN) when poisoning; queued on the launch
        stream, so it is ordered before the kernel that should overwrite it (and is recorded
        into a CUDA graph while capturing)."""
        if not self.poisoning or nbytes <= 0:
            return
        fill = getattr(self.drv, "memset_d8_async", None)
        step = 1 << 30  # pycuda passes the count as a 32-bit unsigned int
        try:
            for off in range(0, int(nbytes), step):
                n = min(step, int(nbytes) - off)
                if fill is not None:
                    fill(int(ptr) + off, POISON_BYTE, n, self.stream)
                else:  # older pycuda: synchronous fill (graphs are off in debug mode)
                    self.drv.memset_d8(int(ptr) + off, POISON_BYTE, n)
        except self.drv.Error as e:
            raise GPUError(f"poisoning {nbytes} B at 0x{int(ptr):x} failed: {e}") from None

    def synchronize(self) -> None:
        try:
            self.drv.Context.synchronize()
        except self.drv.Error as e:
            raise GPUError(f"GPU error at synchronize: {e}") from None

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes on the device."""
        return self.drv.mem_get_info()

    def workspace(self, key: str, nbytes: int, split: int | None = None):
        """A zero-filled device buffer of nbytes kept for the runtime's life, one per key (the
        first call allocates and zeroes it synchronously: make it outside CUDA-graph capture).
        split: return it as two pointers (buf, buf + split) instead of the allocation."""
        buf = self._workspaces.get(key)
        if buf is None or buf[1] < nbytes:
            mem = self.alloc(nbytes, key + " workspace")
            try:
                self.drv.memset_d8(int(mem), 0, int(nbytes))
            except self.drv.Error as e:
                raise GPUError(f"zeroing the {key} workspace failed: {e}") from None
            buf = self._workspaces[key] = (mem, int(nbytes))
        if split is None:
            return buf[0]
        return np.uintp(int(buf[0])), np.uintp(int(buf[0]) + int(split))

    def alloc(self, nbytes: int, what: str = "buffer"):
        try:
            return self.drv.mem_alloc(max(int(nbytes), 1))
        except self.drv.MemoryError:
            free, total = self.mem_info()
            raise GPUError(
                f"GPU out of memory allocating {what}: asked {nbytes / 2**20:.1f} "
                f"MiB, {free / 2**20:.1f} MiB free of {total / 2**20:.1f}"
            ) from None
        except self.drv.Error as e:  # e.g. a size the driver rejects outright
            free, total = self.mem_info()
            raise GPUError(
                f"GPU allocation of {what} failed ({e}): asked "
                f"{nbytes / 2**20:.1f} MiB, {free / 2**20:.1f} MiB free of "
                f"{total / 2**20:.1f}"
            ) from None


_RUNTIME: list[Runtime] = []


def _handle(ctx) -> int:
    return int(getattr(ctx, "handle", id(ctx)))


def get_runtime(cfg: RuntimeConfig | None = None) -> Runtime:
    """The process's Runtime (pycuda allows one primary context per device per process)."""
    if not _RUNTIME:
        _RUNTIME.append(Runtime(cfg))
    return _RUNTIME[0]


def gpu_available() -> bool:
    """True when pycuda imports and a GPU is present (for test skips)."""
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False
