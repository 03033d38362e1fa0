"""f16 tensor-core GEMM launcher (kernels/gemm_f16.cu) and its numpy twin.

    C[M, N] = A[M, K] @ B[N, K]^T      A: f16 activations, B: f16 weights as GGUF stores them
                                       (row-major [N, K], "NT"), f32 accumulate.
Epilogues: out f32 (mode 0), out f16 (mode 1), or accumulate into an existing f32 [M, N] buffer
(mode 2, C += A @ B^T: residual adds of attn_output / ffn_down).

Geometry is owned here: `pick_variant(M, N, K, sm_count)` is the one function choosing the
kernel (tile GEMM or the M == 1 GEMV); kernels never choose. Contract: K % 8 == 0 (16-byte rows),
every buffer 16-byte aligned and contiguous; M, N any size >= 1. Violations raise
minfer.errors.BadInput with one line. Importing this module needs no GPU (the twin, the tile
table and validation are pure Python); launching does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.errors import BadInput

KERNEL = "gemm_f16"
MODE_F32, MODE_F16, MODE_ACC = 0, 1, 2


@dataclass(frozen=True)
class Tile:
    """One tensor-core tile entry of gemm_f16.cu (mirrors its GEMM_ENTRY line)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def entry(self) -> str:
        return (f"gemm_f16_nt_{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}"
                f"_s{self.stages}")

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def smem(self) -> int:  # dynamic shared memory, bytes
        return self.stages * (self.bm + self.bn) * self.bk * 2

    def grid(self, M: int, N: int) -> int:
        return -(-M // self.bm) * -(-N // self.bn)


@dataclass(frozen=True)
class Gemv:
    """One M == 1 GEMV entry: 8 warps per block, `rows` output columns per warp."""

    rows: int

    @property
    def entry(self) -> str:
        return f"gemv_f16_r{self.rows}"

    threads = 256
    smem = 0

    def grid(self, M: int, N: int) -> int:
        return -(-N // (8 * self.rows))


# Every compiled variant, by entry name (constant table: the .cu's entry list, pinned by a test).
TILES = {t.entry: t for t in (
    Tile(128, 256, 32, 2, 4, 4), Tile(128, 256, 64, 2, 4, 3),
    Tile(128, 128, 32, 2, 2, 4), Tile(128, 128, 64, 2, 2, 3),
    Tile(128, 128, 32, 2, 4, 4), Tile(128, 128, 64, 2, 4, 3),
    Tile(64, 128, 32, 2, 2, 4), Tile(64, 64, 64, 2, 2, 4),
    Tile(32, 64, 64, 1, 4, 4), Tile(16, 64, 64, 1, 4, 4),
)}
GEMVS = {g.entry: g for g in (Gemv(4), Gemv(2), Gemv(1))}
VARIANTS = {**TILES, **GEMVS}


def pick_variant(M: int, N: int, K: int, sm_count: int = 132) -> str:
    """The kernel entry for an (M, N, K) problem: the one place a GEMM variant is chosen.

    M == 1: GEMV (memory bound: as many warps streaming B as the rows allow). Otherwise the
    largest tile that still gives about one full wave of blocks on the SMs; small M uses
    short tiles so that B is read once by enough blocks.
    """
    if M == 1:
        return "gemv_f16_r4" if N >= 64 * sm_count else (
            "gemv_f16_r2" if N >= 16 * sm_count else "gemv_f16_r1")
    if M <= 16:
        return "gemm_f16_nt_16x64x64_w1x4_s4"
    if M <= 32:
        return "gemm_f16_nt_32x64x64_w1x4_s4"
    # larger tiles while they still fill the machine (blocks per SM: 1 for 128x256, 2 for 128x128)
    for entry, per_sm in (("gemm_f16_nt_128x256x32_w2x4_s4", 1),
                          ("gemm_f16_nt_128x128x32_w2x4_s4", 2),
                          ("gemm_f16_nt_64x128x32_w2x2_s4", 3)):
        if TILES[entry].grid(M, N) >= per_sm * sm_count * 0.9:
            return entry
    return "gemm_f16_nt_64x64x64_w2x2_s4"


# ---- numpy twin -------------------------------------------------------------------------------
def gemm_f16_nt_ref(a: np.ndarray, b: np.ndarray, out_dtype=np.float32,
                    accumulate: np.ndarray | None = None) -> np.ndarray:
    """(a.f32 @ b.f32.T) -> out_dtype; with `accumulate` (f32 [M, N]): accumulate + a @ b.T.

    a: f16 [M, K], b: f16 [N, K]. Returns a new array (the device version writes in place).
    """
    M, N, K = _check_shapes(a.shape, b.shape, a.dtype, b.dtype)
    out_dtype = _check_out(out_dtype, accumulate, M, N)
    c = a.astype(np.float32) @ b.astype(np.float32).T
    if accumulate is not None:
        return accumulate.astype(np.float32) + c
    return c.astype(out_dtype)


# ---- validation (pure Python: the same messages on every path) -------------------------------
def _check_shapes(ashape, bshape, adt, bdt) -> tuple[int, int, int]:
    if np.dtype(adt) != np.float16 or np.dtype(bdt) != np.float16:
        raise BadInput(f"gemm_f16_nt: A and B must be float16, got {np.dtype(adt)} and "
                       f"{np.dtype(bdt)}")
    if len(ashape) != 2 or len(bshape) != 2:
        raise BadInput(f"gemm_f16_nt: A [M, K] and B [N, K] must be 2-D, got {tuple(ashape)} "
                       f"and {tuple(bshape)}")
    (M, K), (N, Kb) = ashape, bshape
    if K != Kb:
        raise BadInput(f"gemm_f16_nt: inner dimensions differ: A {tuple(ashape)} vs B "
                       f"{tuple(bshape)} (B is [N, K])")
    if M < 1 or N < 1 or K < 1:
        raise BadInput(f"gemm_f16_nt: empty problem M={M} N={N} K={K}")
    if K % 8:
        raise BadInput(f"gemm_f16_nt: K={K} must be a multiple of 8 (16-byte rows)")
    return int(M), int(N), int(K)


def _check_out(out_dtype, accumulate, M: int, N: int):
    out_dtype = np.dtype(out_dtype)
    if out_dtype not in (np.float32, np.float16):
        raise BadInput(f"gemm_f16_nt: out_dtype must be float32 or float16, got {out_dtype}")
    if accumulate is not None:
        if out_dtype != np.float32 or np.dtype(accumulate.dtype) != np.float32:
            raise BadInput("gemm_f16_nt: accumulate needs a float32 buffer and out_dtype float32")
        if tuple(accumulate.shape) != (M, N):
            raise BadInput(f"gemm_f16_nt: accumulate buffer is {tuple(accumulate.shape)}, "
                           f"expected [M, N] = ({M}, {N})")
    return out_dtype


# ---- device side ------------------------------------------------------------------------------
@dataclass
class DeviceArray:
    """A thin (pointer, shape, dtype) view of device memory; `buf` keeps an allocation alive."""

    ptr: int
    shape: tuple
    dtype: np.dtype
    buf: object = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    @classmethod
    def empty(cls, rt, shape, dtype, what="array") -> "DeviceArray":
        shape = tuple(int(s) for s in shape)
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = rt.alloc(n, what)
        return cls(int(buf), shape, np.dtype(dtype), buf)

    @classmethod
    def from_numpy(cls, rt, x: np.ndarray, what="array") -> "DeviceArray":
        x = np.ascontiguousarray(x)
        d = cls.empty(rt, x.shape, x.dtype, what)
        rt.drv.memcpy_htod(d.ptr, x)
        return d

    def to_numpy(self, rt) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        rt.drv.memcpy_dtoh(out, self.ptr)
        return out


def _aligned(x: DeviceArray, name: str) -> None:
    if int(x.ptr) % 16:
        raise BadInput(f"gemm_f16_nt: {name} must be 16-byte aligned (pointer {int(x.ptr):#x})")


def gemm_f16_nt(a: DeviceArray, b: DeviceArray, out_dtype=np.float32,
                accumulate: DeviceArray | None = None, *, out: DeviceArray | None = None,
                rt=None, variant: str | None = None, stream=None) -> DeviceArray:
    """C = A @ B^T on the GPU (same semantics as gemm_f16_nt_ref); returns C.

    a: f16 [M, K], b: f16 [N, K]. With `accumulate` (f32 [M, N]) the product is added into it
    in place and it is returned. Otherwise the result goes to `out` (allocated if None).
    `variant` forces a kernel entry (tests, benchmarks); by default pick_variant chooses.
    """
    M, N, K = _check_shapes(a.shape, b.shape, a.dtype, b.dtype)
    out_dtype = _check_out(out_dtype, accumulate, M, N)
    if rt is None:
        from minfer.cuda.runtime import get_runtime

        rt = get_runtime()
    if accumulate is not None:
        if out is not None:
            raise BadInput("gemm_f16_nt: pass either out or accumulate, not both")
        c, mode = accumulate, MODE_ACC
    else:
        if out is None:
            out = DeviceArray.empty(rt, (M, N), out_dtype, "gemm output")
        elif tuple(out.shape) != (M, N) or np.dtype(out.dtype) != out_dtype:
            raise BadInput(f"gemm_f16_nt: out is {tuple(out.shape)} {np.dtype(out.dtype)}, "
                           f"expected ({M}, {N}) {out_dtype}")
        c, mode = out, (MODE_F32 if out_dtype == np.float32 else MODE_F16)
    for x, name in ((a, "A"), (b, "B"), (c, "C")):
        _aligned(x, name)
    v = variant or pick_variant(M, N, K, rt.sm_count)
    kern = VARIANTS.get(v)
    if kern is None:
        raise BadInput(f"gemm_f16_nt: unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    if isinstance(kern, Gemv) and M != 1:
        raise BadInput(f"gemm_f16_nt: variant {v} handles M == 1 only (M={M})")
    fn = rt.function(KERNEL, kern.entry, dyn_smem=kern.smem)
    i32 = np.int32
    if isinstance(kern, Gemv):
        args = (np.uintp(a.ptr), np.uintp(b.ptr), np.uintp(c.ptr), i32(N), i32(K), i32(mode))
    else:
        args = (np.uintp(a.ptr), np.uintp(b.ptr), np.uintp(c.ptr), i32(M), i32(N), i32(K),
                i32(mode))
    rt.launch(fn, (kern.grid(M, N),), (kern.threads,), args, smem=kern.smem, stream=stream)
    return c
