"""The CUDA backend's device memory: the memory plan and its check, the weight upload
(+ dequant), and the activation / KV-cache / scratch buffers.

- `plan_memory` / `memory_need` / `check_memory`: bytes per part (f16 weights, MMQ weights,
  quantized embedding, KV cache for max_tokens, activations for ubatch tokens, q8_1 scratch,
  upload staging), checked against the device's free memory before anything is allocated
  (GPUError naming what was asked and what is free, in GB); memory_need is what the memory
  tiers are compared by (routes.plan_tiers) and what the backend checks.
- `load_weights` -> DeviceWeights: every weight streams from the memory map in chunks of whole
  rows through the pinned staging of minfer.cuda.runtime.upload (host memory: two chunks).
  "f16" routes go up as raw GGUF bytes (PCIe moves the compact quantized bytes) and each chunk
  is dequantized on the GPU into its rows of the f16 [N, K] weight (fused q|k|v and gate|up
  members into row ranges of their group's buffer, see routes.plan_fusion); int8 routes stay as
  their raw bytes, each chunk copied straight to its rows (no f16 copy; fused members as row
  ranges of their group's raw [rows, row bytes] buffer; a tied LM head shares the embedding's
  bytes); "blk" routes go up as f16 and each weight (or fused group, once whole) is requantized
  on the GPU to the block path's int8 operand (mmq_blk.blk_weight), its f16 freed. The
  embedding table stays quantized (rows gathered with embed_rows); norms and biases go up as
  f32.
- `alloc_buffers` -> DeviceBuffers: everything forward writes, sized for `ubatch` tokens, plus
  the f16 KV cache [max_tokens, Hkv, D] per layer and the rope table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.cuda.ops import layers as L
from minfer.cuda.paths import TABLE
from minfer.errors import GPUError


def _dequant_f16(rt, raw_dev, qtype: int, N: int, K: int, out) -> None:
    """raw GGUF rows [N, row_bytes] at raw_dev -> out f16 [N, K] (NaN-poisoned first)."""
    from minfer.cuda.ops import dequant

    da.poison(rt, out)
    dequant.dequant_f16(rt, raw_dev, qtype, N, K, out_dev=out)


# -- memory plan ------------------------------------------------------------------------------
def plan_memory(model, routes: dict[str, tuple[str, str]], max_tokens: int,
                ubatch: int, sms: int = 0, glu_all: bool = False,
                chunk: int | None = None) -> dict[str, int]:
    """part -> bytes the backend will allocate (the keys name the parts in GPUError messages);
    sms: the GPU's SM count (the blk kernel's stream-K workspace, one slot per SM); glu_all:
    every layer's gate|up GEMM writes the swiglu itself (fusion.glu_all), so the f32 gate|up
    buffer is not allocated; chunk: the upload's chunk bytes (two device staging slots of
    upload_slot; None: upload.DEFAULT_CHUNK)."""
    c = model.config
    m = model
    from minfer.cuda.ops.stream_k import SK_SLOT_BYTES
    from minfer.cuda.plan.fusion import plan_fusion

    from minfer.cuda.runtime.upload import DEFAULT_CHUNK
    from minfer.quants.blk_ref import blk_bytes

    fused = plan_fusion(model, routes)   # a fused group is requantized as one weight
    f16_w = 0
    mmq_w = 0
    q8_k = 0
    blk_k = 0                        # largest K of the blk routes (their operand scratch)
    blk_groups: dict[str, list] = {}  # blk weight or fused group -> [rows, K]
    for n, (path, _) in routes.items():
        t = m.tensor(n)
        N, K = (int(s) for s in t.shape)
        p = TABLE[path]   # how the path keeps its weight on the GPU
        if p.via_f16 and not p.requant:
            f16_w += N * K * 2
        elif p.requant:   # ~1 B/weight; f16 (a group at a time) while requantizing
            blk_k = max(blk_k, K)
            g = fused[n][0] if n in fused else n
            blk_groups.setdefault(g, [0, K])[0] += N
        else:
            q8_k = max(q8_k, K)
            if n != "token_embd.weight":  # a tied LM head shares the embedding's bytes
                mmq_w += int(t.data.nbytes)
    mmq_w += sum(blk_bytes(N, K) for N, K in blk_groups.values())   # tokens' layout, too
    emb = int(m.tensor("token_embd.weight").data.nbytes)
    kv = 2 * c.n_layers * max_tokens * c.n_kv_heads * c.head_dim * 2
    T = ubatch
    qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    act = T * (c.d_model * (4 + 2) + qd * (4 + 2 + 2) + kd * 4 * 2 +
               c.d_ff * ((0 if glu_all else 4 + 4) + 2))
    act += c.vocab_size * 4 + (max_tokens * c.rope_dim) * 4
    return {"f16 weights": f16_w, "MMQ weights": mmq_w, "quantized embedding": emb,
            "KV cache": kv, "activations": act, "q8_1 scratch": T * q8_k // 32 * 40,
            "upload staging": 2 * upload_slot(m, routes, chunk or DEFAULT_CHUNK),
            "blk operand scratch": blk_bytes(T, blk_k) if blk_k else 0,
            "blk requant staging": max((N * K * 2 for N, K in blk_groups.values()), default=0),
            "MMQ stream-K workspace": sms * (SK_SLOT_BYTES + 4) if blk_k else 0}


def memory_need(model, choice, routes: dict[str, tuple[str, str]], max_tokens: int,
                ubatch: int, sms: int = 0, chunk: int | None = None) -> dict[str, int]:
    """plan_memory of `routes` as the backend builds them (fusion, the glu epilogues of
    `choice`): what the memory tiers are compared by and what check_memory checks."""
    from minfer.cuda.plan.fusion import glu_all, plan_fusion, plan_glu

    g = plan_glu(model, choice, routes, plan_fusion(model, routes))
    return plan_memory(model, routes, max_tokens, ubatch, sms, glu_all(model, routes, g), chunk)


def check_memory(rt, plan: dict[str, int], max_tokens: int, ubatch: int) -> None:
    """GPUError before any allocation when the plan (weights, KV cache for max_tokens,
    activations for ubatch tokens, scratch) does not fit the device's free memory."""
    from minfer.cuda.plan.memory import MARGIN, gb

    need = sum(plan.values())
    free, total = rt.mem_info()
    if need + MARGIN > free:
        parts = ", ".join(f"{k} {gb(v)}" for k, v in plan.items() if v)
        raise GPUError(f"GPU out of memory for this model: needs {gb(need)} of GPU memory "
                       f"({parts}) plus the {gb(MARGIN)} margin, {gb(free)} free of "
                       f"{gb(total)} (KV cache for {max_tokens} tokens, activations "
                       f"for {ubatch}: try a shorter prompt, fewer --greedy tokens or "
                       f"a smaller --ubatch)")


# -- weights ----------------------------------------------------------------------------------
@dataclass
class DeviceWeights:
    w: dict[str, object]  # name -> f16 [N, K] | raw uint8 (MMQ) | WgmmaQ4K/Q6K | f32 norm / bias
    qtypes: dict[str, int]  # linear weight name -> its GGUF qtype
    emb: object  # the quantized embedding table's raw bytes, uint8 [V * row_bytes]
    emb_qtype: int
    nbytes: int = 0  # file bytes read into ready weights
    seconds: float = 0.0  # how long that took (upload, dequant, requant, until synchronized)


def _raw_rows(t) -> np.ndarray:
    """t's bytes as uint8 [rows, row bytes]: a view into the memory map (no copy; the map is
    read chunk by chunk into the pinned staging)."""
    d = t.data if t.data.flags.c_contiguous else np.ascontiguousarray(t.data)
    return d.reshape(int(t.shape[0]), -1).view(np.uint8)


def upload_slot(model, names, chunk: int) -> int:
    """Bytes of one staging slot: the largest chunk split_rows cuts from the tensors `names`
    (and the embedding) for `chunk` bytes per chunk."""
    from minfer.cuda.runtime.upload import rows_per_chunk

    slot = 1
    for n in (*names, "token_embd.weight"):
        t = model.tensor(n)
        N = int(t.shape[0])
        rb = int(t.data.nbytes) // N
        slot = max(slot, min(N, rows_per_chunk(rb, chunk)) * rb)
    return slot


def load_weights(rt, model, routes: dict[str, tuple[str, str]],
                 fused: dict[str, tuple[str, int, int]], slot_bytes: int,
                 progress: bool, glu: frozenset[str] = frozenset()) -> DeviceWeights:
    """Upload every weight (see the module docstring) from the memory map in chunks of at most
    slot_bytes (upload_slot; plan["upload staging"] is two of them) through the pinned staging
    of minfer.cuda.runtime.upload: a tensor is split by whole rows (split_rows, runs of 8 rows)
    and each chunk copied to its rows of the weight (raw routes) or dequantized into its rows
    of the f16 weight, on the upload stream, while the host reads the next chunk.
    glu: fused gate|up groups (routes.plan_glu) whose rows go up interleaved per 16 (8 gate
    rows, their 8 up rows: quants.glu.glu_rows) for the swiglu epilogue of the f16 GEMM or the
    blk kernel (dequantized rows); their members get no row views."""
    import time

    from minfer.cuda.runtime.upload import Staging, split_rows
    from minfer.progress import bar

    t0 = time.perf_counter()
    m, c = model, model.config
    up = Staging(rt, slot_bytes)
    w: dict[str, object] = {}
    groups: dict[str, list[int]] = {}  # fused name -> [rows, K, member]
    for n, (g, r0, rows) in fused.items():
        K = int(m.tensor(n).shape[1])
        groups.setdefault(g, [0, K, n])[0] = max(groups.get(g, [0, K, n])[0], r0 + rows)
    qtypes: dict[str, int] = {}
    pending: dict[str, tuple[int, int]] = {}   # blk groups: f16 made at their first member
    for g, (rows, K, n) in groups.items():
        if TABLE[routes[n][0]].requant:
            pending[g] = (rows, K)
        elif TABLE[routes[n][0]].via_f16:
            w[g] = da.empty(rt, (rows, K), np.float16, f"fused f16 weight {g}")
        else:   # MMQ: raw blocks, one row of K/256 blocks per weight row
            t = m.tensor(n)
            qtypes[g] = t.qtype
            row_bytes = t.data.nbytes // int(t.shape[0])
            w[g] = da.empty(rt, (rows, row_bytes), np.uint8, f"fused raw weight {g}")
    emb_t = m.tensor("token_embd.weight")
    emb_qtype = emb_t.qtype
    emb = da.empty(rt, (int(emb_t.data.nbytes),), np.uint8, "quantized embedding table")
    names = list(routes)
    raw_head = "token_embd.weight" in routes and TABLE[
        routes["token_embd.weight"][0]].via_f16 is False   # a tied head on its raw bytes
    total = int(emb_t.data.nbytes) * (1 + ("token_embd.weight" in routes and not raw_head)) + \
        sum(int(m.tensor(n).data.nbytes) for n in names if n != "token_embd.weight")
    pb = bar(progress, total=total, desc="upload+dequant", unit="B", unit_scale=True,
             unit_divisor=1000)
    stream, rt.stream = rt.stream, up.stream   # dequant kernels queue behind their copies
    scratch: dict[int, object] = {}            # K -> f16 [1024, K] (interleaved dequant)
    left: dict[str, int] = {}   # fused group -> members not yet up (blk: requantized when whole)
    for n, (g, _, _) in fused.items():
        left[g] = left.get(g, 0) + 1
    try:
        def chunks(raw):
            """(first row, rows, chunk bytes) of raw [N, row bytes], the progress bar along."""
            for r0, n in split_rows(raw.shape[0], raw.shape[1], up.slot_bytes):
                yield r0, n, raw[r0:r0 + n]
                if pb is not None:
                    pb.update(n * raw.shape[1])

        def copy_rows(raw, dst: int) -> None:   # raw bytes straight into device rows
            for r0, _, part in chunks(raw):
                up.put(part, dst + r0 * raw.shape[1])

        copy_rows(_raw_rows(emb_t), da.ptr(emb))
        for n in names:
            t = m.tensor(n)
            N, K = (int(s) for s in t.shape)
            qtypes[n] = t.qtype
            raw = _raw_rows(t)
            rb = raw.shape[1]
            glu_m = n in fused and fused[n][0] in glu
            if not TABLE[routes[n][0]].via_f16:
                # MMQ: the raw q4_K / q6_K bytes are the weight (no f16 copy); a tied LM head
                # shares the embedding table's bytes
                if n in fused:
                    g, r0, _ = fused[n]
                    w[n] = da.rows(w[g], r0, N)
                    copy_rows(raw, da.ptr(w[n]))
                elif n == "token_embd.weight":
                    w[n] = emb
                else:
                    w[n] = da.empty(rt, (raw.size,), np.uint8, f"raw weight {n}")
                    copy_rows(raw, da.ptr(w[n]))
                continue
            g = fused[n][0] if n in fused else None
            if g in pending:   # one blk group's f16 alive at a time (_requant_ready frees it)
                w[g] = da.empty(rt, pending.pop(g), np.float16, f"fused f16 weight {g}")
            if glu_m:   # f16 rows, interleaved into the group
                g, r0, _ = fused[n]
                if K not in scratch:
                    scratch[K] = da.empty(rt, (1024, K), np.float16, "glu dequant scratch")
                for r, k, part in chunks(raw):
                    _dequant_interleaved(rt, up.put(part), t.qtype, k, K, rb, w[g], r0 > 0,
                                         scratch[K], dst_row0=2 * r, stream=up.stream)
                _requant_ready(rt, n, routes, fused, left, w)
                continue
            if n in fused:  # a row range of the layer's fused q|k|v or gate|up weight
                g, r0, _ = fused[n]
                out = da.rows(w[g], r0, N)
            else:
                out = da.empty(rt, (N, K), np.float16, f"f16 weight {n}")
            for r, k, part in chunks(raw):
                _dequant_f16(rt, up.put(part), t.qtype, k, K, da.rows(out, r, k))
            w[n] = out
            _requant_ready(rt, n, routes, fused, left, w)
        up.close()   # every copy and dequant done
    finally:
        rt.stream = stream
        if pb is not None:
            pb.close()
    nbytes = total - (int(emb_t.data.nbytes) if "token_embd.weight" in routes and
                      not raw_head else 0)   # file bytes: a tied f16 head read twice counts once
    for i in range(c.n_layers):
        for n in ("attn_norm", "ffn_norm") + (("attn_q_norm", "attn_k_norm") if c.qk_norm
                                              else ()):
            name = f"blk.{i}.{n}.weight"
            w[name] = da.to_device(rt, m.dequant(name).reshape(-1).astype(np.float32), name)
            nbytes += int(m.tensor(name).data.nbytes)
        if c.qkv_bias:
            bs = []
            for n in ("attn_q", "attn_k", "attn_v"):
                name = f"blk.{i}.{n}.bias"
                bs.append(m.dequant(name).reshape(-1).astype(np.float32))
                w[name] = da.to_device(rt, bs[-1], name)
                nbytes += int(m.tensor(name).data.nbytes)
            name = f"blk.{i}.attn_qkv.bias"  # for the fused GEMM's output
            w[name] = da.to_device(rt, np.concatenate(bs), name)
    w["output_norm.weight"] = da.to_device(
        rt, m.dequant("output_norm.weight").reshape(-1).astype(np.float32), "output_norm")
    nbytes += int(m.tensor("output_norm.weight").data.nbytes)
    rt.synchronize()
    return DeviceWeights(w=w, qtypes=qtypes, emb=emb, emb_qtype=emb_qtype, nbytes=nbytes,
                         seconds=time.perf_counter() - t0)


def _requant_ready(rt, n: str, routes, fused, left: dict, w: dict) -> None:
    """After weight n's f16 rows are queued: a "blk" weight, or its fused group once every
    member is up, is requantized to the block path's int8 operand (minfer.cuda.ops.mmq_blk.
    blk_weight, queued behind the dequants) and its f16 freed once that is done; a group's
    member row views are dropped (the group's GEMM is the only reader). One group's f16 is
    alive at a time (plan_memory's "blk requant staging")."""
    if not TABLE[routes[n][0]].requant:
        return
    from minfer.cuda.ops.mmq_blk import blk_weight

    key = n
    if n in fused:
        key = fused[n][0]
        left[key] -= 1
        if left[key]:
            return
        for m, (g, _, _) in fused.items():
            if g == key:
                w.pop(m, None)
    f16 = w[key]
    w[key] = blk_weight(rt, f16, key)
    rt.synchronize()
    f16.gpudata.free()


def _copy_interleaved(rt, dst, src, n: int, up: bool, dst_row0: int = 0, stream=None) -> None:
    """n rows [n, row_bytes] of a gate (up False) or up member into the fused group's buffer dst
    [2N, row_bytes] interleaved per 16 rows: runs of 8 rows at dst rows dst_row0 + 16 j (gate)
    or + 8 (up). One 2D copy (pitch 16 rows), queued on `stream` when given; src is host
    bytes (numpy) or a device array. n % 8 == 0 (plan_glu)."""
    rb = int(np.prod(dst.shape[1:])) * dst.dtype.itemsize
    cp = rt.drv.Memcpy2D()
    if isinstance(src, np.ndarray):
        cp.set_src_host(src)
    else:
        cp.set_src_device(da.ptr(src))
    cp.set_dst_device(da.ptr(dst) + dst_row0 * rb + (8 * rb if up else 0))
    cp.src_pitch, cp.dst_pitch = 8 * rb, 16 * rb
    cp.width_in_bytes, cp.height = 8 * rb, n // 8
    if stream is not None:
        cp(stream)
    else:
        cp(aligned=True)


def _dequant_interleaved(rt, raw_dev: int, qtype: int, N: int, K: int, row_bytes: int, dst,
                         up: bool, tmp, dst_row0: int = 0, stream=None) -> None:
    """A gate (up False) or up member's N quantized rows (on the device at raw_dev) dequantized
    to f16 into the fused group's buffer dst [2N', K] interleaved per 16 rows from dst_row0
    (_copy_interleaved), tmp.shape[0] rows at a time through the f16 scratch tmp [rows, K]
    (the launches and copies queued in order on rt's launch stream = `stream`). N % 8 == 0."""
    rows = int(tmp.shape[0])
    for r in range(0, N, rows):
        n = min(rows, N - r)
        _dequant_f16(rt, raw_dev + r * row_bytes, qtype, n, K, da.rows(tmp, 0, n))
        _copy_interleaved(rt, dst, da.rows(tmp, 0, n), n, up, dst_row0=dst_row0 + 2 * r,
                          stream=stream)


# -- activations / cache ----------------------------------------------------------------------
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
