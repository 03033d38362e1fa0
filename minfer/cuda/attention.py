"""Launcher for kernels/attention.cu: causal GQA flash attention over the f16 KV cache.

Numpy twin: minfer.reference.ops.attention(q, k, v, pos0). Prefill and decode (T = 1) use the
same kernel: a block covers 16 x warps (token, group-head) rows of one KV head (AttnGeometry),
so decode still fills G rows of a tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minfer.cuda import devarray as da
from minfer.errors import GPUError

PAD = 8  # ATT_PAD in attention.cu
HEAD_DIMS = (64, 128)
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
# T = 512 / 2048 against 27.4 / 219.6 for 4 x 64 (scripts/attn_device.py, docs/perf.md)
DEFAULT = AttnGeometry(warps=8, keys=128)
SMALL = AttnGeometry(warps=4, keys=64)   # where DEFAULT's smem is over the GPU's opt-in cap


def smem_bytes(head_dim: int, geom: AttnGeometry = DEFAULT) -> int:
    return STAGES * 2 * geom.keys * (head_dim + PAD) * 2  # STAGES x (K and V tiles), f16


def pick_geometry(rt, head_dim: int) -> AttnGeometry:
    """DEFAULT, or SMALL where DEFAULT's shared memory is over the GPU's opt-in cap (139 KB at
    head_dim 128: sm_86 / sm_89 allow 99 KB)."""
    return DEFAULT if smem_bytes(head_dim, DEFAULT) <= rt.smem_optin else SMALL


def attention(rt, o, q, kc, vc, pos0: int, pos_dev=None, offset: int = 0,
              geom: AttnGeometry | None = None) -> None:
    """o f16 [T, Hq, D] = causal softmax(q k^T / sqrt(D)) v.

    q: f16 [T, Hq, D] at positions pos0..pos0+T-1; kc, vc: f16 [S, Hkv, D] caches holding
    positions 0..pos0+T-1 (S >= pos0 + T; rows past that are never read).
    pos_dev: optional int32 [1] device array; the kernel then takes the first position as
    *pos_dev + offset, read on the device (CUDA-graph replay at any position). `pos0` must
    still be what that sum will be: the bounds are checked against it here.
    geom: the block shape (default: pick_geometry's).
    """
    da.check("attention q", q, (None, None, None), np.float16, align=16)
    T, Hq, D = q.shape
    da.check("attention k cache", kc, (None, None, D), np.float16, align=16)
    S, Hkv, _ = kc.shape
    da.check("attention v cache", vc, (S, Hkv, D), np.float16, align=16)
    da.check("attention out", o, (T, Hq, D), np.float16, align=4)
    if D not in HEAD_DIMS:
        raise GPUError(f"attention: head_dim {D} not supported (supported: {HEAD_DIMS})")
    if Hq % Hkv:
        raise GPUError(f"attention: {Hq} query heads not a multiple of {Hkv} KV heads")
    if pos0 < 0 or pos0 + T > S:
        raise GPUError(f"attention: positions [{pos0}, {pos0 + T}) exceed the cache's {S} rows")
    if pos_dev is not None:
        da.check("attention pos", pos_dev, (1,), np.int32)
    G = Hq // Hkv
    geom = pick_geometry(rt, D) if geom is None else geom
    smem = smem_bytes(D, geom)
    if smem > rt.smem_optin:
        raise GPUError(f"attention: {geom} needs {smem} B of shared memory, over this GPU's "
                       f"{rt.smem_optin}")
    fn = rt.function("attention", f"attn_fwd_d{D}", geom.options(), dyn_smem=smem)
    scale_log2 = np.float32(math.log2(math.e) / math.sqrt(D))
    # with pos_dev the kernel adds the device value to its pos0 argument (the offset)
    p_arg, p_ptr = (pos0, np.uintp(0)) if pos_dev is None else (offset, da.arg(pos_dev))
    rt.launch(fn, ((T * G + geom.rows - 1) // geom.rows, Hkv), (32 * geom.warps,),
              (da.arg(q), np.int64(Hq * D), da.arg(kc), da.arg(vc), da.arg(o),
               np.int64(Hq * D), np.int32(T), np.int32(Hq), np.int32(Hkv), np.int32(p_arg),
               p_ptr, scale_log2), smem=smem)
