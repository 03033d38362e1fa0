"""The weight upload (+ dequant / requant on the GPU) into DeviceWeights.

`load_weights` -> DeviceWeights: every weight streams from the memory map in chunks of whole
rows through the pinned staging of minfer.cuda.runtime.upload (host memory: two chunks). A
path that dequantizes (the family's `via_f16`: f16, blk) gets raw GGUF bytes up (PCIe moves the
compact quantized bytes) and each chunk dequantized on the GPU into its rows of the f16 [N, K]
weight (fused q|k|v and gate|up members into row ranges of their group's buffer, see
minfer.cuda.plan.fusion); the raw int8 paths keep their raw bytes, each chunk copied straight
to its rows (no f16 copy; fused members as row ranges of their group's raw [rows, row bytes]
buffer; a tied LM head shares the embedding's bytes); a path that requantizes (blk) has each
weight (or fused group, once whole) requantized on the GPU to its int8 operand
(mmq_blk.blk_weight), its f16 freed. The embedding table stays quantized (rows gathered with
embed_rows); norms and biases go up as f32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths import TABLE
from minfer.cuda.runtime import devarray as da


def _dequant_f16(rt, raw_dev, qtype: int, N: int, K: int, out) -> None:
    """raw GGUF rows [N, row_bytes] at raw_dev -> out f16 [N, K] (NaN-poisoned first)."""
    from minfer.cuda.ops import dequant

    da.poison(rt, out)
    dequant.dequant_f16(rt, raw_dev, qtype, N, K, out_dev=out)


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
) -> DeviceWeights:
    """Upload every weight (see the module docstring) from the memory map in chunks of at most
    slot_bytes (upload_slot; plan["upload staging"] is two of them) through the pinned staging
    of minfer.cuda.runtime.upload: a tensor is split by whole rows (split_rows, runs of 8 rows)
    and each chunk copied to its rows of the weight (raw routes) or dequantized into its rows
    of the f16 weight, on the upload stream, while the host reads the next chunk.
    glu: fused gate|up groups (fusion.plan_glu) whose rows go up interleaved per 16 (8 gate
    rows, their 8 up rows: quants.glu.glu_rows) for the swiglu epilogue of the f16 GEMM or the
    blk kernel (dequantized rows); their members get no row views."""
    import time

    from minfer.cuda.runtime.upload import Staging, split_rows
    from minfer.host.progress import bar

    t0 = time.perf_counter()
    m, c = model, model.config
    up = Staging(rt, slot_bytes)
    w: dict[str, object] = {}
    groups: dict[str, list[int]] = {}  # fused name -> [rows, K, member]
    for n, (g, r0, rows) in fused.items():
        K = int(m.tensor(n).shape[1])
        groups.setdefault(g, [0, K, n])[0] = max(groups.get(g, [0, K, n])[0], r0 + rows)
    qtypes: dict[str, int] = {}
    pending: dict[str, tuple[int, int]] = {}  # blk groups: f16 made at their first member
    for g, (rows, K, n) in groups.items():
        if TABLE[routes[n][0]].requant:
            pending[g] = (rows, K)
        elif TABLE[routes[n][0]].via_f16:
            w[g] = da.empty(rt, (rows, K), np.float16, f"fused f16 weight {g}")
        else:  # MMQ: raw blocks, one row of K/256 blocks per weight row
            t = m.tensor(n)
            qtypes[g] = t.qtype
            row_bytes = t.data.nbytes // int(t.shape[0])
            w[g] = da.empty(rt, (rows, row_bytes), np.uint8, f"fused raw weight {g}")
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
    stream, rt.stream = rt.stream, up.stream  # dequant kernels queue behind their copies
    scratch: dict[int, object] = {}  # K -> f16 [1024, K] (interleaved dequant)
    left: dict[str, int] = {}  # fused group -> members not yet up (blk: requantized when whole)
    for g, _, _ in fused.values():
        left[g] = left.get(g, 0) + 1
    try:

        def chunks(raw):
            """(first row, rows, chunk bytes) of raw [N, row bytes], the progress bar along."""
            for r0, n in split_rows(raw.shape[0], raw.shape[1], up.slot_bytes):
                yield r0, n, raw[r0 : r0 + n]
                if pb is not None:
                    pb.update(n * raw.shape[1])

        def copy_rows(raw, dst: int) -> None:  # raw bytes straight into device rows
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
            if g in pending:  # one blk group's f16 alive at a time (_requant_ready frees it)
                w[g] = da.empty(rt, pending.pop(g), np.float16, f"fused f16 weight {g}")
            if glu_m:  # f16 rows, interleaved into the group
                g, r0, _ = fused[n]
                if K not in scratch:
                    scratch[K] = da.empty(rt, (1024, K), np.float16, "glu dequant scratch")
                for r, k, part in chunks(raw):
                    _dequant_interleaved(
                        rt,
                        up.put(part),
                        t.qtype,
                        k,
                        K,
                        rb,
                        w[g],
                        r0 > 0,
                        scratch[K],
                        dst_row0=2 * r,
                        stream=up.stream,
                    )
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


def _requant_ready(rt, n: str, routes, fused, left: dict, w: dict) -> None:
    """After weight n's f16 rows are queued: a "blk" weight, or its fused group once every
    member is up, is requantized to the block path's int8 operand (minfer.cuda.paths.blk.launch.
    blk_weight, queued behind the dequants) and its f16 freed once that is done; a group's
    member row views are dropped (the group's GEMM is the only reader). One group's f16 is
    alive at a time (plan_memory's "blk requant staging")."""
    if not TABLE[routes[n][0]].requant:
        return
    from minfer.cuda.paths.blk.launch import blk_weight

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


def _dequant_interleaved(
    rt,
    raw_dev: int,
    qtype: int,
    N: int,
    K: int,
    row_bytes: int,
    dst,
    up: bool,
    tmp,
    dst_row0: int = 0,
    stream=None,
) -> None:
    """A gate (up False) or up member's N quantized rows (on the device at raw_dev) dequantized
    to f16 into the fused group's buffer dst [2N', K] interleaved per 16 rows from dst_row0
    (_copy_interleaved), tmp.shape[0] rows at a time through the f16 scratch tmp [rows, K]
    (the launches and copies queued in order on rt's launch stream = `stream`). N % 8 == 0."""
    rows = int(tmp.shape[0])
    for r in range(0, N, rows):
        n = min(rows, N - r)
        _dequant_f16(rt, raw_dev + r * row_bytes, qtype, n, K, da.rows(tmp, 0, n))
        _copy_interleaved(
            rt, dst, da.rows(tmp, 0, n), n, up, dst_row0=dst_row0 + 2 * r, stream=stream
        )
