"""CPU: pick_gemm's MMQ branch and the smem guard (no GPU needed)."""

from minfer.cuda.config import GemmConfig
from minfer.cuda.dispatch import pick_gemm
from minfer.cuda.mmq import pick_variant, wide_smem


class _Rt:
    def __init__(self, cap):
        self.smem_optin = cap


def test_pick_gemm_mmq_branch():
    on = GemmConfig(mmq=True)
    assert pick_gemm(12, 512, 4096, 4096, GemmConfig()) == "f16"
    assert pick_gemm(12, 512, 4096, 4096, on) == "mmq-wide-kd4"
    assert pick_gemm(14, 512, 4096, 4096, GemmConfig(mmq=True, kd=8)) == "mmq-wide-kd8"
    assert pick_gemm(12, 7, 9, 512, GemmConfig(mmq=True, wide=False)) == "mmq-narrow"
    assert pick_gemm(12, 7, 9, 512, GemmConfig(mmq=True, raw=False)) == "mmq-r1"
    assert pick_gemm(8, 512, 4096, 4096, on) == "f16"        # q8_0: no MMQ kernel
    assert pick_gemm(12, 512, 576, 576, on) == "f16"         # K not a multiple of 256


def test_smem_guard():
    assert wide_smem(4) == 100352 and wide_smem(8) == 190464
    assert wide_smem(4, 14) == 82944 and wide_smem(8, 14) == 156672
    assert pick_gemm(12, 1, 1, 256, GemmConfig(mmq=True, kd=8), _Rt(101376)) == "mmq-narrow"
    assert pick_gemm(12, 1, 1, 256, GemmConfig(mmq=True, kd=8), _Rt(232448)) == "mmq-wide-kd8"
    v = pick_variant(GemmConfig(mmq=True, kd=4), 65536)
    assert v.kind == "narrow" and "100352" in v.fallback


def test_wide_smem_matches_kernel():
    """The launcher's byte counts are the kernels' (pinned by static_assert in each header)."""
    import re
    from pathlib import Path

    kdir = Path(__file__).parents[1] / "kernels"
    for header, struct, qtype in (("mmq_wide_async.cuh", "WideAsyncSmem", 12),
                                  ("mmq_wide_sync.cuh", "WideSyncSmem", 14)):
        src = (kdir / header).read_text()
        pinned = dict(re.findall(rf"static_assert\({struct}<(\d)>::BYTES == (\d+)", src))
        assert set(pinned) == {"4", "8"}, header
        assert all(wide_smem(int(kd), qtype) == int(b) for kd, b in pinned.items()), header
