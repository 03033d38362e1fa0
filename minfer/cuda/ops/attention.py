"""Launcher for the causal GQA flash attention over the f16 KV cache: kernels/attention.cu
(mma.sync, any GPU), kernels/attention_sm90a.cu (wgmma, Hopper prefill: persistent, K/V by TMA)
and kernels/attention_tok.cu (one token per block: decode steps); `pick_impl` chooses the
kernel, `wg_blocks` the wgmma kernel's grid.

Numpy twin: minfer.reference.ops.attention(q, k, v, pos0). In both kernels a block covers rows
of one KV head, a row being a (token, group-head) pair (attention.cu: 16 x warps rows, its
AttnGeometry; attention_sm90a.cu: 128), so decode (T = 1) still fills G rows of a tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.tma import TMA_PARAM_PAD, tmap_f16_2d
from minfer.errors import GPUError
from minfer.gguf.arch_keys import GPU_HEAD_DIMS as HEAD_DIMS  # the entries: 64, 96, 128, 256

PAD = 8  # ATT_PAD in attention.cu
STAGES = 2  # K/V tiles in flight (attention.cu's double buffer)


@dataclass(frozen=True)
class AttnGeometry:
    """The kernel's block shape (attention.cu ATT_WARPS / ATT_KEYS, passed as -D options):
    `warps` warps of 16 (token, group-head) rows, K/V tiles of `keys` keys."""

    warps: int
    keys: int

    @property
    def rows(self) -> int:
        return 16 * self.warps

    def options(self) -> tuple[str, ...]:
        return (f"-DATT_WARPS={self.warps}", f"-DATT_KEYS={self.keys}")


# 8 warps x 128-key tiles: on the H200 at the 8B shape (Hq 32, Hkv 8, D 128) 21.8 / 172.2 us at
# T = 512 / 2048 against 27.4 / 219.6 for 4 x 64 (interleaved, event-timed)
DEFAULT = AttnGeometry(warps=8, keys=128)
SMALL = AttnGeometry(warps=4, keys=64)  # where DEFAULT's smem is over the GPU's opt-in cap


WG_ROWS, WG_STAGES = 128, 3  # attention_sm90a.cu: 2 consumer warpgroups of 64 rows, 3 stages
WG_HEAD_DIMS = (64, 128)  # its entries (96 and 256 run attention.cu)
# H100, 32:8 heads, head_dim 128, interleaved (TFLOP/s at 2,048 / 8,192 / 16,384 / 32,768 tokens):
# one block per item on cp.async 354 / 495 / 517 / 520, persistent 380 / 515 / 528 / 537,
# persistent with TMA 391 / 598 / 618 / 612
WG_PERSISTENT = True  # wg_blocks' default: one block per SM walking the items
WG_TMA = True  # full K/V tiles by TMA (attn_wg_tma_d*), else cp.async
WG_TMA_MAGIC = 0x41545431  # attention_sm90a.cu ATT_WG_TMA_MAGIC


# the blk token operand the wgmma kernel's _blk epilogue writes: [Hq (128-K blocks of a
# head_dim-128 row), ceil(T / 128) row tiles, a tile's int8 image + its 128 f32 scales]. The
# layout is the blk path's (minfer.cuda.paths.blk.twin.blk_shape); ops sit below paths, so it
# is restated here and tests/test_attention_launcher_cpu.py pins the two together
OPERAND_TILE = 128 * 128 + 128 * 4


def operand_shape(T: int, Hq: int) -> tuple[int, int, int]:
    return (Hq, -(-T // 128), OPERAND_TILE)


def wg_smem_bytes(head_dim: int) -> int:
    """attention_sm90a.cu's AttnWgSmem: Q [128, D], WG_STAGES stages of K and V [128, D] (f16),
    4 + 2 WG_STAGES mbarriers, + 1 KB for the alignment."""
    return (WG_ROWS + 2 * WG_STAGES * 128) * head_dim * 2 + 8 * (4 + 2 * WG_STAGES) + 1024


def wg_items(T: int, G: int, Hkv: int) -> int:
    """The wgmma kernel's work items: 128-row blocks (a row = a (token, group head) pair) per
    KV head."""
    return -(-T * G // WG_ROWS) * Hkv


def wg_blocks(sm_count: int, T: int, G: int, Hkv: int, persistent: bool = WG_PERSISTENT) -> int:
    """The wgmma kernel's grid: persistent, one block per SM (its shared memory allows one)
    walking the items longest first, the next item's Q and K/V loading under the last one's
    tail; else one block per item."""
    n = wg_items(T, G, Hkv)
    return min(n, sm_count) if persistent else n


TOK_WARPS, TOK_G = 8, 4  # attention_tok.cu: threads of a block / query heads per block
TOK_ROWS_PER_SEQ = 2  # per_token_pays: at most this many tokens per sequence on average


def per_token_pays(tok: np.ndarray) -> bool:
    """Whether a chunk's layout (tok int32 [T, 2] of (slot, lo)) is a decode step's, where
    attention_tok.cu (one token per block, reading its own keys once) beats the tile kernels,
    whose 128-row blocks scan every key of every sequence they hold: at most TOK_ROWS_PER_SEQ
    tokens per sequence (sequence = distinct lo; a decode step's padding repeats a row)."""
    T = int(tok.shape[0])
    return T > 0 and T <= TOK_ROWS_PER_SEQ * len(np.unique(tok[:, 1]))


def pick_impl(rt, T: int, G: int, head_dim: int, per_token: bool = False) -> str:
    """ "tok" (attention_tok.cu) for a decode step's layout (per_token: per_token_pays);
    else "wg" (attention_sm90a.cu) for chunks of at least one 128-row block on sm_90, at its
    head dims, where its shared memory fits; "mma" (attention.cu) on other GPUs, for smaller
    chunks and for head_dim 96 / 256."""
    if per_token:
        return "tok"
    if (
        rt.arch == "sm_90"
        and T * G >= WG_ROWS
        and head_dim in WG_HEAD_DIMS
        and wg_smem_bytes(head_dim) <= rt.smem_optin
    ):
        return "wg"
    return "mma"


def operand_fuses(rt, T: int, G: int, head_dim: int, per_token: bool = False) -> bool:
    """Whether attention() can write the block path's token operand of o from its epilogue:
    the wgmma kernel (pick_impl "wg") at head_dim 128 (one head's row is one 128-K block)."""
    return head_dim == 128 and pick_impl(rt, T, G, head_dim, per_token) == "wg"


def smem_bytes(head_dim: int, geom: AttnGeometry = DEFAULT) -> int:
    return STAGES * 2 * geom.keys * (head_dim + PAD) * 2  # STAGES x (K and V tiles), f16


def pick_geometry(rt, head_dim: int) -> AttnGeometry:
    """DEFAULT, or SMALL where DEFAULT's shared memory is over the GPU's opt-in cap (139 KB at
    head_dim 128: sm_86 / sm_89 allow 99 KB) and at head_dim 256 (DEFAULT would need 270 KB
    and spill: 8 warps x 128 keys of scores beside a 256-wide O; SMALL holds it in 255
    registers, no spill)."""
    if head_dim > 128:
        return SMALL
    return DEFAULT if smem_bytes(head_dim, DEFAULT) <= rt.smem_optin else SMALL


def attention(
    rt,
    o,
    q,
    kc,
    vc,
    pos0: int,
    tok=None,
    hi: int | None = None,
    geom: AttnGeometry | None = None,
    impl: str | None = None,
    operand=None,
    o_out: bool = True,
    scale: float | None = None,
    window: int = 0,
    softcap: float = 0.0,
    build_opts: tuple = (),
    blocks: int | None = None,
    tma: bool | None = None,
) -> None:
    """o f16 [T, Hq, D] = causal softmax(q k^T * scale) v, scale 1 / sqrt(D) unless given.

    q: f16 [T, Hq, D] at positions pos0..pos0+T-1; kc, vc: f16 [S, Hkv, D] caches holding
    positions 0..pos0+T-1 (S >= pos0 + T; rows past that are never read).
    tok: optional int32 [T, 2] device array of (slot, lo) per token (the packed layout,
    minfer.cuda.ops.layers.tok_layout): token t sees keys lo..slot, read on the device (a
    CUDA graph serves every layout); pos0 is then ignored and `hi` (one past the largest slot,
    known to the host) is what the bounds are checked against. Numpy twin of the packed form:
    minfer.reference.ops.attention_packed.
    geom: attention.cu's block shape (default: pick_geometry's; giving one means that kernel).
    impl: "mma", "wg" or "tok" (default: pick_impl's for a prefill layout; the caller passes
    "tok" for a decode step's, per_token_pays).
    operand: uint8 [Hq, pad128(T) / 128, BLK_OP] receives the block path's token operand of o
    (operand_shape; blk twin's blk_operand of o's f16 values: what mmq_blk.blk_operand makes of o, bit for bit)
    from the epilogue, where operand_fuses (else GPUError); o_out False: o is not written
    (then operand is required).
    window > 0: a sliding-window layer's (keys with slot - key < window); softcap > 0: the
    scaled scores become softcap * tanh(score / softcap) (gemma2); both as the twin's
    (kernels/attention_common.cuh).
    build_opts: nvcc -D options of the wgmma kernel's timing builds (attention_sm90a.cu's
    header: -DATT_WG_NOLOAD, -DATT_WG_NOEXP; wrong results, scripts/attn_one.py).
    blocks: the wgmma kernel's grid (default wg_blocks'); any count from 1 up computes the same
    output, bit for bit (the items are independent; tests and A/B timing).
    tma: the wgmma kernel's K/V loads by TMA (default WG_TMA) or cp.async; the same bits.
    """
    da.check("attention q", q, (None, None, None), np.float16, align=16)
    T, Hq, D = q.shape
    da.check("attention k cache", kc, (None, None, D), np.float16, align=16)
    S, Hkv, _ = kc.shape
    da.check("attention v cache", vc, (S, Hkv, D), np.float16, align=16)
    da.check("attention out", o, (T, Hq, D), np.float16, align=4)
    if D not in HEAD_DIMS:
        raise GPUError(f"attention: head_dim {D} not supported (supported: {HEAD_DIMS})")
    if window < 0 or not softcap >= 0 or (scale is not None and not scale > 0):
        raise GPUError(
            f"attention: bad options (window {window}, softcap {softcap}, scale {scale})"
        )
    if Hq % Hkv:
        raise GPUError(f"attention: {Hq} query heads not a multiple of {Hkv} KV heads")
    if tok is not None:
        da.check("attention tok", tok, (T, 2), np.int32, align=8)
        if hi is None or not 0 < hi <= S:
            raise GPUError(
                f"attention: the layout's slots (below {hi}) exceed the cache's {S} rows"
            )
    elif pos0 < 0 or pos0 + T > S:
        raise GPUError(f"attention: positions [{pos0}, {pos0 + T}) exceed the cache's {S} rows")
    G = Hq // Hkv
    if impl is None:
        impl = "mma" if geom is not None else pick_impl(rt, T, G, D)
    extra = ()
    if operand is not None or not o_out:
        if operand is None or impl != "wg" or D != 128:
            raise GPUError(
                f"attention: the token operand from the epilogue needs the wgmma "
                f"kernel at head_dim 128 (kernel {impl}, head_dim {D})"
                if operand is not None
                else "attention: o_out False needs operand"
            )
        da.check("attention operand", operand, operand_shape(T, Hq), np.uint8, align=16)
        extra = (da.arg(operand), np.int32(-(-T // 128) * 128))
    if impl == "wg":
        if rt.arch != "sm_90" or D not in WG_HEAD_DIMS:
            raise GPUError(
                f"attention: the wgmma kernel needs sm_90 (this GPU is {rt.arch}) "
                f"and head_dim {' or '.join(map(str, WG_HEAD_DIMS))} (got {D})"
            )
        rows, threads, smem = WG_ROWS, 384, wg_smem_bytes(D)
        n_blocks = wg_blocks(rt.sm_count, T, G, Hkv) if blocks is None else int(blocks)
        if n_blocks < 1:
            raise GPUError(f"attention: blocks {blocks} (the wgmma kernel's grid) must be >= 1")
        tma = WG_TMA if tma is None else bool(tma)
        entry = f"attn_wg_tma_d{D}" if tma else f"attn_wg_d{D}" + ("_blk" if extra else "")
        fn = rt.function("attention_sm90a", entry, ("-arch=sm_90a", *build_opts), dyn_smem=smem)
    elif impl == "tok":
        rows, threads, smem = 1, 32 * TOK_WARPS, 0
        fn = rt.function("attention_tok", f"attn_tok_d{D}")
    elif impl == "mma":
        geom = pick_geometry(rt, D) if geom is None else geom
        rows, threads, smem = geom.rows, 32 * geom.warps, smem_bytes(D, geom)
        if smem > rt.smem_optin:
            raise GPUError(
                f"attention: {geom} needs {smem} B of shared memory, over this "
                f"GPU's {rt.smem_optin}"
            )
        fn = rt.function("attention", f"attn_fwd_d{D}", geom.options(), dyn_smem=smem)
    else:
        raise GPUError(f"attention: unknown kernel {impl!r} (mma, wg, tok)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    scale_log2 = np.float32(math.log2(math.e) * scale)
    cap_s = np.float32(softcap / scale if softcap > 0 else 0.0)  # attention_common.cuh
    p_arg, p_ptr = (pos0, np.uintp(0)) if tok is None else (0, da.arg(tok))
    grid = (
        (T, Hkv, -(-G // TOK_G))
        if impl == "tok"
        else (n_blocks,)
        if impl == "wg"
        else ((T * G + rows - 1) // rows, Hkv)
    )
    args = (
        da.arg(q),
        np.int64(Hq * D),
        da.arg(kc),
        da.arg(vc),
        da.arg(o) if o_out else np.uintp(0),
        np.int64(Hq * D),
        np.int32(T),
        np.int32(Hq),
        np.int32(Hkv),
        np.int32(p_arg),
        p_ptr,
        scale_log2,
        np.int32(window),
        cap_s,
    )
    if impl == "wg" and tma:  # the caches as [S, Hkv D] tensor maps, boxes of 128 keys
        maps = tuple(tmap_f16_2d(da.ptr(c), S, Hkv * D, WG_ROWS) for c in (kc, vc))
        args = (
            TMA_PARAM_PAD,
            *maps,
            *args,
            *(extra or (np.uintp(0), np.int32(0))),
            np.int32(WG_TMA_MAGIC),
        )
    else:
        args = (*args, *extra)
    rt.launch(fn, grid, (threads,), args, smem=smem)
