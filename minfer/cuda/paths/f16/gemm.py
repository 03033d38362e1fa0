"""f16 tensor-core GEMM launcher (kernels/gemm_f16.cu) and its numpy twin.

    C[M, N] = A[M, K] @ B[N, K]^T      A: f16 activations, B: f16 weights as GGUF stores them
                                       (row-major [N, K], "NT"), f32 accumulate.
Epilogues: out f32 (mode 0), out f16 (mode 1), accumulate into an existing f32 [M, N] buffer
(mode 2, C += A @ B^T: residual adds of attn_output / ffn_down), glu (mode 3: B is a gate|up
weight [2F, K] with its rows interleaved per 16, glu_rows; out f16 [M, F] = silu(gate) * up,
rounded as the swiglu layer; mode 5 with gemma's GELU, as the geglu layer), or rope (mode 4: B
is the fused q|k|v weight; the product goes roped into q16 and the KV cache,
minfer.cuda.ops.layers.QkvRope, bit for bit as rope_qkv does the f32 product). Modes 3, 4 and
5 at M == 1 take the smallest tile kernel (EPILOGUE_TILE), not the GEMV.

Kernels: gemm_f16.cu (mma.sync tiles, any sm_80+; the M == 1 GEMV) and gemm_f16_sm90a.cu
(Hopper only, built for sm_90a: cp.async-fed wgmma tiles, and the TMA-fed warp-specialized
persistent kernels, whose operands travel as tensor maps made by minfer.cuda.runtime.tma with 48
bytes of parameter padding before them, TMA_PARAM_PAD). Geometry is owned here:
`pick_variant(M, N, K, sm_count, arch)` is the one function choosing the kernel; kernels never
choose. Contract: K % 8 == 0 (16-byte rows), M, N any size >= 1; every operand a GPUArray
(minfer.cuda.runtime.devarray, as for every launcher), contiguous and 16-byte aligned. A
problem-shape violation raises minfer.errors.BadInput (the numpy twin shares those checks); an operand that is
not such a device array raises GPUError (devarray.check, as in the other launchers); both with
one line. Importing this module needs no GPU (the twin, the tile table and validation are pure
Python); launching does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.tma import TMA_PARAM_PAD, tmap_f16_2d
from minfer.errors import BadInput
from minfer.quants.glu import glu_act  # the glu modes' activations (the blk kernel's too)

MODE_F32, MODE_F16, MODE_ACC, MODE_GLU, MODE_ROPE, MODE_GEGLU = 0, 1, 2, 3, 4, 5
# glu or rope at M == 1 (the GEMV has neither epilogue)
EPILOGUE_TILE = GLU_TILE = "gemm_f16_nt_32x64x64_w1x4_s4"
# wgmma_f16_tma_*: the tensor maps go first, after TMA_PARAM_PAD (minfer.cuda.runtime.tma);
# TMA_MAGIC (the last argument) traps a launch whose layout does not match.
TMA_MAGIC = 0x544D4131


@dataclass(frozen=True)
class Tile:
    """One tensor-core tile entry of gemm_f16.cu (mirrors its GEMM_ENTRY line)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    file = "gemm_f16"
    options = ()

    @property
    def entry(self) -> str:
        return (
            f"gemm_f16_nt_{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}"
            f"_s{self.stages}"
        )

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def smem(self) -> int:  # dynamic shared memory, bytes
        return self.stages * (self.bm + self.bn) * self.bk * 2

    def grid(self, M: int, N: int, sm_count: int = 132) -> int:  # one block per tile
        return -(-M // self.bm) * -(-N // self.bn)


@dataclass(frozen=True)
class Gemv:
    """One M == 1 GEMV entry: 8 warps per block, `rows` output columns per warp."""

    rows: int
    file = "gemm_f16"
    options = ()
    threads = 256
    smem = 0

    @property
    def entry(self) -> str:
        return f"gemv_f16_r{self.rows}"

    def grid(self, M: int, N: int, sm_count: int = 132) -> int:
        return -(-N // (8 * self.rows))


@dataclass(frozen=True)
class WgmmaTile:
    """One Hopper wgmma entry of gemm_f16_sm90a.cu (built for sm_90a, picked on sm_90 only)."""

    bm: int
    bn: int
    stages: int
    bk = 64
    file = "gemm_f16_sm90a"
    options = ("-arch=sm_90a",)  # last -arch wins in nvcc: wgmma needs the sm_90a target

    @property
    def entry(self) -> str:
        return f"wgmma_f16_nt_{self.bm}x{self.bn}x64_s{self.stages}"

    @property
    def threads(self) -> int:
        return self.bm * 2  # bm / 64 warpgroups

    @property
    def smem(self) -> int:  # stages of [bm + bn, 64] f16 tiles + 1 KB for manual alignment
        return self.stages * (self.bm + self.bn) * 128 + 1024

    def grid(self, M: int, N: int, sm_count: int = 132) -> int:  # one block per tile
        return -(-M // self.bm) * -(-N // self.bn)


@dataclass(frozen=True)
class TmaTile:
    """One TMA entry of gemm_f16_sm90a.cu (wgmma_f16_tma_*, sm_90 only): warp-specialized and
    persistent, a producer warpgroup issuing TMA boxes from tensor maps and two consumer
    warpgroups of 64 rows; at most one block per SM, each walking the 128 x bn tiles in a stride
    of the grid."""

    bn: int
    stages: int
    bm = 128
    bk = 64
    threads = 384
    file = "gemm_f16_sm90a"
    options = ("-arch=sm_90a",)

    @property
    def entry(self) -> str:
        return f"wgmma_f16_tma_128x{self.bn}x64_s{self.stages}"

    @property
    def smem(self) -> int:  # stages of [128 + bn, 64] f16, 2 mbarriers a stage, 1 KB alignment
        return self.stages * (128 + self.bn) * 128 + 16 * self.stages + 1024

    def tiles(self, M: int, N: int) -> int:
        return -(-M // 128) * -(-N // self.bn)

    def grid(self, M: int, N: int, sm_count: int = 132) -> int:
        return min(self.tiles(M, N), sm_count)


# Every compiled variant, by entry name (constant table: the .cu's entry list, pinned by a test).
# (only entries pick_variant reaches: a tile it never picks is not compiled)
TILES = {
    t.entry: t
    for t in (
        Tile(128, 128, 64, 2, 2, 3),
        Tile(64, 128, 32, 2, 2, 4),
        Tile(64, 64, 64, 2, 2, 4),
        Tile(32, 64, 64, 1, 4, 4),
    )
}
GEMVS = {g.entry: g for g in (Gemv(4), Gemv(1))}
WGMMA = {
    t.entry: t
    for t in (
        WgmmaTile(128, 256, 3),
        WgmmaTile(128, 128, 4),
        WgmmaTile(64, 128, 4),
        WgmmaTile(64, 64, 4),
    )
}
TMA = {t.entry: t for t in (TmaTile(256, 4), TmaTile(192, 5), TmaTile(128, 6))}
# each TMA tile's speed per tile against 128 x 256's, measured on the H200 at M = 2048
TMA_TILE_SPEED = {256: 1.0, 192: 0.975, 128: 0.95}
VARIANTS = {**TILES, **GEMVS, **WGMMA, **TMA}


def pick_variant(M: int, N: int, K: int, sm_count: int = 132, arch: str = "sm_90") -> str:
    """The kernel entry for an (M, N, K) problem: the one place a GEMM variant is chosen.

    Measured on the H200 (docs/perf.md): M == 1: GEMV, 4 rows per warp only when N gives
    enough warps. M <= 64: the 32x64 mma.sync tile (B-bandwidth bound; beats wgmma there).
    sm_90: the TMA kernels (1.03-1.48x the cp.async wgmma ones at the 8B shapes) when their
    128 x 128 tiles fill ~3/4 of the SMs (_pick_tma), else the cp.async wgmma tiles (1.3-1.6x
    the mma.sync ones). Those and other archs' mma.sync tiles: the largest tile whose grid
    still covers ~3/4 of the SMs (a 128x128 tile at 128 blocks beats 64x128 at 256; at 32
    blocks it loses 2x to 64x64).
    """
    if M == 1:
        return "gemv_f16_r4" if N >= 64 * sm_count else "gemv_f16_r1"
    if M <= 64:
        return "gemm_f16_nt_32x64x64_w1x4_s4"
    fill = 0.75 * sm_count
    if arch == "sm_90":
        tma = _pick_tma(M, N, sm_count)
        if tma is not None:
            return tma
        for entry in (
            "wgmma_f16_nt_128x256x64_s3",
            "wgmma_f16_nt_128x128x64_s4",
            "wgmma_f16_nt_64x128x64_s4",
        ):
            if WGMMA[entry].grid(M, N) >= fill:
                return entry
        return "wgmma_f16_nt_64x64x64_s4"
    for entry in ("gemm_f16_nt_128x128x64_w2x2_s3", "gemm_f16_nt_64x128x32_w2x2_s4"):
        if TILES[entry].grid(M, N) >= fill:
            return entry
    return "gemm_f16_nt_64x64x64_w2x2_s4"


def rope_epilogue_pays(M: int, N: int, sm_count: int = 132, arch: str = "sm_90") -> bool:
    """Whether a qkv GEMM of M rows and N columns should rope in its epilogue (mode 4) rather
    than write f32 for a rope_qkv launch: where its tiles fit one wave. Measured on the H200,
    8B qkv: M = 512 (128 tiles of 128 x 192) 45.4 against 47.3 µs for
    GEMM + rope launch (1.04x); M = 2048 (384 tiles of 128 x 256, 3 waves) 171.4 against 167.3
    (0.98x): with more tiles than SMs, mode 0's stores drain under the next tile's mainloop,
    while the rope epilogue's table loads hold the consumers."""
    if M <= 1:
        return False  # the GEMV takes f32 out and the rope launch (EPILOGUE_TILE is slower)
    kern = VARIANTS[pick_variant(M, N, 8, sm_count, arch)]  # (the pick does not read K)
    tiles = kern.tiles(M, N) if isinstance(kern, TmaTile) else kern.grid(M, N, sm_count)
    return tiles <= sm_count


def _wave_fill(tiles: int, sm_count: int) -> float:
    """The busy fraction of a persistent grid's SMs over its waves of tiles."""
    return tiles / (-(-tiles // sm_count) * sm_count)


def _pick_tma(M: int, N: int, sm_count: int) -> str | None:
    """The TMA tile for an sm_90 problem, or None when 128 x 128 tiles would not fill ~3/4 of
    the SMs: the widest of the best busy fraction of the waves times the tile's own speed
    (TMA_TILE_SPEED). M = 512: gate|up's 896 narrow tiles fill 97% of 7 waves where its 448
    wide ones fill 85% of 4; qkv (N = 6144) fills 97% with 128 tiles of 128 x 192 against 73%
    with 96 of 128 x 256; o and down (N = 4096) take 128 x 128 (128 tiles)."""
    if TMA["wgmma_f16_tma_128x128x64_s6"].tiles(M, N) < 0.75 * sm_count:
        return None
    best = max(
        TMA.values(),
        key=lambda t: (round(_wave_fill(t.tiles(M, N), sm_count) * TMA_TILE_SPEED[t.bn], 6), t.bn),
    )
    return best.entry


# ---- numpy twin -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeRef:
    """The numpy twin's rope target: q, k widths (qd = Hq D, kd = Hkv D), head_dim, rope_dim,
    the rope base and pos0 (the device version's QkvRope holds tables and caches instead)."""

    qd: int
    kd: int
    head_dim: int
    rope_dim: int
    base: float
    pos0: int = 0


def gemm_f16_nt_ref(
    a: np.ndarray,
    b: np.ndarray,
    out_dtype=np.float32,
    accumulate: np.ndarray | None = None,
    glu: bool | str = False,
    rope: RopeRef | None = None,
):
    """(a.f32 @ b.f32.T) -> out_dtype; with `accumulate` (f32 [M, N]): accumulate + a @ b.T;
    with `glu` (b interleaved per glu_rows; True or "silu", "gelu": quants.glu.glu_act): f16
    act(gate) * up [M, N / 2], each op in f32 (ops.swiglu / ops.geglu);
    with `rope` (b the fused q|k|v weight): f16 (q [M, qd], k [M, kd], v [M, kd]), q and k
    roped in adjacent pairs at positions pos0 .. pos0 + M - 1 (what the device writes to q16
    and the KV cache rows).

    a: f16 [M, K], b: f16 [N, K]. Returns a new array (the device version writes in place).
    """
    M, N, K = _check_shapes(a.shape, b.shape, a.dtype, b.dtype)
    out_dtype, act = _check_out(out_dtype, accumulate, M, N, glu)
    c = a.astype(np.float32) @ b.astype(np.float32).T
    if rope is not None:
        from minfer.reference.ops import rope as rope_op

        if N != rope.qd + 2 * rope.kd:
            raise BadInput(
                f"gemm_f16_nt: rope needs N = qd + 2 kd = {rope.qd + 2 * rope.kd}, got N={N}"
            )
        pos = np.arange(rope.pos0, rope.pos0 + M)
        D = rope.head_dim

        def roped(x):  # [M, H*D] f32 -> f16, adjacent pairs (non-neox)
            y = rope_op(x.reshape(M, -1, D), pos, rope.base, rope.rope_dim, False)
            return y.reshape(M, -1).astype(np.float16)

        q, k = c[:, : rope.qd], c[:, rope.qd : rope.qd + rope.kd]
        return roped(q), roped(k), c[:, rope.qd + rope.kd :].astype(np.float16)
    if act:
        from minfer.reference.ops import geglu, swiglu

        fn = geglu if act == "gelu" else swiglu
        c = c.reshape(M, N // 16, 2, 8)  # per 16 columns: 8 gate, then the same 8 features' up
        return fn(c[:, :, 0], c[:, :, 1]).astype(np.float16).reshape(M, N // 2)
    if accumulate is not None:
        return accumulate.astype(np.float32) + c
    return c.astype(out_dtype)


# ---- validation (pure Python: the same messages on every path) -------------------------------
def _check_shapes(ashape, bshape, adt, bdt) -> tuple[int, int, int]:
    if np.dtype(adt) != np.float16 or np.dtype(bdt) != np.float16:
        raise BadInput(
            f"gemm_f16_nt: A and B must be float16, got {np.dtype(adt)} and {np.dtype(bdt)}"
        )
    if len(ashape) != 2 or len(bshape) != 2:
        raise BadInput(
            f"gemm_f16_nt: A [M, K] and B [N, K] must be 2-D, got {tuple(ashape)} "
            f"and {tuple(bshape)}"
        )
    (M, K), (N, Kb) = ashape, bshape
    if K != Kb:
        raise BadInput(
            f"gemm_f16_nt: inner dimensions differ: A {tuple(ashape)} vs B "
            f"{tuple(bshape)} (B is [N, K])"
        )
    if M < 1 or N < 1 or K < 1:
        raise BadInput(f"gemm_f16_nt: empty problem M={M} N={N} K={K}")
    if K % 8:
        raise BadInput(f"gemm_f16_nt: K={K} must be a multiple of 8 (16-byte rows)")
    return int(M), int(N), int(K)


def _check_out(out_dtype, accumulate, M: int, N: int, glu: bool | str = False):
    """(out dtype, the glu epilogue's activation or None: quants.glu.glu_act), checked."""
    out_dtype = np.dtype(out_dtype)
    try:
        glu = glu_act(glu)
    except ValueError as e:
        raise BadInput(f"gemm_f16_nt: {e}") from None
    if glu:
        if accumulate is not None or out_dtype != np.float16:
            raise BadInput("gemm_f16_nt: glu writes float16 and does not accumulate")
        if N % 16:
            raise BadInput(
                f"gemm_f16_nt: glu needs a gate|up weight of N % 16 == 0 rows, got N={N}"
            )
    if out_dtype not in (np.float32, np.float16):
        raise BadInput(f"gemm_f16_nt: out_dtype must be float32 or float16, got {out_dtype}")
    if accumulate is not None:
        if out_dtype != np.float32 or np.dtype(accumulate.dtype) != np.float32:
            raise BadInput("gemm_f16_nt: accumulate needs a float32 buffer and out_dtype float32")
        if tuple(accumulate.shape) != (M, N):
            raise BadInput(
                f"gemm_f16_nt: accumulate buffer is {tuple(accumulate.shape)}, "
                f"expected [M, N] = ({M}, {N})"
            )
    return out_dtype, glu


# ---- device side ------------------------------------------------------------------------------
def gemm_f16_nt(
    a,
    b,
    out_dtype=np.float32,
    accumulate=None,
    *,
    out=None,
    rt=None,
    variant: str | None = None,
    stream=None,
    glu: bool | str = False,
    rope=None,
    hi: int | None = None,
):
    """C = A @ B^T on the GPU (same semantics as gemm_f16_nt_ref); returns C (a GPUArray).

    a: f16 [M, K], b: f16 [N, K] GPUArrays. With `accumulate` (f32 [M, N]) the product is added
    into it in place and it is returned. Otherwise the result goes to `out` (allocated if None).
    With `glu` (b interleaved per glu_rows, out_dtype float16; True or "silu", "gelu"): out f16
    [M, N / 2] = act(gate) * up. With `rope` (a minfer.cuda.ops.layers.QkvRope; b the fused
    q|k|v weight, N = qd + 2 kd): the product goes roped into its q16 and the KV cache rows of
    its device layout (hi: one past the layout's largest slot, for the bounds check; default M)
    and the QkvRope is returned. `variant` forces a kernel entry (tests, benchmarks); by default
    pick_variant chooses.
    """
    # 16-byte aligned for cp.async / vector loads; contiguous: the kernels take rows of K (A, B)
    # and N (C) elements
    for x, name in ((a, "A"), (b, "B"), (accumulate, "accumulate"), (out, "out")):
        if x is not None:
            da.check(f"gemm_f16_nt {name}", x, align=16, require_contiguous=True)
    M, N, K = _check_shapes(a.shape, b.shape, a.dtype, b.dtype)
    out_dtype, glu = _check_out(out_dtype, accumulate, M, N, glu)
    if rt is None:
        from minfer.cuda.runtime.runtime import get_runtime

        rt = get_runtime()
    if rope is not None:
        if glu or accumulate is not None or out is not None:
            raise BadInput(
                "gemm_f16_nt: rope writes q16 and the KV cache: no out, accumulate or glu"
            )
        rope.check(M, N, M if hi is None else hi)
    v = variant or pick_variant(M, N, K, rt.sm_count, rt.arch)
    if (glu or rope is not None) and v in GEMVS and variant is None:
        v = EPILOGUE_TILE
    kern = VARIANTS.get(v)
    if kern is None:
        raise BadInput(f"gemm_f16_nt: unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    if isinstance(kern, Gemv) and M != 1:
        raise BadInput(f"gemm_f16_nt: variant {v} handles M == 1 only (M={M})")
    if isinstance(kern, Gemv) and (glu or rope is not None):
        raise BadInput(f"gemm_f16_nt: variant {v} has no glu or rope epilogue (a tile kernel has)")
    if isinstance(kern, (WgmmaTile, TmaTile)) and rt.arch != "sm_90":
        raise BadInput(f"gemm_f16_nt: variant {v} needs an sm_90 GPU (this one is {rt.arch})")
    if rope is not None:  # C: the device RopeQkv struct (kernels/rope.cuh)
        c, mode = rope.dev, MODE_ROPE
    elif accumulate is not None:
        if out is not None:
            raise BadInput("gemm_f16_nt: pass either out or accumulate, not both")
        c, mode = accumulate, MODE_ACC
    else:
        No = N // 2 if glu else N
        if out is None:
            out = da.empty(rt, (M, No), out_dtype, "gemm output")  # cuMemAlloc: 256 B aligned
        elif tuple(out.shape) != (M, No) or np.dtype(out.dtype) != out_dtype:
            raise BadInput(
                f"gemm_f16_nt: out is {tuple(out.shape)} {np.dtype(out.dtype)}, "
                f"expected ({M}, {No}) {out_dtype}"
            )
        c, mode = (
            out,
            (
                MODE_GEGLU
                if glu == "gelu"
                else MODE_GLU
                if glu
                else MODE_F32
                if out_dtype == np.float32
                else MODE_F16
            ),
        )
    fn = rt.function(kern.file, kern.entry, options=kern.options, dyn_smem=kern.smem)
    i32 = np.int32
    if isinstance(kern, Gemv):
        args = (da.arg(a), da.arg(b), da.arg(c), i32(N), i32(K), i32(mode))
    elif isinstance(kern, TmaTile):  # the operands as tensor maps, by value
        args = (
            TMA_PARAM_PAD,
            tmap_f16_2d(da.ptr(a), M, K, 128),
            tmap_f16_2d(da.ptr(b), N, K, kern.bn),
            da.arg(c),
            i32(M),
            i32(N),
            i32(K),
            i32(mode),
            i32(TMA_MAGIC),
        )
    else:
        args = (da.arg(a), da.arg(b), da.arg(c), i32(M), i32(N), i32(K), i32(mode))
    rt.launch(
        fn, (kern.grid(M, N, rt.sm_count),), (kern.threads,), args, smem=kern.smem, stream=stream
    )
    return rope if rope is not None else c
