"""The gates `minfer check -m FILE [--gemm NAME]` runs (minfer.commands.check: its flags and
tables): the parity gate and greedy-32 identity over the GEMM path table
(minfer.cuda.paths.TABLE; --gemm: one path only), and the packed-batch rows.

1. Parity (docs/design.md gate 1): every path of the table against its numpy twin (the path
   object's `twin`: f16 on the f16-rounded operands, the raw int8 paths on the q8_1 grid, blk on
   its rotated int8 grids) in every form the forward runs it (minfer.cuda.paths.parity: its
   parity cases, GemmPath.parity_cases): on each distinct (type, N, K) of the model's GEMM
   weights the path takes (real weights, random activations) M = 128, ragged M = 37 with N - 5
   rows (accumulate mode where the route has one), and M = 1; then a fused group, the glu
   epilogue, the operand made by the rmsnorm launch and by attention's epilogue, and the rope
   epilogue, where the path has them, on the groups the engine's own plan makes. The GPU side
   runs exactly what the forward runs: the path's `upload` (the engine's load calls the same),
   its route's operand and launch. A path this GPU cannot run (blk off sm_90) is said once; the
   smem guard's fallback is named in the row. Gate: rel err (Frobenius) <= 1e-3. A
   mixture-of-experts model adds its MoE FFN rows (moe_rows: the device's routing, grouping and
   grouped GEMMs against the twins, on the first and last layers' real experts, tie-aware about
   the router).
2. greedy-32 identity (gate 3, tie-aware, minfer.tools.gates.compare_greedy): every path of the table
   and the CPU reference (ReferenceBackend, f32) decode 32 greedy tokens from the prompt. Each
   GPU path is compared to the CPU reference with tau = 2 * max|logit diff| at the last prompt
   position between the two engines (stated per row); exact n/32 counts reported.
   The int8 paths are compared with a reference whose int8-routed weights see their input
   through the grid of their kernel (ReferenceBackend grids, GemmPath.grid): the rounding
   the kernels do on purpose is then in both engines. Measured on SmolLM2 (11-layer slice,
   Q4_K_M requant: 11 MMQ weights): every MMQ path 32/32 exact, max|dlogit| 0.10 (tau 0.20),
   where against plain f32 it was 18/32 with a near-tie stop at step 1.
Runs in poison mode (RuntimeConfig.poison; CUDA graphs stay on, so the gate sees the path
prefill runs): every kernel output is NaN-filled before its launch, so a kernel that did not
run reads as NaN, never as stale numbers. A path whose backend raises (non-finite logits, a
kernel failure) is a FAIL row naming the error; the other paths still run.
The command prints tables and exits 1 when anything fails or could not be run.
"""

from __future__ import annotations

import gc

import click
import numpy as np

from minfer.reference import ops

QNAME = {12: "q4_K", 14: "q6_K"}
PARITY_TOL = 1e-3


def gemm_weight_shapes(model, path=None) -> dict[tuple[int, int, int], str]:
    """(qtype, N, K) -> first weight name, for the model's GEMM weights `path` (a TABLE record;
    None: the raw int8 paths) takes (any arch)."""
    from minfer.cuda.paths import TABLE

    path = path or next(p for p in TABLE.values() if p.int8 and p.archs is None)
    from minfer.cuda.plan.routes import linear_names

    names = linear_names(model)  # the family's layer schema's GEMM weights, the LM head
    shapes: dict[tuple[int, int, int], str] = {}
    for name in names:
        t = model.tensor(name)
        N, K = (int(s) for s in t.shape)
        if not path.unsupported(t.qtype, next(iter(path.archs or [None])), K):
            shapes.setdefault((int(t.qtype), N, K), name)
    return shapes


def table_paths(gemm: str | None = None):
    """The TABLE records check runs: all but the opt-in ones (GemmPath.opt_in: blk-split), or
    the one --gemm names (mmq: the seeds' config)."""
    from minfer.cuda.paths import TABLE
    from minfer.cuda.plan.config import gemm_choice

    if gemm in (None, "auto"):
        return [p for p in TABLE.values() if not p.opt_in]
    return [TABLE[gemm_choice(gemm).path]]


def parity_cases(rt, model, path) -> list[tuple[object, str]]:
    """[(parity.Case, the path label of its row)] of `path` (a TABLE record) on `model`: on
    each distinct (type, N, K) of the model's weights the path takes, M = 128, ragged M = 37
    with N - 5 rows (accumulating where the route does) and M = 1 (choose_path's route: the
    smem guard's fallback, an M = 1 GEMM left to f16's GEMV); then one case of each other kind
    the path declares (GemmPath.parity_cases: fused, glu, norm, attn, rope) on the first layer
    where the engine's own plan for the path (routes, fusion, glu and rope groups) runs it."""
    from minfer.cuda.paths import TABLE, Part, choose_path
    from minfer.cuda.paths.parity import Case
    from minfer.cuda.plan import fusion
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.routes import plan_routes

    def part(name: str) -> Part:
        t = model.tensor(name)
        N, K = (int(s) for s in t.shape)
        return Part(name, np.ascontiguousarray(t.data).view(np.uint8).reshape(N, -1), t.qtype, K)

    out = []
    for (qt, N, K), name in gemm_weight_shapes(model, path).items():
        for kind, M, ragged in (("f32", 128, False), ("acc", 37, True), ("gemv", 1, False)):
            n = max(1, N - 5) if ragged else N
            r = choose_path(qt, rt.arch, (M, n, K), path.name, rt.smem_optin)
            route = r.path.route(qt, GemmChoice(r.path.name), name)
            kind = "f32" if kind == "acc" and not route.accumulates else kind  # (blk's per-
            # token GEMMs never add to C)
            ran = path.name if r.path is path else f"{path.name} [{r.path.name}]"
            out.append((Case(kind, route, (part(name),), M, ragged), ran))
    choice = GemmChoice(path.name)
    routes = plan_routes(model, choice, rt, 512)
    fused = fusion.plan_fusion(model, routes)
    glu = fusion.plan_glu(model, choice, routes, fused)
    rope = fusion.plan_rope(model, choice, routes, fused)
    want = set(path.parity_cases) - {"f32", "acc", "gemv"}
    for il in range(model.config.n_layers):
        for kind in ("attn", "ffn"):
            for g in fusion.plan_groups(model, fused, il, kind):
                if TABLE[routes[g.member][0]] is not path:
                    continue
                members = [n for n in fused if fused[n][0] == g.weight] or [g.member]
                members.sort(key=lambda n: fused[n][1] if n in fused else 0)  # row order
                parts = tuple(part(n) for n in members)
                route = path.route(parts[0].qtype, choice, g.member)
                new = []
                if g.weight in glu:
                    new += [Case("glu", route, parts, 128), Case("glu", route, parts, 1)]
                elif len(parts) > 1:
                    new.append(Case("fused", route, parts, 128))
                if g.weight in rope:
                    new.append(Case("rope", route, parts, 128))
                if kind == "attn" and route.operand is not None and route.operand.norm:
                    new.append(Case("norm", route, parts, 128))  # the operand of q|k|v's input
                for c in new:
                    if c.kind in want:
                        out.append((c, path.name))
                want -= {c.kind for c in new if c.M > 1}
        o = f"blk.{il}.attn_output.weight"
        if "attn" in want and o in routes and TABLE[routes[o][0]] is path:
            route = path.route(model.tensor(o).qtype, choice, o)
            if route.operand is not None and route.operand.attn:
                out.append((Case("attn", route, (part(o),), 128), path.name))
                want.discard("attn")
    return out


def parity_rows(rt, model, seed: int = 0, n_sample: int = 256, paths=None, echo=click.echo):
    """[(what, path, shape, rel_err, ok)] for each path (TABLE records; default all) on its
    parity cases on the model (parity_cases), against its numpy twin. A kind the path declares
    but the model gives no weight for (or this GPU does not run there: the attention epilogue
    off the wgmma kernel, a norm wider than the fused kernel) is said once."""
    from minfer.cuda.paths import parity

    rng = np.random.default_rng(seed)  # the linear cases' numbers
    more = np.random.default_rng([seed, 1])  # the other kinds'
    rows = []
    for p in paths or table_paths():
        if p.archs is not None and rt.arch not in p.archs:
            echo(
                f"(parity: {p.name} needs {'/'.join(sorted(p.archs))}, this GPU is {rt.arch}: "
                "not run)"
            )
            continue
        ran = set()
        for case, label in parity_cases(rt, model, p):
            r = rng if case.kind in ("f32", "acc", "gemv") and len(case.parts) == 1 else more
            err = parity.run(rt, case, model.config, r, n_sample)
            if np.isnan(err):
                continue
            ran.add(case.kind)
            types = "+".join(dict.fromkeys(_qname(q.qtype) for q in case.parts))
            what = f"{types} {case.name}"
            rows.append((what, label, case.shape(), err, err <= PARITY_TOL))
        if set(p.parity_cases) - ran:
            echo(
                f"(parity: {p.name}: not run here: {', '.join(sorted(set(p.parity_cases) - ran))})"
            )
    return rows


def moe_experts_of(rt, paths) -> list:
    """The expert GEMMs (GemmPath.experts) of the checked `paths` that this GPU runs, each
    once; f16's when none of them brings its own."""
    from minfer.cuda.paths.f16.moe import F16_EXPERTS

    out = []
    for p in paths:
        ex = p.experts
        if ex is not None and ex not in out and (p.archs is None or rt.arch in p.archs):
            out.append(ex)
    return out or [F16_EXPERTS]


def moe_rows(rt, model, seed: int = 0, layers=None, experts=None):
    """[(what, path, shape, rel_err, ok)]: a mixture-of-experts model's FFN on the GPU (router
    GEMM, route, sort, grouped GEMMs, combine: minfer.cuda.load.moe.MoeLayers.ffn, what the forward
    runs) with each of `experts` (ExpertGemms; None: f16's) against its numpy twins composed
    (ExpertGemms.ffn_ref) on the layer's real weights (the first and the last layer, as f16
    stacks: what the device holds or requantizes) and random f16 activations, M = 128, 37 and
    1. Tie-aware: a row the GPU routed otherwise than the twin is left out when its router gap
    is a near-tie (< 1e-3), else it fails the row. Gate: rel err (Frobenius) <= the experts'
    parity_tol (f16's: PARITY_TOL)."""
    from contextlib import nullcontext

    from minfer.cuda.load.moe import MoeLayers
    from minfer.cuda.paths.f16.moe import F16_EXPERTS, shared_ref
    from minfer.cuda.plan.config import moe_kernel
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import moe as R

    c = model.config
    rows = []
    kernel = moe_kernel()  # the forward's (CudaBackend's)
    SHARED = ("ffn_gate_inp_shexp.weight", "ffn_gate_up_shexp.weight", "ffn_down_shexp.weight")
    experts = experts or [F16_EXPERTS]
    rngs = [np.random.default_rng(seed) for _ in experts]  # the same activations for each
    for il in layers if layers is not None else sorted({0, c.n_layers - 1}):
        p = f"blk.{il}."
        w = {  # (dequantized once for every experts' rows)
            s: model.dequant(p + s + ".weight").astype(np.float16)
            for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
        }
        for ex, rng in zip(experts, rngs):
            label = f"moe-{kernel}" if ex is F16_EXPERTS else f"moe-{ex.name}"
            ml = MoeLayers(rt, model, 128, 64 << 20, layers=[il], kernel=kernel, experts=ex)
            for T in (128, 37, 1):
                h16 = rng.standard_normal((T, c.d_model)).astype(np.float16)
                x = da.to_device(rt, np.zeros((T, c.d_model), np.float32), "moe check x")
                ml.ffn(rt, il, x, da.to_device(rt, h16, "moe check h"), lambda *a: nullcontext())
                got = x.get().astype(np.float64)
                sel = da.rows(ml.sel, 0, T).get()
                want, rsel, _ = ex.ffn_ref(h16, *w.values(), c.n_expert_used, ml.norm_w, ml.w_scale)
                if ml.fs:  # qwen2moe: + the shared expert (f16 GEMMs whatever the experts' path)
                    shared_ref(want, h16, *(ml.w[p + n].get() for n in SHARED))
                alike = (sel == rsel).all(axis=1)
                _, _, gap = R.route(da.rows(ml.logits, 0, T).get(), c.n_expert_used)
                stray = int((~alike & (np.abs(gap) >= 1e-3)).sum())  # routed otherwise, no tie
                err = (
                    float(
                        np.linalg.norm(got[alike] - want[alike])
                        / max(np.linalg.norm(want[alike]), 1e-30)
                    )
                    if np.isfinite(got).all() and alike.any()
                    else float("inf")
                )
                what = f"moe {p}ffn ({c.n_expert} x {c.d_ff_exp}, {c.n_expert_used} used)"
                ties = f", {int((~alike).sum())} tie rows out" if (~alike).any() else ""
                shape = f"{T}x{c.d_model}x{c.d_ff_exp}{ties}"
                rows.append((what, label, shape, err, err <= ex.parity_tol and not stray))
            del ml
            gc.collect()
    return rows


def _qname(qt: int) -> str:
    from minfer.cuda.paths import qname

    return qname(qt)


def identity_verdict(ref, res):
    """(GreedyVerdict, max|logit diff|) of engine result `res` vs the CPU reference `ref`."""
    from minfer.tools import gates

    diff = gates.logit_error(res.last_logits, ref.last_logits)
    v = gates.compare_greedy(res.greedy_ids, ref.greedy_ids, ref.step_margins, 2.0 * diff)
    return v, diff


def prompt_ids(model, prompt: str, echo=click.echo) -> list[int]:
    """The prompt's token ids; a model whose tokenizer minfer cannot build gets 16 fixed
    pseudo-random ids instead (said on one line): identity needs ids, not text."""
    from minfer.errors import BadInput, MinferError
    from minfer.text.tokenizer import Tokenizer

    try:
        ids = Tokenizer.from_metadata(model.metadata).encode(prompt)
    except MinferError as e:
        ids = [int(i) for i in np.random.default_rng(0).integers(0, model.config.vocab_size, 16)]
        echo(f"(tokenizer unavailable: {e}; using 16 fixed pseudo-random token ids)")
    if not ids:
        raise BadInput(f"prompt {prompt!r} encodes to no tokens")
    return ids


def reference_grids(
    routes: dict[str, tuple[str, str]], model=None, experts=None, choice=None
) -> dict:
    """weight name -> the grid of its path's kernels (GemmPath.grid) for every weight on an
    int8 path: ReferenceBackend(grids=...) rounds their inputs (blk: and weights) as they do;
    with `model`, a mixture-of-experts model's stacked experts too where the plan's expert
    GEMMs round them (`experts`, the plan's; None: minfer.cuda.plan.moe.moe_experts(routes));
    choice: the backend's GemmChoice (a weight's grid may depend on it: GemmPath.weight_grid,
    blk-split's kept channels)."""
    from minfer.cuda.paths import TABLE
    from minfer.cuda.plan.moe import EXPERTS, is_moe, moe_experts

    out = {n: TABLE[p].weight_grid(n, choice) for n, (p, _) in routes.items()}
    out = {n: g for n, g in out.items() if g is not None}
    moe = model is not None and is_moe(model.config)
    grid = (experts or moe_experts(routes)).grid if moe else None
    if grid is not None:
        for il in range(model.config.n_layers):
            out.update({f"blk.{il}.{s}.weight": grid for s in EXPERTS})
    return out


def identity_rows(model, prompt: str, n_greedy: int = 32, echo=click.echo, paths=None):
    """[(path, exact, n, max_diff, tau, detail, ok)] greedy identity of every path (TABLE
    records; default all) vs the CPU reference (tie-aware)."""
    from minfer.batch import single
    from minfer.cuda.plan.config import GemmChoice
    from minfer.engine.backends import make_backend
    from minfer.errors import GPUError
    from minfer.reference.forward import ReferenceBackend

    ids = prompt_ids(model, prompt, echo)
    refs = {(): single.run(ReferenceBackend(model), ids, n_greedy, 512)}
    gc.collect()
    rows = []
    max_tokens = max(64, len(ids) + n_greedy)
    for p in paths or table_paths():
        path = p.name
        be = None
        try:
            be = make_backend("cuda", model, GemmChoice(path), max_tokens, 512, None, False, True)
            echo(f"{path:<13} {be.route_summary()}")
            echo(f"{'':<13} memory {be.memory.line()}")
            res = single.run(be, ids, n_greedy, 512)
        except GPUError as e:  # e.g. non-finite logits: this path fails, the others still run
            echo(f"{path:<13} error: {e}")
            rows.append((path, 0, n_greedy, float("inf"), float("nan"), f"error: {e}", False))
        else:
            # the reference rounds the inputs of exactly the weights this path runs on MMQ,
            # through the grid of the kernel that runs them (q8_1; blk's rotated int8)
            grids = reference_grids(be.routes, model, be.plan.moe, be.gcfg)
            by_grid: dict[str, list[str]] = {}  # grid name -> its weights
            for n, g in grids.items():
                by_grid.setdefault(g.name, []).append(n)
            key = tuple(sorted((k, tuple(sorted(v))) for k, v in by_grid.items()))
            if key not in refs:
                refs[key] = single.run(ReferenceBackend(model, grids=grids), ids, n_greedy, 512)
            v, diff = identity_verdict(refs[key], res)
            ref_name = "cpu" + "".join(
                f"+{k} ({len(v_)} weights)" for k, v_ in sorted(by_grid.items())
            )
            rows.append((path, v.exact, v.n, diff, v.tau, f"vs {ref_name}: {v.describe()}", v.ok))
        del be
        gc.collect()  # free this backend's device memory before the next one
    return rows


def batch_prompts(model, ub: int, seed: int = 0) -> list[np.ndarray]:
    """The batch row's prompts: ragged lengths 1 .. ub + 1 (one spanning two chunks of ub), a
    duplicate, two sharing a 24-token prefix with a third."""
    rng = np.random.default_rng(seed)
    r = lambda n: rng.integers(0, model.config.vocab_size, n).astype(np.int32)  # noqa: E731
    ps = [r(n) for n in (1, 2, 7, ub - 1, ub, ub + 1, 33)]
    head = r(24)
    ps += [ps[2].copy()] + [np.concatenate([head, r(n)]) for n in (1, 9, 40)]
    return ps


def bucket_of(n: int) -> int:
    """The row count a batched decode step of n sequences runs at (minfer.batch.run)."""
    from minfer.batch import run as runner
    from minfer.batch import schedule

    return schedule.bucket(n, runner.DECODE_BUCKETS)


def decode_gap(be, ids, first, m: int) -> float:
    """max |difference| of the logsumexp and of the top logit between one decode step run
    alone (forward, M = 1) and the same token in a packed step of m rows: the GEMMs' numbers
    depend on M (their tiles and variants), so a batched decode may differ from a lone one
    by more than the prompt rows do; the tie-aware gate's tau must cover it."""
    seq = np.concatenate([np.asarray(ids, np.int32), np.asarray(first, np.int32)])
    be.reset()
    be.forward(seq[:-1], 0)
    a = be.forward(seq[-1:], len(seq) - 1)
    t = int(a.argmax())
    lse = float(ops.row_stats(a[None], np.array([t], np.int32))[0, 3])
    be.reset()
    be.forward(seq[:-1], 0)
    tok = np.array([[len(seq) - 1, 0]] * m, np.int32)
    st = be.packed(np.repeat(seq[-1:], m), tok, np.array([0]), np.array([t]))
    return max(abs(float(st[0, 3]) - lse), abs(float(st[0, 2] + st[0, 3]) - float(a[t])))


def batch_rows(model, echo=click.echo, paths=None, ub: int = 64, n_greedy: int = 32):
    """[(path, exact prompts, n, max |dlogprob|, tau, detail, ok)]: every path's packed run of
    batch_prompts (chunks of ub tokens, shared prefixes on) against each prompt alone on the
    same path (tie-aware greedy-32 per prompt; tau = 2 * the largest difference measured
    between the batch and the lone runs: the prompt rows' log-probs, and a decode step's top
    logit and logsumexp at M = 1 against the batch's decode rows (decode_gap); at least
    1e-3)."""
    from minfer.batch import single
    from minfer.cuda.plan.config import GemmChoice
    from minfer.engine.api import Engine
    from minfer.errors import GPUError
    from minfer.tools import gates

    prompts = batch_prompts(model, ub)
    rows = []
    for p in paths or table_paths():
        eng = None
        try:
            eng = Engine(model, "cuda", GemmChoice(p.name), ub)
            got = {}
            eng.run(
                enumerate(prompts),
                [len(x) for x in prompts],
                n_greedy,
                lambda r: got.__setitem__(r.key, r),
                logprobs=True,
            )
            be, dlp, alone = eng.backend, 0.0, []
            m_dec = bucket_of(len(prompts))
            for i, ids in enumerate(prompts):
                alone.append(single.run(be, ids, n_greedy, ub, warmup=False))
                if len(ids) > 1:  # every prompt row's log-prob, alone (the numpy twin's)
                    ref = ops.row_stats(be.window_logits(ids, 0)[:-1], ids[1:])[:, 2]
                    dlp = max(dlp, float(np.abs(got[i].logprobs - ref).max()))
                dlp = max(dlp, decode_gap(be, ids, alone[-1].greedy_ids[:1], m_dec))
            tau = max(2 * dlp, 1e-3)
            vs = [
                gates.compare_greedy(got[i].greedy, a.greedy_ids, a.step_margins, tau)
                for i, a in enumerate(alone)
            ]
            bad = [i for i, v in enumerate(vs) if not v.ok]
            exact = sum(v.exact == v.n for v in vs)
            detail = (
                f"{exact}/{len(vs)} prompts 32/32 exact"
                if not bad
                else f"prompt {bad[0]}: {vs[bad[0]].describe()}"
            )
            rows.append((p.name, exact, len(vs), dlp, tau, detail, not bad))
        except GPUError as e:
            echo(f"{p.name:<13} batch error: {e}")
            rows.append((p.name, 0, len(prompts), float("inf"), float("nan"), f"error: {e}", False))
        del eng
        gc.collect()
    return rows
