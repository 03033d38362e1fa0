"""The GEMM path table and its chooser: the one place a GEMM path is chosen (docs/paths.md).

Each path is one `GemmPath` record: what it supports (tensor types, GPU archs, K multiple),
how it prepares the weight (dequant to f16 / raw bytes / blk requant) and the activation (none /
q8_1 prepass / blk token operand), its launcher and numpy twin (minfer.cuda.ops.path_ops' calling
convention, as "module:function", resolved on use so this module imports no launcher), its
bytes per weight on the GPU, and the tuning variants a `bench --ab` may turn off. `choose_path` picks a path per weight from (type, arch,
shape, user choice, smem cap, memory tier, weight class), as llama.cpp's should_use_mmq does.
`auto` plans the memory tiers of `TIERS` in order (`auto_tiers`) and runs the first that fits the
free device memory (minfer.cuda.plan.memory.choose_tier). Pure Python, no GPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Mapping

Q4_K, Q6_K = 12, 14
QNAMES = {Q4_K: "q4_K", Q6_K: "q6_K"}
RAW_BYTES = {Q4_K: 144 / 256, Q6_K: 210 / 256}   # GGUF bytes per weight


def _wide_smem(kd: int) -> Callable[[int], int]:
    def smem(qtype: int) -> int:
        from minfer.cuda.ops.mmq import wide_smem

        return wide_smem(kd, qtype)
    return smem


def _blk_smem(qtype: int) -> int:
    from minfer.cuda.ops.mmq_blk import blk_smem

    return blk_smem()


@dataclass(frozen=True)
class GemmPath:
    name: str
    kernel: str                        # the kernel entry it launches
    qtypes: frozenset | None           # GGUF types it takes; None: every type dequant takes
    archs: frozenset | None            # None: any sm_80+ GPU
    k_multiple: int                    # K must be a multiple of this
    weight: str                        # "dequant-f16" | "raw" | "requant-blk"
    activation: str                    # "none" | "q8_1" | "blk-operand"
    bytes_per_weight: Mapping          # qtype -> device bytes per weight (None: any type)
    prepare: str                       # "module:function": raw device rows -> its weight
    launch: str                        # "module:function" of the launcher
    twin: str                          # "module:function" of the numpy twin
    variants: tuple = ()               # features a tuning variant may turn off (bench --ab)
    kd: int = 0                        # wide kernels' staging depth
    smem: Callable | None = None       # qtype -> dynamic shared memory (the smem guard)
    gemv_f16: bool = False             # an M = 1 GEMM (the LM head) runs f16's GEMV instead
    f16_kinds: frozenset = frozenset()  # weight kinds left to f16 for accuracy (tuning
    #                                     variant exact-down; auto's tier blk-all takes them)

    @property
    def int8(self) -> bool:
        return self.weight != "dequant-f16"

    def unsupported(self, qtype: int, arch, K: int) -> str:
        """'' when this path runs a [*, K] GEMM on a weight of `qtype` on `arch`, else why not."""
        if self.qtypes is not None and int(qtype) not in self.qtypes:
            return f"{qname(qtype)}: no {self.name} kernel"
        if self.archs is not None and arch not in self.archs:
            return f"{self.name}: {arch or 'this GPU'} is not {'/'.join(sorted(self.archs))}"
        if K % self.k_multiple:
            return f"K={K} not a multiple of {self.k_multiple}"
        return ""

    def weight_bytes(self, qtype: int) -> float:
        b = self.bytes_per_weight
        return float(b[int(qtype)] if int(qtype) in b else b[None])

    def ops(self):
        """(prepare, launch, twin): minfer.cuda.ops.path_ops' calling convention."""
        return resolve(self.prepare), resolve(self.launch), resolve(self.twin)


def resolve(ref: str):
    """"module:function" -> the function (imported on use: this module imports no launcher)."""
    mod, fn = ref.split(":")
    return getattr(importlib.import_module(mod), fn)


def qname(qtype: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(int(qtype)).name.lower().replace("_k", "_K")
    except (ImportError, ValueError):
        return QNAMES.get(int(qtype), f"type {qtype}")


_OPS = "minfer.cuda.ops.path_ops:"
_INT8 = dict(qtypes=frozenset({Q4_K, Q6_K}), archs=None, k_multiple=256, weight="raw",
             activation="q8_1", bytes_per_weight=RAW_BYTES, prepare=_OPS + "prepare_raw",
             launch=_OPS + "launch_raw", twin=_OPS + "twin_q8_1")

TABLE: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath("f16", "gemm_f16_nt", None, None, 8, "dequant-f16", "none", {None: 2.0},
             _OPS + "prepare_f16", _OPS + "launch_f16", _OPS + "twin_f16",
             variants=("glu", "rope")),
    # any type: dequantized, Hadamard-rotated and requantized to int8 at load, one f32 scale
    # per (row, 128 of K) on both operands (per token on the GEMMs after an rmsnorm); ffn_down
    # stays f16: its int8 grid is most of the path's KL divergence (docs/blk.md, "Accuracy")
    GemmPath("blk", "mmq_blk", None, frozenset({"sm_90"}), 32, "requant-blk", "blk-operand",
             {None: 16896 / 16384}, _OPS + "prepare_blk", _OPS + "launch_blk", _OPS + "twin_blk",
             variants=("glu", "stream-k", "fused-prepass", "token-scale", "exact-down"),
             smem=_blk_smem, gemv_f16=True, f16_kinds=frozenset({"ffn_down"})),
    GemmPath("wide-kd4", "mmq_raw_wide_nt_kernel", **_INT8, kd=4, smem=_wide_smem(4)),
    GemmPath("wide-kd8", "mmq_raw_wide_nt_kernel", **_INT8, kd=8, smem=_wide_smem(8)),
    GemmPath("narrow", "mmq_raw_nt_kernel", **_INT8),
    GemmPath("r1", "mmq_nt_kernel", **_INT8),
)}
F16, NARROW = TABLE["f16"], TABLE["narrow"]
# weight preparations that dequantize to f16 at load (so any types fuse: rows of one f16 group)
VIA_F16 = ("dequant-f16", "requant-blk")
INT8_PATHS = tuple(p for p in TABLE.values() if p.int8)


@dataclass(frozen=True)
class Tier:
    """A memory tier of `auto`: `path` for the weights of `classes` (routes.weight_class: attn,
    ffn, head; None: all) and of `qtypes` (None: all), f16 for the rest; exact=False: the path
    takes even the kinds it leaves to f16 for accuracy (GemmPath.f16_kinds)."""
    name: str
    path: str
    classes: frozenset | None = None
    qtypes: frozenset | None = None
    exact: bool = True

    def takes(self, cls: str, qtype: int) -> bool:
        return ((self.classes is None or cls in self.classes) and
                (self.qtypes is None or int(qtype) in self.qtypes))


_FFN_Q4K = dict(classes=frozenset({"ffn"}), qtypes=frozenset({Q4_K}))
# what `auto` tries, fastest first (auto_tiers keeps those whose path runs on the GPU): blk on
# sm_90 (1.03 B per weight, ffn_down on f16; docs/paths.md), blk-all (ffn_down too), then the
# mixed tier keeping attention, q6_K and the LM head on f16 and the ffn's q4_K on the wide
# kernel, then every q4_K / q6_K on it
TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("f16", "f16"),
    Tier("blk", "blk"),
    Tier("blk-all", "blk", exact=False),
    Tier("mix-int8", "wide-kd4", **_FFN_Q4K),
    Tier("int8", "wide-kd4"),
)}
# a tuning variant names a feature a path may turn off; auto takes any of them
VARIANTS = tuple(sorted({v for p in TABLE.values() for v in p.variants}))
CHOICES = ("auto", "mmq", *TABLE)   # --gemm / MINFER_GEMM; mmq: the seeds' MINFER_MMQ_* config


@dataclass(frozen=True)
class Route:
    """choose_path's answer: the path, why a weight fell back to f16 ('' when f16 was asked
    for or won), and a notice to print once (the smem guard's fallback)."""
    path: GemmPath
    why: str = ""
    notice: str = ""


# the model width from which `auto` runs blk ahead of f16 on sm_90: at the 8B shape (d 4096,
# H200) blk is 1.25x f16 sustained and passes gate 6 (docs/perf.md); narrower models keep the
# exact f16 path, where blk's operand launches weigh more against small GEMMs
BLK_AUTO_WIDTH = 4096


def auto_tiers(arch, width: int = 0) -> tuple[str, ...]:
    """The memory tiers `auto` tries on `arch` for a model of `width` (d_model), fastest first
    (TIERS' order, those whose path runs there): f16; on sm_90 blk (1.03 B per weight against
    f16's 2, ffn_down on f16) and blk-all (ffn_down too); mix-int8 (ffn q4_K on the wide kernel)
    and int8 (the raw GGUF bytes). From BLK_AUTO_WIDTH on sm_90 blk goes first and f16 is not
    tried (it needs more memory than blk: where blk does not fit, neither does f16)."""
    tiers = tuple(n for n, t in TIERS.items()
                  if TABLE[t.path].archs is None or arch in TABLE[t.path].archs)
    if "blk" in tiers and width >= BLK_AUTO_WIDTH:
        return tuple(t for t in tiers if t != "f16")
    return tiers


def choose_path(qtype: int, arch, shape: tuple[int, int, int], choice: str = "auto",
                smem_optin: int | None = None, tier: str = "f16", alone: bool = False,
                cls: str = "", kind: str = "", exact: bool = True) -> Route:
    """The path of y[M, N] = x[M, K] @ W[N, K].T with W of GGUF type `qtype` on `arch`
    ("sm_90"; None: unknown). choice: "auto" or a TABLE name (the seeds' "mmq" is resolved
    before, GemmChoice); tier: auto's memory tier (a TIERS name), whose path runs the weight
    when it takes the weight's class `cls` (attn, ffn, head) and type; smem_optin: the device's
    opt-in shared memory (None: unbounded), a wide kernel over it runs the narrow kernel (the
    smem guard, with a notice); alone: the weight runs as its own GEMM of a fraction of a wave
    (a bias-free attn_v that cannot join q|k: 65 us on the int8 kernels, 24 us on f16 at the 8B
    shape, M = 512), which int8 paths leave to f16; kind: the weight's kind (ffn_down, ...),
    which a path may leave to f16 for accuracy (GemmPath.f16_kinds) unless not `exact` (the
    tuning variant no-exact-down) or auto's tier says so."""
    M, N, K = shape
    name = choice
    if choice == "auto":
        t = TIERS[tier]
        if not t.takes(cls, qtype):
            return Route(F16, f"{t.name} tier")
        name, exact = t.path, exact and t.exact
    if name not in TABLE:
        raise ValueError(f"unknown GEMM path {name!r} (known: {', '.join(TABLE)})")
    p = TABLE[name]
    if not p.int8:
        return Route(F16)
    why = p.unsupported(qtype, arch, K)
    if why:
        return Route(F16, why)
    if alone:
        return Route(F16, "attn_v alone: faster on f16")
    if exact and kind in p.f16_kinds:
        return Route(F16, f"{kind}: f16 for accuracy")
    if p.gemv_f16 and M == 1:
        return Route(F16, "M = 1: the f16 GEMV")
    if smem_optin is not None and p.smem is not None and p.smem(qtype) > smem_optin:
        need = p.smem(qtype)
        if p.kd:
            return Route(NARROW, notice=(
                f"MMQ wide KD={p.kd} needs {need} B of shared memory, over this GPU's opt-in "
                f"cap of {smem_optin} B: using the narrow MMQ kernel instead"))
        return Route(F16, f"{p.name} needs {need} B of shared memory, over the cap {smem_optin}")
    return Route(p)
