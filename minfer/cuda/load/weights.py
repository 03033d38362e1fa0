"""The weight upload into DeviceWeights: the order and the buffers, never the how.

`load_weights` -> DeviceWeights: every linear weight (or fused q|k|v / gate|up group, see
minfer.cuda.plan.fusion) goes up by its path's `upload` (minfer.cuda.paths: raw GGUF rows up, then
dequantized, requantized or kept as they are on the GPU, as the path keeps its weight), the
same function `minfer check` calls, streaming from the memory map in
chunks of whole rows through the pinned staging of minfer.cuda.runtime.upload (host memory: two
chunks). A fused group's buffer is made before anything goes up where its path makes one ahead
(`dest`); a tied LM head on raw bytes shares the embedding's. The embedding table stays
quantized (rows gathered with embed_rows); norms and biases go up as f32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths import TABLE, Part
from minfer.cuda.runtime import devarray as da


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


def load_weights(
    rt,
    model,
    routes: dict[str, tuple[str, str]],
    fused: dict[str, tuple[str, int, int]],
    slot_bytes: int,
    progress: bool,
    glu: frozenset[str] = frozenset(),
    channels=None,
) -> DeviceWeights:
    """Upload every weight (see the module docstring) from the memory map in chunks of at most
    slot_bytes (upload_slot; plan["upload staging"] is two of them) through the pinned staging
    of minfer.cuda.runtime.upload: a tensor is split by whole rows (split_rows, runs of 8 rows)
    and each chunk made into its rows of the weight by the path's upload, on the upload
    stream, while the host reads the next chunk.
    glu: fused gate|up groups (fusion.plan_glu) whose rows go up interleaved per 16 (8 gate
    rows, their 8 up rows: quants.glu.glu_rows) for their GEMM's glu epilogue; their members
    get no row views. channels: GemmChoice.channels, for the paths' uploads (Staging.channels)."""
    import time

    from minfer.cuda.runtime.upload import Staging
    from minfer.host.progress import bar

    t0 = time.perf_counter()
    m, c = model, model.config
    up = Staging(rt, slot_bytes)
    up.channels = channels
    w: dict[str, object] = {}
    groups: dict[str, list[int]] = {}  # fused name -> [rows, K, member]
    for n, (g, r0, rows) in fused.items():
        K = int(m.tensor(n).shape[1])
        groups.setdefault(g, [0, K, n])[0] = max(groups.get(g, [0, K, n])[0], r0 + rows)
    qtypes: dict[str, int] = {}
    dst: dict[str, object] = {}  # fused group -> its buffer, made before any upload (dest)
    for g, (rows, K, n) in groups.items():
        t = m.tensor(n)
        if not TABLE[routes[n][0]].via_f16:
            qtypes[g] = t.qtype  # (raw groups: one type, plan_fusion)
        d = TABLE[routes[n][0]].dest(rt, rows, K, t.data.nbytes // int(t.shape[0]), g)
        if d is not None:
            dst[g] = d
    emb_t = m.tensor("token_embd.weight")
    emb_qtype = emb_t.qtype
    emb = da.empty(rt, (int(emb_t.data.nbytes),), np.uint8, "quantized embedding table")
    names = list(routes)
    raw_head = (
        "token_embd.weight" in routes and TABLE[routes["token_embd.weight"][0]].via_f16 is False
    )  # a tied head on its raw bytes
    total = int(emb_t.data.nbytes) * (1 + ("token_embd.weight" in routes and not raw_head)) + sum(
        int(m.tensor(n).data.nbytes) for n in names if n != "token_embd.weight"
    )
    pb = bar(
        progress, total=total, desc="upload+dequant", unit="B", unit_scale=True, unit_divisor=1000
    )
    up.progress = None if pb is None else pb.update
    stream, rt.stream = rt.stream, up.stream  # dequant kernels queue behind their copies
    try:
        emb_raw = _raw_rows(emb_t)
        for r0, _, part in up.chunks(emb_raw):  # the table's raw bytes, as they are
            up.put(part, da.ptr(emb) + r0 * emb_raw.shape[1])
        for n in names:
            t = m.tensor(n)
            qtypes[n] = t.qtype
            path = TABLE[routes[n][0]]
            if n == "token_embd.weight" and not path.via_f16:
                w[n] = emb  # a tied LM head on its raw bytes shares the embedding table's
                continue
            g = fused[n][0] if n in fused else None
            if g is not None and g in w:
                continue  # uploaded with its group's first member
            # a weight alone, or its fused group (members consecutive in routes' order: the
            # layer schema's) at its first member, by its path's upload
            members = (
                [n]
                if g is None
                else sorted((k for k in fused if fused[k][0] == g), key=lambda k: fused[k][1])
            )
            parts = [
                Part(k, _raw_rows(m.tensor(k)), m.tensor(k).qtype, int(m.tensor(k).shape[1]))
                for k in members
            ]
            w[g or n], views = path.upload(rt, up, parts, g or n, dst.get(g), g in glu)
            w.update(views)
        up.close()  # every copy and dequant done
    finally:
        rt.stream = stream
        if pb is not None:
            pb.close()
    nbytes = total - (
        int(emb_t.data.nbytes) if "token_embd.weight" in routes and not raw_head else 0
    )  # file bytes: a tied f16 head read twice counts once
    from minfer.families import schema_of

    sch = schema_of(c)
    for i in range(c.n_layers):
        for name in sch.names(i, "norm"):  # the family's norms, f32 on the device
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
        rt, m.dequant("output_norm.weight").reshape(-1).astype(np.float32), "output_norm"
    )
    nbytes += int(m.tensor("output_norm.weight").data.nbytes)
    rt.synchronize()
    return DeviceWeights(
        w=w,
        qtypes=qtypes,
        emb=emb,
        emb_qtype=emb_qtype,
        nbytes=nbytes,
        seconds=time.perf_counter() - t0,
    )
