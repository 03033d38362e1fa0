"""Parity cases: each way the forward runs a GEMM path, run on the GPU against the path's numpy
twin (docs/design.md gate 1; `minfer check`). A path declares the kinds it has
(GemmPath.parity_cases); the caller makes each Case from the engine's own plan of a model (its
weights, fused groups, glu and rope groups: minfer.tools.check), so the weights are uploaded
by the path's `upload` exactly as the engine's load does and run by the route the forward uses.

| kind  | what the forward runs                                    | twin                       |
| ----- | -------------------------------------------------------- | -------------------------- |
| f32   | C = x @ W.T, the operand by the prepass                   | twin                       |
| acc   | C += x @ W.T (attn_output, ffn_down), ragged M and N      | twin + C                   |
| gemv  | M = 1 (decode, the LM head)                                | twin                       |
| fused | one GEMM on a fused q|k|v group (members as row ranges)    | each member's twin         |
| glu   | a gate|up group, rows interleaved, act(gate) * up (f16)   | act(twin gate) * twin up   |
| norm  | the operand written by the rmsnorm launch (Operand.norm)  | twin of f16(rmsnorm(x) w)  |
| attn  | the operand written by attention's epilogue (Operand.attn) | twin of attention's output |
| rope  | q|k|v roped into q16 and the KV cache (run_rope)          | f16 twin, numpy rope       |

The GPU computes everything; the float64 twin (slow in numpy at 8B shapes) is evaluated on a
sample of weight rows that always includes the first and last tiles' edges. Kernel outputs are
NaN-filled first, so a launch that did not write reads as NaN (error inf)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from minfer.cuda.paths.base import upload_weight
from minfer.cuda.runtime import devarray as da

KINDS = ("f32", "acc", "gemv", "fused", "glu", "norm", "attn", "rope")


@dataclass(frozen=True)
class Case:
    """One parity run: `kind`, the route the forward takes (LinearRoute: its path, operand and
    weight name), the weight's parts (base.Part: one tensor, or a group's members in row
    order), M rows of activation."""

    kind: str
    route: object
    parts: tuple
    M: int = 128
    ragged: bool = False  # N - 5 rows of the weight (ragged against every tile)

    @property
    def N(self) -> int:
        n = sum(p.N for p in self.parts)
        return max(1, n - 5) if self.ragged else n

    @property
    def K(self) -> int:
        return self.parts[0].K

    @property
    def name(self) -> str:
        """The weight's name, or the group's ('blk.0.attn_q|attn_k|attn_v.weight')."""
        first = self.parts[0].name
        if len(self.parts) == 1:
            return first
        head = ".".join(first.split(".")[:-2])
        return f"{head}.{'|'.join(p.name.split('.')[-2] for p in self.parts)}.weight"

    def shape(self) -> str:
        if self.kind == "glu":
            return f"{self.M}x{self.N // 2}x{self.K} glu"
        return f"{self.M}x{self.N}x{self.K}" + {"acc": " +=", "f32": "", "gemv": ""}.get(
            self.kind, f" {self.kind}"
        )


def sample_rows(rng, n: int, k: int = 256) -> np.ndarray:
    """Sorted weight-row indices: k random ones plus the first and last 8 (tile edges)."""
    edge = np.r_[np.arange(min(8, n)), np.arange(max(0, n - 8), n)]
    pick = rng.choice(n, size=min(k, n), replace=False)
    return np.unique(np.r_[edge, pick])


def scratch(rt, M: int, K: int, F: int = 0):
    """The scratch a route of [M, K] reads: every path's operand buffer (the forward's
    DeviceBuffers.operands, sized for one activation: Operand.nbytes) and, for a glu of F
    features, the f32 gate|up buffer the f16 GEMV's glu goes through at M = 1."""
    from minfer.cuda.paths.table import TABLE

    ops = {p.operand.scratch: p.operand for p in TABLE.values() if p.operand is not None}
    return SimpleNamespace(
        operands={
            k: da.empty(rt, (op.nbytes(M, K),), np.uint8, f"parity {k}") for k, op in ops.items()
        },
        gu32=da.empty(rt, (M * 2 * F,), np.float32, "parity gate|up") if F else None,
    )


def run(rt, case: Case, cfg, rng, n_sample: int = 256) -> float:
    """Relative error (Frobenius) of the GPU's case against the twin; cfg: the model config
    (rms_eps, heads, rope, the glu activation)."""
    return _RUNNERS[case.kind](rt, case, cfg, rng, n_sample)


def _err(y, ref) -> float:
    y = np.asarray(y, np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


def _twin(path, x, parts, cols, M: int) -> np.ndarray:
    """float64 [M, len(cols)]: the twin of the group's rows `cols`, member by member (their
    types may differ on the dequantizing paths)."""
    out = np.zeros((M, len(cols)))
    r0 = 0
    for p in parts:
        sel = (cols >= r0) & (cols < r0 + p.N)
        if sel.any():
            rows = np.ascontiguousarray(p.raw[cols[sel] - r0])
            out[:, sel] = path.twin(x, rows, p.qtype, M, int(sel.sum()), p.K, p.name)
        r0 += p.N
    return out


def _weight(rt, case: Case, glu: bool = False):
    """The path's upload of the case's rows (the first N of a lone weight: acc's ragged N)."""
    parts = case.parts
    if case.ragged:
        p = parts[0]
        parts = (type(p)(p.name, np.ascontiguousarray(p.raw[: case.N]), p.qtype, p.K),)
    name = case.route.weight if len(parts) == 1 else parts[0].name.replace(".weight", ".group")
    return upload_weight(rt, case.route.path, list(parts), name, glu=glu)


def _operand(rt, route, xd, s):
    op = route.operand
    return xd if op is None else op.prepass(rt, xd, s.operands[op.scratch])


def _linear(rt, case: Case, cfg, rng, n_sample: int) -> float:
    """f32, acc, gemv, fused: C (=, +=) x @ W.T on the route, the operand by its prepass."""
    M, N, K, route = case.M, case.N, case.K, case.route
    acc = case.kind == "acc"
    cols = sample_rows(rng, N, n_sample)
    x16 = rng.standard_normal((M, K)).astype(np.float16)  # as the forward's h16
    ref = _twin(route.path, x16.astype(np.float32), case.parts, cols, M)
    base = (
        rng.standard_normal((M, N)).astype(np.float32) * float(np.abs(ref).mean())
        if acc
        else np.full((M, N), np.nan, np.float32)
    )
    w = _weight(rt, case)
    out = da.to_device(rt, base, "parity out")
    s = scratch(rt, M, K)
    xin = _operand(rt, route, da.to_device(rt, x16, "parity x"), s)
    route.run(rt, s, out, xin, w, "acc" if acc else "f32")
    y = out.get()[:, cols].astype(np.float64)
    return _err(y - base[:, cols] if acc else y, ref)


def _glu(rt, case: Case, cfg, rng, n_sample: int) -> float:
    """A gate|up group uploaded interleaved (glu_rows) -> f16 act(gate) * up from the
    epilogue (run_glu: the route's, at M = 1 the f16 GEMV then the interleaved launch)."""
    from minfer.reference.ops import geglu, swiglu

    M, K, route = case.M, case.K, case.route
    gate, up = case.parts
    F = gate.N
    act = "gelu" if cfg.ffn_gelu else "silu"
    cols = sample_rows(rng, F, n_sample)
    x16 = rng.standard_normal((M, K)).astype(np.float16)
    x = x16.astype(np.float32)
    g = _twin(route.path, x, (gate,), cols, M)
    u = _twin(route.path, x, (up,), cols, M)
    ref = (geglu if act == "gelu" else swiglu)(g, u)
    w = _weight(rt, case, glu=True)
    out = da.to_device(rt, np.full((M, F), np.nan, np.float16), "parity glu out")
    s = scratch(rt, M, K, F)
    route.run_glu(rt, s, out, _operand(rt, route, da.to_device(rt, x16, "parity x"), s), w, act)
    return _err(out.get()[:, cols], ref)


def _norm(rt, case: Case, cfg, rng, n_sample: int) -> float:
    """The operand made by the rmsnorm launch (Operand.norm; the tuning variant
    no-fused-prepass runs the f32 case's prepass instead), then the route's GEMM; for a
    family without pre-norms (olmo2) also its two forms, of the residual itself and of the
    residual after a post-norm's add (x + rmsnorm(t) * w): the worst of them."""
    from minfer.reference import ops

    M, N, K, route = case.M, case.N, case.K, case.route
    cols = sample_rows(rng, N, n_sample)
    x32 = rng.standard_normal((M, K)).astype(np.float32)  # the residual
    t32 = (3 * rng.standard_normal((M, K))).astype(np.float32)  # a post-norm's input
    wn = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)  # the norm's weight
    forms = [(wn, None, ops.rmsnorm(x32, wn, cfg.rms_eps))]
    if not getattr(cfg, "pre_norms", True):
        forms += [(None, None, x32), (wn, t32, x32 + ops.rmsnorm(t32, wn, cfg.rms_eps))]
    w = _weight(rt, case)
    s = scratch(rt, M, K)
    op = route.operand
    worst = 0.0
    for wf, t, h in forms:
        ref = _twin(route.path, h.astype(np.float16).astype(np.float32), case.parts, cols, M)
        xin = op.norm(
            rt,
            da.to_device(rt, x32, "parity residual"),
            None if wf is None else da.to_device(rt, wf, "parity norm"),
            cfg.rms_eps,
            s.operands[op.scratch],
            None,
            t=None if t is None else da.to_device(rt, t, "parity post-norm input"),
        )
        if xin is None:  # K over the fused kernel's: the forward runs the separate launches
            return float("nan")
        out = da.to_device(rt, np.full((M, N), np.nan, np.float32), "parity out")
        route.run(rt, s, out, xin, w, "f32")
        e = _err(out.get()[:, cols], ref)
        worst = e if not e <= worst else worst  # (a NaN error stays NaN: a failure)
    return worst


def _attn(rt, case: Case, cfg, rng, n_sample: int) -> float:
    """The operand written by the attention launch's epilogue (Operand.attn: M tokens of one
    sequence, the model's heads), then the route's GEMM accumulating (attn_output's);
    the twin reads the attention's own f16 output, written beside the operand."""
    from minfer.cuda.ops import attention as A
    from minfer.cuda.ops import layers as L

    M, N, K, route = case.M, case.N, case.K, case.route
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    if not A.operand_fuses(rt, M, H // Hkv, D):
        return float("nan")  # the forward then writes f16 and runs the prepass (the f32 case)
    cols = sample_rows(rng, N, n_sample)
    f16 = lambda *s: da.to_device(rt, rng.standard_normal(s).astype(np.float16))  # noqa: E731
    q, kc, vc = f16(M, H, D), f16(M, Hkv, D), f16(M, Hkv, D)
    o = da.to_device(rt, np.full((M, H, D), np.nan, np.float16), "parity attention out")
    s = scratch(rt, M, K)
    tt, xin = route.operand.attn(rt, s.operands[route.operand.scratch], M, K)
    tok = da.to_device(rt, L.tok_layout(0, M))
    A.attention(rt, o, q, kc, vc, 0, tok, M, operand=tt, o_out=True)
    w = _weight(rt, case)
    base = rng.standard_normal((M, N)).astype(np.float32)
    out = da.to_device(rt, base, "parity out")
    route.run(rt, s, out, xin, w, "acc")
    x = o.get().reshape(M, K).astype(np.float32)
    ref = _twin(route.path, x, case.parts, cols, M)
    return _err(out.get()[:, cols] - base[:, cols], ref)


def _rope(rt, case: Case, cfg, rng, n_sample: int) -> float:
    """A q|k|v group roped from the GEMM's epilogue (run_rope) into q16 and the K/V cache
    rows of M tokens at positions 0 .. M - 1 (the model's heads, rope_dim and base; no
    scaling: the epilogue reads whatever table it is given) against the f16 twin's product,
    roped in numpy (gemm_f16_nt_ref's rope)."""
    from minfer.cuda.ops import layers as L
    from minfer.cuda.ops.dequant import dequant_f16_ref
    from minfer.cuda.paths.f16.gemm import RopeRef, gemm_f16_nt_ref

    M, K, route = case.M, case.K, case.route
    H, Hkv, D, rd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dim
    x16 = rng.standard_normal((M, K)).astype(np.float16)
    w16 = np.concatenate([dequant_f16_ref(p.raw, p.qtype, p.N, K) for p in case.parts])
    tq, tk, tv = gemm_f16_nt_ref(x16, w16, rope=RopeRef(H * D, Hkv * D, D, rd, cfg.rope_base))
    nan = lambda *s: da.to_device(rt, np.full(s, np.nan, np.float16))  # noqa: E731
    q16, kc, vc = nan(M, H, D), nan(M, Hkv, D), nan(M, Hkv, D)
    table = L.RopeTable.build(rt, M, cfg.rope_base, rd)
    tok = da.to_device(rt, L.tok_layout(0, M))
    target = L.QkvRope(rt, q16, kc, vc, table, tok, rd, neox=False)
    w = _weight(rt, case)
    route.run_rope(rt, scratch(rt, M, K), da.to_device(rt, x16, "parity x"), w, target, M)
    got = np.concatenate([a.get().reshape(M, -1) for a in (q16, kc, vc)], axis=1)
    return _err(got, np.concatenate([tq, tk, tv], axis=1).astype(np.float64))


_RUNNERS = {
    "f32": _linear,
    "acc": _linear,
    "gemv": _linear,
    "fused": _linear,
    "glu": _glu,
    "norm": _norm,
    "attn": _attn,
    "rope": _rope,
}
