"""The blk path's weight upload: the f16 path's (f16.upload: raw rows up, dequantized on the
GPU, a glu group's rows interleaved), then the whole weight or fused group requantized on the
GPU to the int8 operand (launch.blk_weight, queued behind the dequants) and its f16 freed once
that is done. One weight's or group's f16 is alive at a time: the memory plan's "blk requant
staging" (sizes.plan_memory), not the whole model's f16."""

from __future__ import annotations

from minfer.cuda.paths.f16 import upload as f16_upload


def upload(rt, up, parts, name: str, glu: bool = False):
    """(BlkWeight, {}) of `parts` (base.Part: one tensor, or a fused group's members in row
    order): no member views, the group's GEMM is the only reader."""
    from minfer.cuda.paths.blk.launch import blk_weight

    f16, _ = f16_upload.upload(rt, up, parts, name, glu=glu)
    w = blk_weight(rt, f16, name)
    rt.synchronize()
    f16.gpudata.free()
    return w, {}
