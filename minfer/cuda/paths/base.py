"""What every GEMM path family is: a `GemmPath` (the table's record and the family's behaviour),
the per-weight `LinearRoute` it makes, and the `Operand` forms its kernels read.

A family (the packages f16/, q8_1/, blk/: path record, launchers, upload, numpy twin) subclasses
GemmPath and LinearRoute; everything about the path lives there: which weights it takes and why
not (`unsupported`), device bytes per weight, the weight's upload (`upload`: raw GGUF rows in
host memory -> the path's weight on the device, the one function the engine's load and `minfer
check` both call, so parity tests the bytes the engine runs), the
activation operand (`Operand`: a prepass, or a producer fused into the rmsnorm or attention
launch), the launches with their epilogues (`LinearRoute.run` / `run_glu`), the numpy twin
(`twin`), the kernels it needs compiled at load (`load_kernels`) and its tuning variants. The
forward, `minfer check`, the tests and `bench --ab` all call these same objects.

Calling convention of a route (y[M, N] = x[M, K] @ W[N, K].T):
    A f16 [M, K]  --operand.prepass(rt, A, buf)-->  x  (A itself when operand is None)
    route.run(rt, scratch, C, x, w, mode)   mode 'f32' / 'f16': C = x @ w.T; 'acc': C +=
    route.run_glu(rt, scratch, C, x, w, act)   C f16 [M, F] = act(gate) * up (glu routes;
                                               act "silu" or "gelu": quants.glu.GLU_ACTS)
    route.run_rope(rt, scratch, x, w, rope, hi)   q|k|v roped into q16 and the KV cache from
                                               the epilogue (rope routes, where rope_pays)
buf: the operand's scratch, DeviceBuffers.operands[operand.scratch]; scratch: the backend's
DeviceBuffers (the f16 GEMV's glu at M == 1 uses its f32 gate|up buffer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

Q4_K, Q6_K = 12, 14
RAW_BYTES = {Q4_K: 144 / 256, Q6_K: 210 / 256}  # GGUF bytes per weight

Spec = tuple[str, tuple[str, ...]]  # (kernels/<name>.cu, nvcc options): Runtime.module's key


def qname(qtype: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(int(qtype)).name.lower().replace("_k", "_K")
    except (ImportError, ValueError):
        return {Q4_K: "q4_K", Q6_K: "q6_K"}.get(int(qtype), f"type {qtype}")


@dataclass(frozen=True)
class Operand:
    """An activation form a family's kernel reads, made from the f16 activation.
    prepass(rt, A f16 [M, K], buf) -> the operand, in buf (the scratch buffer `scratch`
    names); norm(rt, x f32, w, eps, buf, h16 or None, t=None) -> the operand of rmsnorm(x) * w
    from the norm's launch (w None: of x itself; t f32: x += rmsnorm(t) * w in place first,
    a post-norm's residual add; None when it cannot: then the separate launches); attn(rt, buf, M, K)
    -> (the array the attention launch writes, the operand) from the attention's epilogue.
    buf: the uint8 scratch buffer named `scratch` (DeviceBuffers.operands[scratch]), of
    nbytes(M, K) bytes for the largest activation, the memory plan's part `part`.
    Forms sharing a scratch buffer never meet on one activation (the backend asserts it)."""

    name: str
    scratch: str
    prepass: Callable
    norm: Callable | None = None
    attn: Callable | None = None
    part: str = ""
    nbytes: Callable = lambda M, K: 0


@dataclass(frozen=True)
class GemmPath:
    """A path of the table. Subclasses set the class flags and implement route / upload /
    twin; the fields are the record minfer.cuda.paths.table's chooser reads."""

    name: str
    kernel: str  # the kernel entry it launches
    qtypes: frozenset | None  # GGUF types it takes; None: every type dequant takes
    archs: frozenset | None  # None: any sm_80+ GPU
    k_multiple: int  # K must be a multiple of this
    bytes_per_weight: Mapping  # qtype -> device bytes per weight (None: any type)
    variants: tuple = ()  # features a tuning variant may turn off (bench --ab)
    kd: int = 0  # wide kernels' staging depth
    gemv_f16: bool = False  # an M = 1 GEMM (the LM head) runs f16's GEMV instead
    f16_kinds: frozenset = frozenset()  # weight kinds left to f16 for accuracy (tuning
    #                                     variant exact-down; auto's tier blk-all takes them)
    experts: "ExpertGemms | None" = None  # its mixture-of-experts GEMMs (None: a plan of it
    #                                      holds the experts on another path's: plan.moe)

    int8 = False  # an int8 kernel (the MMQ families), not the exact f16 path
    via_f16 = False  # the weight goes up as f16 rows at load (dequantized on the GPU)
    glu = False  # a gate|up GEMM on it can write the swiglu / geglu from its epilogue
    rope = False  # a q|k|v GEMM on it can rope from its epilogue (f16)
    operand = None  # the Operand its kernels read (None: the f16 activation itself)

    def unsupported(self, qtype: int, arch, K: int) -> str:
        """'' when this path runs a [*, K] GEMM on a weight of `qtype` on `arch`, else why not."""
        if self.qtypes is not None and int(qtype) not in self.qtypes:
            return f"{qname(qtype)}: no {self.name} kernel"
        if self.archs is not None and arch not in self.archs:
            return f"{self.name}: {arch or 'this GPU'} is not {'/'.join(sorted(self.archs))}"
        if K % self.k_multiple:
            return f"K={K} not a multiple of {self.k_multiple}"
        return ""

    @property
    def parity_cases(self) -> tuple[str, ...]:
        """The kinds of parity case (minfer.cuda.paths.parity.KINDS) of every form the forward
        runs on this path: plain, accumulating, M = 1 and fused GEMMs always; the glu and rope
        epilogues where it has them; the operand made by the rmsnorm or attention launch where
        its operand has those producers."""
        kinds = ["f32", "acc", "gemv", "fused"]
        op = self.operand
        kinds += ["glu"] * self.glu + ["norm"] * bool(op and op.norm)
        kinds += ["attn"] * bool(op and op.attn) + ["rope"] * self.rope
        return tuple(kinds)

    def weight_bytes(self, qtype: int) -> float:
        b = self.bytes_per_weight
        return float(b[int(qtype)] if int(qtype) in b else b[None])

    # the memory plan's parts this path's weights and scratch take (sizes.plan_memory)
    weight_parts = ("MMQ weights",)
    scratch_parts = ()

    def memory(self, units, T: int, sms: int) -> tuple[dict, dict]:
        """(weights, scratch): memory plan part -> device bytes of this path's weights `units`
        ([(rows, K, file bytes, tied)], one per weight or fused group it uploads; tied: the LM
        head on the embedding's bytes) and of its scratch for T tokens (a part several paths
        share takes the largest). Here: f16 rows (via_f16), else the raw GGUF bytes (a tied
        head shares the embedding's); the operand's scratch at the largest K."""
        K = max(u[1] for u in units)
        op = self.operand
        scratch = {op.part: op.nbytes(T, K)} if op is not None else {}
        if self.via_f16:
            return {"f16 weights": sum(r * k * 2 for r, k, _, _ in units)}, scratch
        return {"MMQ weights": sum(b for _, _, b, tied in units if not tied)}, scratch

    def weight_extra(self, name: str, N: int, K: int) -> dict:
        """Memory plan part -> device bytes weight `name` [N, K] holds beside its unit's
        (`memory`): blk-split's f16 columns of ffn_down. None here."""
        return {}

    def smem(self, qtype: int) -> int | None:
        """Dynamic shared memory its kernel needs for `qtype` (the smem guard); None: no opt-in."""
        return None

    def route(self, qtype: int, choice, name: str = "") -> "LinearRoute":
        """The route object of weight `name` (its role may decide the operand) of `qtype`."""
        raise NotImplementedError

    def dest(self, rt, rows: int, K: int, row_bytes: int, name: str):
        """The device buffer fused group `name` of `rows` rows is uploaded into, made before the
        upload starts (the engine makes every group's first), or None: made by `upload`
        itself when it starts (blk: one group's f16 alive at a time)."""
        return None

    def upload(self, rt, up, parts, name: str, dst=None, glu: bool = False):
        """The one weight upload, the engine's (minfer.cuda.load.weights) and `minfer check`'s
        (upload_weight): `parts` (Part: one tensor, or a fused group's members in row order)
        streamed from host memory through up (minfer.cuda.runtime.upload.Staging; kernels on
        rt's stream = up.stream) into dst (dest's buffer; None: made here) -> (this path's
        weight, {member name: its row view} for the members the forward reads alone). glu: a
        gate|up group whose rows interleave per 16 (the glu epilogue's layout)."""
        raise NotImplementedError

    def twin(self, x, w_raw, qtype: int, M: int, N: int, K: int, name: str = ""):
        """numpy float64 [M, N] of what the route of weight `name` computes from x (f32 values
        the f16 activation holds) and the raw GGUF rows w_raw."""
        raise NotImplementedError

    def load_kernels(self) -> list[Spec]:
        """Modules the weight upload launches for this path (compiled before it)."""
        from minfer.cuda.ops.dequant import KERNEL

        return [(KERNEL, ())] if self.via_f16 else []

    opt_in = False  # only when named (--gemm): `minfer check`'s default set leaves it out

    def weight_grid(self, name: str, choice=None):
        """The CPU reference's grid of weight `name` on this path (`grid`; choice: the
        backend's GemmChoice, for a grid that depends on it)."""
        return self.grid

    # weight kinds whose kept input channels come from a calibration (blk-split: ffn_down),
    # run on a backend of path `calibrate_on` (minfer.engine.backends.bind_channels)
    calibrated_kinds = frozenset()
    calibrate_on = ""

    def kept_channels(self, mean_square):
        """The input channels a calibrated weight keeps, from its channels' mean squares."""
        raise NotImplementedError

    # the number grid of its kernels on the CPU reference (ReferenceBackend(grids=...): what
    # `minfer check` compares the path with); None: exact (f16's rounding is the reference's)
    grid = None
    # `minfer perplexity --emulate` grids: label -> Emulation (table.EMULATIONS collects them)
    emulations = {}


@dataclass(frozen=True)
class Emulation:
    """A grid `minfer perplexity --emulate LABEL` puts on the CPU reference: on the weights the
    path runs on its int8 kernel (as plan_routes routes them), or on every GEMM but the LM head
    (every); help: what it stands for (the option's help). kinds: weight kinds ("ffn_down",
    "attn_output") put on a grid of their own, whatever the path's routes say (a grid no
    kernel of the path runs yet: the emulation's own weight set, the GPU plan unchanged)."""

    grid: object
    every: bool = False
    help: str = ""
    kinds: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    """One GGUF tensor of an upload: its name, raw rows on the host (uint8 [N, row bytes], e.g.
    a view into the memory map), type and K."""

    name: str
    raw: object
    qtype: int
    K: int

    @property
    def N(self) -> int:
        return int(self.raw.shape[0])


def upload_weight(
    rt, path: GemmPath, parts, name: str = "", glu: bool = False, slot_bytes=None, channels=None
):
    """path.upload of `parts` through a staging of its own, synchronized: what `minfer check`
    and the tests run, the engine's upload on the same bytes (one call per weight or group);
    channels: GemmChoice.channels (blk-split's kept columns, as the engine's upload has them)."""
    from minfer.cuda.runtime.upload import DEFAULT_CHUNK, Staging, rows_per_chunk

    chunk = slot_bytes or DEFAULT_CHUNK  # a slot holds the largest chunk (as sizes.upload_slot)
    rb = [int(p.raw.nbytes) // max(p.N, 1) for p in parts]
    up = Staging(rt, max(min(p.N, rows_per_chunk(b, chunk)) * b for p, b in zip(parts, rb)))
    up.channels = channels
    stream, rt.stream = rt.stream, up.stream  # the kernels queue behind their copies
    try:
        w, _ = path.upload(rt, up, parts, name or parts[0].name, glu=glu)
        up.close()
    finally:
        rt.stream = stream
    rt.synchronize()
    return w


class LinearRoute:
    """One linear weight on one path: its operand form, its launches."""

    def __init__(self, path: GemmPath, qtype: int, choice, name: str = ""):
        self.path, self.qtype, self.choice, self.weight = path, int(qtype), choice, name
        self.operand = path.operand

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def glu(self) -> bool:
        return self.path.glu

    @property
    def accumulates(self) -> bool:
        """run(..., 'acc') exists: C += x @ w.T (attn_output and ffn_down's epilogue)."""
        return True

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        raise NotImplementedError

    def run_glu(self, rt, scratch, C, x, w, act: str = "silu") -> None:
        from minfer.errors import Unsupported

        raise Unsupported(f"{self.name}: no glu epilogue")

    def rope_pays(self, rt, M: int, N: int) -> bool:
        """Whether a fused q|k|v GEMM of M rows, N columns on this route should rope in its
        epilogue (run_rope) rather than write f32 for a rope launch (rope paths only)."""
        return False

    def run_rope(self, rt, scratch, x, w, rope, hi: int) -> None:
        """The fused q|k|v GEMM x @ w.T roped in its epilogue into rope's targets (a
        layers.QkvRope: q16 and the layer's K/V cache rows; hi: one past the largest slot)."""
        from minfer.errors import Unsupported

        raise Unsupported(f"{self.name}: no rope epilogue")


class ExpertGemms:
    """A path's mixture-of-experts GEMMs (GemmPath.experts): how minfer.cuda.load.moe.MoeLayers
    holds a layer's stacked experts and runs the two grouped GEMMs on the expert-sorted rows.
    name / label: for messages; bytes_per_weight: device bytes a weight (the plan takes the
    most compact experts its paths bring: plan.moe.moe_experts); bm: the sort's row tile;
    grid: the CPU reference's rounding of the stacked experts (ReferenceBackend(grids=)) or
    None (exact); requant: the f16 stacks pass through a staging buffer into `hold`."""

    name = ""
    label = ""
    bytes_per_weight = 2.0
    bm = 64
    grid = None
    requant = False
    note = ""  # what it needs, for the memory refusal's hint ("sm_90")
    parity_tol = 1e-3  # `minfer check`'s gate on a layer against ffn_ref: check.PARITY_TOL

    def stack_bytes(self, E: int, N: int, K: int) -> int:
        """Device bytes of a stacked expert weight [E, N, K] as held."""
        raise NotImplementedError

    def staging_bytes(self, c) -> int:
        """Device bytes alive while one layer's stacks are turned into the held form."""
        return 0

    def operand_bytes(self, P: int, E: int, c) -> int:
        """Device bytes of the grouped GEMMs' activation scratch for P sorted rows."""
        return 0

    def hold(self, rt, w16, name: str):
        """A layer's f16 stack [E, N, K] on the device -> the weight `run` reads."""
        return w16

    def ffn_ref(self, h16, wr, wg, wu, wd, k: int, norm_w: bool = True, w_scale: float = 0.0):
        """The numpy twins of the whole layer composed as MoeLayers.ffn runs them: h16 f16
        [T, d], router f16 [E, d], gate / up f16 [E, fe, d], down f16 [E, d, fe] -> (f32
        [T, d], sel, wts)."""
        raise NotImplementedError

    def run(self, ml, rt, il: int, h16, P: int, act, ys, perm, op) -> None:
        """act f16 [P, fe] = swiglu of the gate|up GEMM of the gathered rows h16[perm / k],
        ys f32 [P, d] = act @ down^T, per expert (ml: the MoeLayers, its weights, offsets and
        scratch; op(label, flops): the forward's profile bracket)."""
        raise NotImplementedError
