"""DeviceBuffers: everything the forward writes, sized for `ubatch` tokens, plus the f16 KV
cache [max_tokens, Hkv, D] per layer and the rope table (alloc_buffers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.ops import layers as L
from minfer.cuda.runtime import devarray as da


@dataclass
class DeviceBuffers:
    """Activations for T = ubatch tokens (a chunk uses rows [0, T)), the KV cache, scratch."""
    x: object  # f32 [T, d_model] residual
    h16: object  # f16 [T, d_model] normed h
    qkv32: object  # f32 [T * (H + 2 Hkv) * D]: [T, Nq + 2 Nkv] fused, else three [T, N] parts
    q16: object  # f16 [T, H, D] roped q
    a16: object  # f16 [T, H * D] attention out
    gu32: object  # f32 [T * 2 d_ff]: [T, 2 d_ff] fused gate|up, else two [T, d_ff] parts
    #              (None when every layer's gate|up GEMM writes the swiglu: plan_glu)
    f16: object  # f16 [T, d_ff] SwiGLU out
    pos: object  # int32 [1]: the chunk's pos0, read on the device (graph replay at any pos)
    last16: object  # f16 [1, d_model] the last row, normed
    logits: object  # f32 [1, vocab]
    amax: object  # int32 [1] argmax of the logits
    ids: object  # int32 [T] token ids
    kc: list  # per layer f16 [max_tokens, Hkv, D]
    vc: list  # per layer f16 [max_tokens, Hkv, D]
    rope: object  # L.RopeTable for max_tokens positions
    q8: object  # uint8 [q8_bytes] q8_1 activation scratch (None without raw int8 routes)
    blkop: object = None  # uint8 [blk_bytes] blk token operand scratch (None without blk routes)


def alloc_buffers(rt, c, max_tokens: int, ubatch: int, q8_bytes: int,
                  glu_all: bool = False, blk_bytes: int = 0) -> DeviceBuffers:
    """c: the model config; q8_bytes: plan["q8_1 scratch"] (0: no MMQ route, no scratch);
    blk_bytes: plan["blk operand scratch"] (0: no blk route); glu_all: no f32 gate|up buffer
    (gu32 None, as plan_memory)."""
    T = ubatch
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    e = da.empty
    return DeviceBuffers(
        x=e(rt, (T, c.d_model), np.float32, "residual x"),
        h16=e(rt, (T, c.d_model), np.float16, "normed h"),
        qkv32=e(rt, (T * (H + 2 * Hkv) * D,), np.float32, "q|k|v"),
        q16=e(rt, (T, H, D), np.float16, "q f16"),
        a16=e(rt, (T, H * D), np.float16, "attention out"),
        gu32=None if glu_all else e(rt, (T * 2 * c.d_ff,), np.float32, "ffn gate|up"),
        f16=e(rt, (T, c.d_ff), np.float16, "ffn act"),
        pos=e(rt, (1,), np.int32, "chunk position pos0"),
        last16=e(rt, (1, c.d_model), np.float16, "last row"),
        logits=e(rt, (1, c.vocab_size), np.float32, "logits"),
        amax=e(rt, (1,), np.int32, "argmax"),
        ids=e(rt, (T,), np.int32, "token ids"),
        kc=[e(rt, (max_tokens, Hkv, D), np.float16, f"K cache {i}") for i in range(c.n_layers)],
        vc=[e(rt, (max_tokens, Hkv, D), np.float16, f"V cache {i}") for i in range(c.n_layers)],
        rope=L.RopeTable.build(rt, max_tokens, c.rope_base, c.rope_dim, c.rope_scaling),
        q8=e(rt, (q8_bytes,), np.uint8, "q8_1 activation scratch") if q8_bytes else None,
        blkop=e(rt, (blk_bytes,), np.uint8, "blk operand scratch") if blk_bytes else None,
    )
