"""The block-scaled int8 path ("blk"): numpy twins of its operands and GEMM (kernels/mmq_blk.cu).

    y[M, N] = x[M, K] @ W[N, K].T  ~=  sum_b  sa[:, b] sw[:, b]^T * (qa_b @ qw_b^T)

Both operands are cut into blocks of 128 along K (the last one zero-padded), each block rotated
by the unnormalized 128-point Walsh-Hadamard transform (7 butterfly stages: x' = x H, H H^T =
128 I, so x'_b w'_b^T = 128 x_b w_b^T exactly in real arithmetic; zero padding keeps it exact),
then quantized symmetric, round to nearest, to int8: s = max|x'| / 127, q = rint(x' * (127 /
max|x'|)) (one division per block, a multiply per value, as the kernels), with one f32 scale
per (token, block) and per (weight row, pair of blocks: WPAIR). The rotation spreads a block's
outliers over its 128 values, so a shared per-128 scale keeps the small ones (QuaRot's
argument). The weight's scale carries the rotation's 1/128. A single scale per weight row
would save the kernel an FMUL per value and stage, but that grid is most of the path's KL
divergence on SmolLM2 and fails gate 6 (docs/perplexity.md; `per_row` here emulates it).

The GEMMs after an rmsnorm (token_scaled: attn_q, attn_k, attn_v, ffn_gate, ffn_up) take their
activations with one scale per token instead (the max over all its rotated blocks, the same
value in every block's slot): the kernel's fold then skips the FMUL of sa (mmq_blk_tok, sa
applied once at the end) and, the weight scale being shared by a pair of blocks, runs once per
256 of K; a small cost in accuracy (gate 6 still passes: docs/blk.md). attn_output's input
keeps a scale per block: attention writes a head's block at a time. (ffn_down runs on f16:
its swiglu input is most of the int8 grid's error.)

Operand, one block per (128-K block, 128-row tile), `BLK_OP` bytes: the tile's image as the
wgmma reads it (128 rows x 128 int8, 128-byte swizzle: the 16-byte chunk c of row r at
r * 128 + (c ^ (r % 8)) * 16), then the 128 rows' f32 scales; rows past the matrix are zero:
[KB, Rp / 128, BLK_OP] (KB = ceil(K / 128), Rp: rows padded to 128), tokens and weights alike.

The twins here and the kernels agree bit for bit on the operands (f32 butterflies in the same
order, IEEE division, rint): tests/gpu compare the bytes.
"""

from __future__ import annotations

import numpy as np

BK = 128  # K per block (and per kernel stage)
BLK_IMG = 128 * BK  # a tile's image
BLK_OP = BLK_IMG + 128 * 4  # + its rows' f32 scales
WPAIR = 2  # a weight row's consecutive blocks sharing one scale


# the GEMM inputs the rmsnorm makes: one activation scale per token (a weight name's kind; the
# MoE experts' gate|up too: minfer.cuda.paths.blk.moe)
TOKEN_SCALED = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "ffn_gate_exps", "ffn_up_exps")


def token_scaled(name: str) -> bool:
    """Whether the blk GEMM of weight `name` ('blk.3.ffn_up.weight') reads its activations with
    one scale per token (else one per (token, 128))."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in TOKEN_SCALED


def kblocks(K: int, block: int = BK) -> int:
    return -(-K // block)


def pad128(n: int) -> int:
    return -(-n // 128) * 128


def blk_shape(R: int, K: int) -> tuple[int, int, int]:
    """The uint8 array of an [R, K] operand (tokens or a weight): [KB, Rp / 128, BLK_OP]."""
    return kblocks(K), pad128(R) // 128, BLK_OP


def blk_bytes(R: int, K: int) -> int:
    """Device bytes of an [R, K] operand (tokens or a weight)."""
    return int(np.prod(blk_shape(R, K)))


def fwht128(x: np.ndarray, block: int = BK) -> np.ndarray:
    """The unnormalized Walsh-Hadamard transform of each 128 (`block`, a power of 2) values
    along the last axis, in f32, stage by stage (h = 1, 2, ..., 64: (a, b) at (i, i + h) ->
    (a + b, a - b)), as the kernels."""
    y = np.asarray(x, np.float32).copy()
    shape = y.shape
    h = 1
    while h < block:
        v = y.reshape(-1, block // (2 * h), 2, h)
        a, b = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :] = a + b
        v[:, :, 1, :] = a - b
        y = v.reshape(shape)
        h *= 2
    return y


def _rotated(x: np.ndarray, block: int = BK) -> np.ndarray:
    """x [R, K] (its f16 values: the kernels read f16) -> f32 [R, KB, block] rotated blocks."""
    x = np.asarray(x, np.float16).astype(np.float32)
    R, K = x.shape
    KB = kblocks(K, block)
    xp = np.zeros((R, KB * block), np.float32)
    xp[:, :K] = x
    return fwht128(xp.reshape(R, KB, block), block)


def quantize_blk(
    x: np.ndarray,
    weight: bool = False,
    block: int = BK,
    per_row: bool = False,
    per_token: bool = False,
    pair: int = WPAIR,
) -> tuple[np.ndarray, np.ndarray]:
    """x [R, K] -> (q int8 [R, KB * block], s f32 [R, KB]): the rotated blocks' values and
    their scales; weight: the scales times 1 / block (the rotation's; 1/128 in the kernel).
    block: 128 (the kernel); 256 only for the CPU emulation's experiment (`--emulate blk256`).
    per_row (with weight; the CPU emulation of a rejected design): one scale per row, s [R].
    per_token (activations): one scale per row over all its blocks, s [R, KB] with equal columns
    (the operand stores it in every block). A weight (block 128) has one scale per (row, `pair`
    blocks: WPAIR), stored in each block's slot (the last group of a KB not a multiple of `pair`
    shorter); pair=1: one per (row, block), the grid before the pairs (experiments)."""
    y = _rotated(x, block)
    R, KB = y.shape[:2]
    per_row = per_row and weight
    if per_row:
        amax = np.abs(y).max(axis=(1, 2))
    else:  # one scale per group of g consecutive blocks, in each block's slot
        g = (pair if block == BK else 1) if weight else (KB if per_token else 1)
        bmax = np.zeros((R, -(-KB // g) * g), np.float32)
        bmax[:, :KB] = np.abs(y).max(axis=-1)
        amax = np.repeat(bmax.reshape(R, -1, g).max(axis=-1), g, axis=1)[:, :KB]
    s = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    if per_row:
        q = np.clip(np.rint(y * inv[:, None, None]), -127, 127).astype(np.int8)
        return q.reshape(R, KB * block), (s * np.float32(1 / block)).astype(np.float32)
    q = np.clip(np.rint(y * inv[..., None]), -127, 127).astype(np.int8).reshape(R, KB * block)
    return q, (s * np.float32(1 / block) if weight else s).astype(np.float32)


def _swizzle(x: np.ndarray) -> np.ndarray:
    """[..., 128 rows, 8 chunks, 16] -> position p holds chunk p ^ (r % 8) (an involution)."""
    p = np.arange(8)[None, :] ^ (np.arange(128)[:, None] & 7)
    idx = np.broadcast_to(p[..., None], (128, 8, 16))
    return np.take_along_axis(x, np.broadcast_to(idx, x.shape), axis=-2)


def _images(q: np.ndarray, Rp: int) -> np.ndarray:
    """q int8 [R, KB*128] -> uint8 [KB, Rp/128, BLK_IMG], the tiles' swizzled images."""
    R, KB = q.shape[0], q.shape[1] // BK
    qp = np.zeros((Rp, KB * BK), np.int8)
    qp[:R] = q
    img = qp.view(np.uint8).reshape(Rp // 128, 128, KB, 8, 16).transpose(2, 0, 1, 3, 4)
    return _swizzle(img).reshape(KB, Rp // 128, BLK_IMG)


def blk_operand(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """(q int8 [R, KB*128], s f32 [R, KB]) -> uint8 [KB, Rp/128, BLK_OP], the kernel's blocks."""
    R, KB = s.shape
    Rp = pad128(R)
    img = _images(q, Rp)
    sp = np.zeros((Rp, KB), np.float32)
    sp[:R] = s
    tab = np.ascontiguousarray(sp.T.reshape(KB, Rp // 128, 128)).view(np.uint8)
    return np.ascontiguousarray(np.concatenate([img, tab], axis=-1))


def blk_unoperand(op: np.ndarray, R: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of blk_operand: -> (q int8 [R, KB*128], s f32 [R, KB])."""
    KB, T = op.shape[:2]
    img = np.asarray(op[..., :BLK_IMG], np.uint8).reshape(KB, T, 128, 8, 16)
    q = _swizzle(img).transpose(1, 2, 0, 3, 4).reshape(T * 128, KB * BK)[:R].view(np.int8)
    s = np.ascontiguousarray(op[..., BLK_IMG:]).view(np.float32).reshape(KB, T * 128).T[:R]
    return q, np.ascontiguousarray(s)


def blk_gemm(qa: np.ndarray, sa: np.ndarray, qw: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """The kernel's math in float64: sum over blocks of sa_b sw_b^T * (qa_b @ qw_b^T) (exact
    int sums) -> [M, N]; sa [M, KB], sw [N, KB]."""
    M, KB = sa.shape
    y = np.zeros((M, sw.shape[0]), np.float64)
    for b in range(KB):
        S = (
            qa[:, b * BK : (b + 1) * BK].astype(np.int64)
            @ qw[:, b * BK : (b + 1) * BK].astype(np.int64).T
        )
        y += S.astype(np.float64) * (
            sa[:, b, None].astype(np.float64) * sw[None, :, b].astype(np.float64)
        )
    return y


def blk_linear_ref(x: np.ndarray, w: np.ndarray, per_token: bool = False) -> np.ndarray:
    """The blk path's oracle: x [M, K] (its f16 values), w f32/f16 [N, K] (the dequantized
    weight, f16 as the GPU holds it) -> float64 [M, N]; per_token: x's operand as
    quantize_blk's."""
    qa, sa = quantize_blk(x, per_token=per_token)
    qw, sw = quantize_blk(w, weight=True)
    return blk_gemm(qa, sa, qw, sw)


def blk_grid(
    x: np.ndarray,
    weight: bool = False,
    block: int = BK,
    per_row: bool = False,
    per_token: bool = False,
    pair: int = WPAIR,
) -> np.ndarray:
    """x [R, K] -> f32 [R, K]: the values the blk path sees, rotated back (x_hat = q s H / 128;
    weight: the weight grid), so that x_hat @ w_hat.T equals blk_gemm up to f32 rounding: how
    the CPU reference emulates the path. block, per_row, per_token, pair: as quantize_blk."""
    x = np.asarray(x)
    R, K = x.shape
    q, s = quantize_blk(
        x, weight=weight, block=block, per_row=per_row, per_token=per_token, pair=pair
    )
    KB = kblocks(K, block)
    if weight:
        s = s * np.float32(block)
    s = s[:, None, None] if s.ndim == 1 else s[..., None]
    y = q.reshape(R, KB, block).astype(np.float32) * s
    back = fwht128(y, block) / np.float32(block)  # H^T = H, H H = block I
    return np.ascontiguousarray(back.reshape(R, KB * block)[:, :K])


class BlkGrid:
    """The blk path's grid on the CPU reference (ReferenceBackend(grids=...)): the weight
    requantized and the activation rounded through its rotated int8 grids (blk_grid), one
    activation scale per token on the GEMMs after an rmsnorm (token_scaled, as the kernel).
    block: the rotation and activation scale block (128: the kernel; 256: an experiment)."""

    def __init__(self, block: int = BK):
        self.block = block
        self.name = "blk" if block == BK else f"blk{block}"

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return blk_grid(w.reshape(w.shape[0], -1), weight=True, block=self.block)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        y = blk_grid(x.reshape(-1, x.shape[-1]), block=self.block, per_token=token_scaled(name))
        return y.reshape(x.shape)


__all__ = [
    "BlkGrid",
    "BK",
    "BLK_IMG",
    "BLK_OP",
    "WPAIR",
    "TOKEN_SCALED",
    "token_scaled",
    "kblocks",
    "pad128",
    "blk_bytes",
    "fwht128",
    "quantize_blk",
    "blk_operand",
    "blk_unoperand",
    "blk_gemm",
    "blk_linear_ref",
    "blk_grid",
]
