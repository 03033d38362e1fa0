"""The mixture-of-experts FFN of the CUDA backend (qwen3moe, Mixtral-style llama + experts):
weights, buffers and the launches of one layer, over the kernels of kernels/moe.cu
(launchers and numpy twins: minfer.cuda.ops.moe). The CPU oracle is minfer.reference.moe.

Per layer, on the normed activations h16 f16 [T, d] (the forward's ffn_norm output) of T rows,
E experts, k used per token, P = T k (token, slot) pairs:
  logits f32 [T, E] = h16 @ router.T         (gemm_f16_nt: the router as f16 [E, d])
  sel, wts [T, k]   = route(logits)           (softmax, top k, renormalized: moe.route's rules)
  offs, toff, perm, rowpos = sort(sel)        (the pairs grouped by expert)
  act f16 [P, fe]   = grouped GEMM: silu(h16[perm / k] @ gate[e].T) * (... @ up[e].T), the
                      gate|up stack interleaved per 16 rows (the dense f16 glu layout)
  ys f32 [P, d]     = grouped GEMM: act @ down[e].T
  x += combine(ys, wts)                       (rank order, as ggml adds the weighted views)
qwen2moe's shared expert then (every token; weights f16, uploaded as the dense f16 path does,
its GEMMs the dense f16 GEMM's):
  gl f32 [T, 1]     = h16 @ ffn_gate_inp_shexp   (gemm_f16_nt, N = 1)
  sact f16 [T, fs]  = silu(h16 @ gate.T) * (h16 @ up.T)   (gemm_f16_nt's glu epilogue)
  sy f32 [T, d]     = sact @ down.T
  x += sigmoid(gl) * sy                       (moe_shared_add_f32)
Nothing leaves the device (no host sync: the grouped GEMMs' grids are their worst case), so a
chunk with MoE layers is captured and replayed as a CUDA graph like a dense one.

Weights: the router f16; the experts held and their two grouped GEMMs run by the plan's expert
GEMMs (GemmPath.experts, chosen with the routes: minfer.cuda.plan.moe.moe_experts, blk's when
the plan's GEMMs run on blk, else f16's):
- f16: every expert dequantized to f16 on the GPU at load ([E, N, K] per stacked tensor, as
  the dense f16 path holds its weights; ~2 B a weight: a 30B-A3B's experts are ~58 GB, a
  Mixtral-8x7B's ~90 GB, past one 80 GB H100: minfer.cuda.plan.moe.check_fits refuses naming
  the bytes); the grouped GEMMs of kernels/moe.cu (minfer.cuda.paths.f16.moe).
- blk (sm_90): each expert dequantized to f16 (one layer's stacks at a time: the plan's "MoE
  requant staging"), then requantized to the dense blk path's int8 weight operand (Hadamard-
  rotated, one f32 scale per (row, 256 of K): ~1.03 B a weight, rows padded to 128 per
  expert); the grouped GEMMs of kernels/mmq_blk.cu (minfer.cuda.paths.blk.moe): the sort on
  128-row tiles, the gathered normed rows' token operand (one scale per token, as the dense
  gate|up) -> the gate|up GEMM with the swiglu epilogue -> act's operand (per (token, 128))
  -> the down GEMM into ys; the combine is the same. ffn_down's experts run on blk too (the
  dense blk path keeps its ffn_down on f16 for gate 6; the experts' bytes are the point here).
"""

from __future__ import annotations

import numpy as np

from minfer.cuda.ops import moe as M
from minfer.cuda.paths.f16.moe import F16_EXPERTS
from minfer.cuda.plan.moe import EXPERTS
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


class MoeLayers:
    """Every MoE layer's device weights and the shared buffers for ubatch tokens; `ffn` runs
    one layer (module docstring)."""

    def __init__(
        self,
        rt,
        model,
        ubatch: int,
        chunk: int,
        layers=None,
        kernel: str = "mma",
        experts=F16_EXPERTS,
    ):
        """layers: the layers whose weights go up (None: all; `minfer check` takes one);
        kernel: the f16 grouped GEMMs' (ops.moe.KERNELS: "mma", the pipelined tile; "wmma", the
        simple control); experts: the path's expert GEMMs (GemmPath.experts: the plan's
        plan.moe, moe.moe_experts)."""
        c = self.c = model.config
        if kernel not in M.KERNELS:
            raise GPUError(f"MINFER_MOE_GEMM={kernel!r}: expected one of {', '.join(M.KERNELS)}")
        self.kernel, self.experts = kernel, experts
        self.bm = experts.bm  # the sort's row tile: the GEMMs'
        if c.d_ff_exp % 8:
            raise GPUError(
                f"cuda backend: expert width {c.d_ff_exp} is not a multiple of 8 (the grouped "
                "GEMMs' interleaved gate|up rows)"
            )
        self.layers = list(range(c.n_layers)) if layers is None else [int(i) for i in layers]
        self.E, self.k, self.fe, self.d = c.n_expert, c.n_expert_used, c.d_ff_exp, c.d_model
        if c.post_norms or c.residual_scale != 1.0 or c.ffn_gelu:
            raise GPUError("cuda backend: MoE with post norms, residual scales or GeGLU")
        if c.moe_gating != "softmax":
            raise GPUError(f"cuda backend: MoE gating {c.moe_gating!r} (softmax only)")
        self.norm_w, self.w_scale = bool(c.moe_norm_w), float(c.moe_w_scale)
        self.fs = int(getattr(c, "d_ff_shexp", 0))  # qwen2moe's shared expert (0: none)
        if self.fs % 8:
            raise GPUError(
                f"cuda backend: shared expert width {self.fs} is not a multiple of 8 (the f16 "
                "GEMM's interleaved gate|up rows)"
            )
        self.w: dict[str, object] = {}
        self.nbytes = 0  # file bytes read
        self._upload(rt, model, chunk)
        T, E, k = ubatch, self.E, self.k
        P = T * k
        e = da.empty
        self.logits = e(rt, (T, E), np.float32, "moe router logits")
        self.sel = e(rt, (T, k), np.int32, "moe selected experts")
        self.wts = e(rt, (T, k), np.float32, "moe expert weights")
        self.offs = e(rt, (E + 1,), np.int32, "moe expert row offsets")
        self.toff = e(rt, (E + 1,), np.int32, "moe expert tile offsets")
        self.perm = e(rt, (P,), np.int32, "moe sorted row -> pair")
        self.rowpos = e(rt, (P,), np.int32, "moe pair -> sorted row")
        self.act = e(rt, (P, self.fe), np.float16, "moe expert activations")
        self.ys = e(rt, (P, self.d), np.float32, "moe expert outputs")
        if self.fs:  # the shared expert's gate logits, SwiGLU and output
            self.sgl = e(rt, (T, 1), np.float32, "moe shared gate logits")
            self.sact = e(rt, (T, self.fs), np.float16, "moe shared expert activations")
            self.sy = e(rt, (T, self.d), np.float32, "moe shared expert output")
        self.tt = None  # the grouped GEMMs' activation operands (blk's: gate|up's, down's)
        n = experts.operand_bytes(P, E, c)
        if n:
            self.tt = e(rt, (n,), np.uint8, f"moe {experts.name} token operand")

    def _upload(self, rt, model, chunk: int) -> None:
        """Routers (host f32 -> f16) and experts (raw bytes through the pinned staging,
        dequantized to f16 on the GPU chunk by chunk) of every layer."""
        from minfer.cuda.paths.f16.upload import dequant_f16, dequant_interleaved
        from minfer.cuda.runtime.upload import Staging, rows_per_chunk, split_rows

        slot = 1
        for il in self.layers:
            for s in EXPERTS:
                t = model.tensor(f"blk.{il}.{s}.weight")
                rows = int(np.prod(t.shape[:-1]))
                rb = int(t.data.nbytes) // rows
                slot = max(slot, min(rows, rows_per_chunk(rb, chunk)) * rb)
        up = Staging(rt, slot)
        scratch = da.empty(rt, (1024, self.d), np.float16, "moe glu dequant scratch")
        E, F, K = self.E, self.fe, self.d
        ex = self.experts
        if ex.requant:  # one layer's f16 stacks, requantized expert by expert (staging)
            gu = da.empty(rt, (E, 2 * F, K), np.float16, "moe requant staging (gate|up)")
            dn = da.empty(rt, (E, K, F), np.float16, "moe requant staging (down)")
        stream, rt.stream = rt.stream, up.stream  # dequants queue behind their copies
        try:
            for il in self.layers:
                p = f"blk.{il}."
                r = model.dequant(p + "ffn_gate_inp.weight").astype(np.float16)
                self.w[p + "ffn_gate_inp.weight"] = da.to_device(rt, r, p + "moe router")
                self.nbytes += int(model.tensor(p + "ffn_gate_inp.weight").data.nbytes)
                if not ex.requant:
                    gu = da.empty(rt, (E, 2 * F, K), np.float16, f"f16 experts {p}ffn_gate_up_exps")
                    dn = da.empty(rt, (E, K, F), np.float16, f"f16 experts {p}ffn_down_exps")
                for s in EXPERTS:
                    t = model.tensor(f"{p}{s}.weight")
                    _, N, Kt = (int(x) for x in t.shape)
                    d = t.data if t.data.flags.c_contiguous else np.ascontiguousarray(t.data)
                    raw = d.reshape(-1).view(np.uint8).reshape(E * N, -1)
                    rb = raw.shape[1]
                    for r0, n in split_rows(E * N, rb, up.slot_bytes):
                        src = up.put(raw[r0 : r0 + n])
                        if s == "ffn_down_exps":
                            out = da.rows(da.reshape(dn, (E * N, Kt)), r0, n)
                            dequant_f16(rt, src, t.qtype, n, Kt, out)
                        else:  # gate | up: each expert's rows interleaved per 16 (glu_rows):
                            # over the whole stack, 8-row block b goes to rows 16 b (+ 8: up)
                            dequant_interleaved(
                                rt,
                                src,
                                t.qtype,
                                n,
                                Kt,
                                rb,
                                da.reshape(gu, (2 * E * F, K)),
                                s == "ffn_up_exps",
                                scratch,
                                dst_row0=2 * r0,
                                stream=up.stream,
                            )
                    self.nbytes += int(t.data.nbytes)
                for n, w16 in (("ffn_gate_up_exps", gu), ("ffn_down_exps", dn)):
                    # requantized on the same stream, so the next layer's dequants into the
                    # staging wait for these launches
                    self.w[f"{p}{n}.weight"] = ex.hold(rt, w16, p + n)
            up.close()
        finally:
            rt.stream = stream
        if self.fs:
            self._upload_shared(rt, model, chunk)
        rt.synchronize()
        scratch.gpudata.free()
        if ex.requant:
            gu.gpudata.free()
            dn.gpudata.free()

    def _upload_shared(self, rt, model, chunk: int) -> None:
        """qwen2moe's shared expert of every layer by the dense f16 path's upload (raw rows
        through a pinned staging, dequantized to f16 on the GPU): gate|up one [2 fs, d] stack
        interleaved per 16 rows (the glu epilogue's layout), down [d, fs]; the gate vector
        host f32 -> f16 [1, d] (an N = 1 GEMM's weight)."""
        from minfer.cuda.load.weights import _raw_rows
        from minfer.cuda.paths.base import Part
        from minfer.cuda.paths.f16 import upload as f16
        from minfer.cuda.runtime.upload import Staging, rows_per_chunk

        names = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
        slot = 1
        for il in self.layers:
            for s in names:
                rows, rb = _raw_rows(model.tensor(f"blk.{il}.{s}.weight")).shape
                slot = max(slot, min(rows, rows_per_chunk(rb, chunk)) * rb)
        up = Staging(rt, slot)
        stream, rt.stream = rt.stream, up.stream
        try:
            for il in self.layers:
                p = f"blk.{il}."

                def part(s):
                    t = model.tensor(f"{p}{s}.weight")
                    self.nbytes += int(t.data.nbytes)
                    return Part(p + s, _raw_rows(t), t.qtype, int(t.shape[1]))

                g = p + "ffn_gate_inp_shexp.weight"
                v = model.dequant(g).reshape(1, -1).astype(np.float16)
                self.w[g] = da.to_device(rt, v, p + "moe shared gate")
                self.nbytes += int(model.tensor(g).data.nbytes)
                gu = p + "ffn_gate_up_shexp.weight"
                self.w[gu] = f16.upload(rt, up, [part(names[0]), part(names[1])], gu, glu=True)[0]
                dn = p + "ffn_down_shexp.weight"
                self.w[dn] = f16.upload(rt, up, [part(names[2])], dn)[0]
            up.close()
        finally:
            rt.stream = stream

    def ffn(self, rt, il: int, x, h16, op) -> None:
        """x f32 [T, d] += the MoE FFN of layer il on h16 f16 [T, d]; op(label, flops): the
        forward's profile bracket (a context manager)."""
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt

        T = int(x.shape[0])
        E, k, d = self.E, self.k, self.d
        P = T * k
        R = da.rows
        p = f"blk.{il}."
        logits, sel, wts = R(self.logits, 0, T), R(self.sel, 0, T), R(self.wts, 0, T)
        perm, rowpos = R(self.perm, 0, P), R(self.rowpos, 0, P)
        act, ys = R(self.act, 0, P), R(self.ys, 0, P)
        with op("gemm:ffn_gate_inp", 2.0 * T * E * d):
            da.poison(rt, logits)
            gemm_f16_nt(h16, self.w[p + "ffn_gate_inp.weight"], out=logits, rt=rt)
        with op("moe:route"):
            da.poison(rt, sel, wts)
            M.route(rt, sel, wts, logits, k, self.norm_w, self.w_scale)
        with op("moe:sort"):
            da.poison(rt, self.offs, self.toff, perm, rowpos)
            M.sort(rt, self.offs, self.toff, perm, rowpos, sel, E, self.bm)
        self.experts.run(self, rt, il, h16, P, act, ys, perm, op)
        with op("moe:combine"):
            M.combine(rt, x, ys, wts, rowpos)
        if self.fs:
            self._shared(rt, p, x, h16, T, op)

    def _shared(self, rt, p: str, x, h16, T: int, op) -> None:
        """x f32 [T, d] += sigmoid(h16 . g) * the shared expert's SwiGLU of h16 (qwen2moe)."""
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt

        d, F = self.d, self.fs
        gl, act, y = da.rows(self.sgl, 0, T), da.rows(self.sact, 0, T), da.rows(self.sy, 0, T)
        with op("gemm:ffn_gate_inp_shexp", 2.0 * T * d):
            da.poison(rt, gl)
            gemm_f16_nt(h16, self.w[p + "ffn_gate_inp_shexp.weight"], out=gl, rt=rt)
        with op("gemm:ffn_gate_up_shexp", 4.0 * T * F * d):
            da.poison(rt, act)
            w = self.w[p + "ffn_gate_up_shexp.weight"]
            gemm_f16_nt(h16, w, np.float16, out=act, rt=rt, glu=True)
        with op("gemm:ffn_down_shexp", 2.0 * T * F * d):
            da.poison(rt, y)
            gemm_f16_nt(act, self.w[p + "ffn_down_shexp.weight"], out=y, rt=rt)
        with op("moe:shared"):
            M.shared_add(rt, x, y, gl)
