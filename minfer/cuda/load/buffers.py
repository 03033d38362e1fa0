"""DeviceBuffers: everything the forward writes, sized for `ubatch` tokens, plus the f16 KV
cache [max_tokens, Hkv, D] per layer and the rope table (alloc_buffers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.ops import layers as L
from minfer.cuda.runtime import devarray as da
from minfer.reference.ops import TOP_MAX


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
    tok: object  # int32 [T, 2]: (KV slot, first slot of its sequence) per token, read on the
    #             device (graph replay at any layout: layers.tok_layout)
    rows: object  # int32 [T]: the chunk rows whose logits a packed batch needs (head rows)
    targets: object  # int32 [T]: each head row's next token (its log-prob), or -1
    stats: object  # f32 [T, 4]: each head row's (argmax, top1 - top2, log-prob, logsumexp)
    top_ids: object  # int32 [T * TOP_MAX]: packed(top=k)'s ids, viewed as [m, k] (row_topk)
    top_lp: object  # f32 [T * TOP_MAX]: their log-probs, viewed as [m, k]
    last16: object  # f16 [1, d_model] the last row, normed
    logits: object  # f32 [1, vocab]
    amax: object  # int32 [1] argmax of the logits
    ids: object  # int32 [T] token ids
    kc: list  # per layer f16 [max_tokens, Hkv, D]
    vc: list  # per layer f16 [max_tokens, Hkv, D]
    rope: object  # L.RopeTable for max_tokens positions
    rope_swa: object  # the local layers' L.RopeTable where their (base, scaling) differ
    #                  (gemma: rope.freq_base_swa; ModelConfig.layer_rope), else None
    post32: object  # f32 [T, d_model]: an attention / FFN output before its post norm
    #                (gemma's post_norms) or its residual scale (granite), else None
    operands: dict  # Operand.scratch -> uint8 scratch the routes' activation operands are
    #                made in (minfer.cuda.paths: each path's Operand), those the routes read
    rope_none: object = None  # the identity L.RopeTable for layers without RoPE (smollm3)


def alloc_buffers(
    rt, c, max_tokens: int, ubatch: int, operand_bytes: dict, glu_all: bool = False
) -> DeviceBuffers:
    """c: the model config (layer_rope: a second RoPE table where the local layers have
    their own; post_norms: the post32 buffer); operand_bytes: Operand.scratch -> bytes (its
    memory plan part, sizes.operand_bytes; a scratch of 0 bytes is not made); glu_all: no f32
    gate|up buffer (gu32 None, as plan_memory)."""
    T = ubatch
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    e = da.empty

    def kv(what: str):
        """A zero-filled cache: a packed chunk's attention loads whole key tiles, whose rows
        outside a sequence (another's, or the gap before a 128-aligned start) it masks; masked
        keys weigh 0, and 0 * v must not be 0 * NaN from uninitialised memory."""
        a = e(rt, (max_tokens, Hkv, D), np.float16, what)
        step = 1 << 30  # pycuda passes the count as a 32-bit unsigned int
        for off in range(0, max_tokens * Hkv * D * 2, step):
            rt.drv.memset_d8(da.ptr(a) + off, 0, min(step, max_tokens * Hkv * D * 2 - off))
        return a

    return DeviceBuffers(
        x=e(rt, (T, c.d_model), np.float32, "residual x"),
        h16=e(rt, (T, c.d_model), np.float16, "normed h"),
        qkv32=e(rt, (T * (H + 2 * Hkv) * D,), np.float32, "q|k|v"),
        q16=e(rt, (T, H, D), np.float16, "q f16"),
        a16=e(rt, (T, H * D), np.float16, "attention out"),
        gu32=None if glu_all else e(rt, (T * 2 * c.d_ff,), np.float32, "ffn gate|up"),
        f16=e(rt, (T, c.d_ff), np.float16, "ffn act"),
        tok=e(rt, (T, 2), np.int32, "token layout (slot, lo)"),
        rows=e(rt, (T,), np.int32, "head rows"),
        targets=e(rt, (T,), np.int32, "head row targets"),
        stats=e(rt, (T, 4), np.float32, "head row stats"),
        top_ids=e(rt, (T * TOP_MAX,), np.int32, "head row top ids"),
        top_lp=e(rt, (T * TOP_MAX,), np.float32, "head row top log-probs"),
        last16=e(rt, (1, c.d_model), np.float16, "last row"),
        logits=e(rt, (1, c.vocab_size), np.float32, "logits"),
        amax=e(rt, (1,), np.int32, "argmax"),
        ids=e(rt, (T,), np.int32, "token ids"),
        kc=[kv(f"K cache {i}") for i in range(c.n_layers)],
        vc=[kv(f"V cache {i}") for i in range(c.n_layers)],
        # positions of one sequence stay below the context (slots may not, packed)
        rope=L.RopeTable.build(
            rt, min(max_tokens, c.n_ctx), c.rope_base, c.rope_dim, c.rope_scaling
        ),
        rope_swa=(
            L.RopeTable.build(
                rt, min(max_tokens, c.n_ctx), *L.local_rope(c)[0:1], c.rope_dim, L.local_rope(c)[1]
            )
            if L.local_rope(c)
            else None
        ),
        post32=(
            e(rt, (T, c.d_model), np.float32, "post-norm input")
            if c.post_norms or c.residual_scale != 1.0
            else None
        ),
        rope_none=(
            L.RopeTable.identity(rt, min(max_tokens, c.n_ctx), c.rope_dim)
            if not all(c.has_rope(il) for il in range(c.n_layers))
            else None
        ),
        operands={
            k: e(rt, (n,), np.uint8, f"{k} operand scratch") for k, n in operand_bytes.items() if n
        },
    )
