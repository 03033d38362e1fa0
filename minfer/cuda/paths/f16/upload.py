"""The f16 path's weight upload (f16.F16.upload; blk's starts with it): raw GGUF rows streamed
through the pinned staging (minfer.cuda.runtime.upload.Staging), each chunk dequantized on the
GPU into its rows of the f16 [N, K] weight. PCIe moves the compact quantized bytes; the f16 is
made where it is read. A fused group (q|k|v, gate|up: minfer.cuda.plan.fusion) is one buffer,
its members row ranges of it; a glu group's gate and up rows interleaved per 16 (8 gate rows,
their 8 up rows: quants.glu.glu_rows) for the swiglu / geglu epilogue of the f16 GEMM or the
blk kernel."""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da


def dest(rt, rows: int, K: int, what: str):
    """The f16 [rows, K] a weight (or fused group) `what` is dequantized into."""
    return da.empty(rt, (rows, K), np.float16, what)


def upload(rt, up, parts, name: str, dst=None, glu: bool = False):
    """(weight, member row views) of `parts` (base.Part: one tensor, or a fused group's members
    in row order) dequantized into dst (None: a new f16 buffer) on up's stream. glu: the
    group's gate (first) and up (second) rows interleaved per 16; no member views."""
    group = len(parts) > 1
    K = parts[0].K
    if dst is None:
        rows = sum(p.N for p in parts)
        dst = dest(rt, rows, K, f"fused f16 weight {name}" if group else f"f16 weight {name}")
    views: dict[str, object] = {}
    r0 = 0
    for p in parts:
        rb = p.raw.shape[1]
        if glu:  # f16 rows, interleaved into the group (through a reused f16 scratch)
            if K not in up.scratch:
                up.scratch[K] = da.empty(rt, (1024, K), np.float16, "glu dequant scratch")
            for r, k, part in up.chunks(p.raw):
                dequant_interleaved(
                    rt,
                    up.put(part),
                    p.qtype,
                    k,
                    K,
                    rb,
                    dst,
                    r0 > 0,
                    up.scratch[K],
                    dst_row0=2 * r,
                    stream=up.stream,
                )
        else:  # a row range of the group's buffer, or the lone weight's
            out = da.rows(dst, r0, p.N) if group else dst
            for r, k, part in up.chunks(p.raw):
                dequant_f16(rt, up.put(part), p.qtype, k, K, da.rows(out, r, k))
            if group:
                views[p.name] = out
        r0 += p.N
    return dst, views


def dequant_f16(rt, raw_dev, qtype: int, N: int, K: int, out) -> None:
    """raw GGUF rows [N, row_bytes] at raw_dev -> out f16 [N, K] (NaN-poisoned first)."""
    from minfer.cuda.ops import dequant

    da.poison(rt, out)
    dequant.dequant_f16(rt, raw_dev, qtype, N, K, out_dev=out)


def copy_interleaved(rt, dst, src, n: int, up: bool, dst_row0: int = 0, stream=None) -> None:
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


def dequant_interleaved(
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
    (copy_interleaved), tmp.shape[0] rows at a time through the f16 scratch tmp [rows, K]
    (the launches and copies queued in order on rt's launch stream = `stream`). N % 8 == 0."""
    rows = int(tmp.shape[0])
    for r in range(0, N, rows):
        n = min(rows, N - r)
        dequant_f16(rt, raw_dev + r * row_bytes, qtype, n, K, da.rows(tmp, 0, n))
        copy_interleaved(
            rt, dst, da.rows(tmp, 0, n), n, up, dst_row0=dst_row0 + 2 * r, stream=stream
        )
