"""Forward: every launch of one chunk of the llama forward on the GPU, as plain as the CPU
reference's loop (minfer.reference.forward.ReferenceBackend._forward), over what the backend
planned and allocated: the runtime, the model config, each linear weight's route object (its
path family's: minfer.cuda.paths), the fused GEMM groups and epilogues, the device weights and
the buffers (minfer.cuda.load.buffers.DeviceBuffers). It never chooses a path: each GEMM asks
its route. CudaBackend runs it per chunk (eagerly, or recorded into a CUDA graph); the kernel
prebuild dry-runs the same object on a recording runtime (`with_runtime`,
minfer.cuda.load.prepare.needed_kernels).

Per layer, T tokens (f32 residual x, f16 GEMM operands; the module docstring of
minfer.cuda.backend has the dataflow): rmsnorm -> q|k|v GEMMs (rope in the f16 epilogue, or
(qwen3: head norms, then) one rope_qkv launch) -> attention -> attn_output += -> rmsnorm ->
gate|up GEMMs (swiglu in the epilogue, or a swiglu launch) -> ffn_down += (a mixture-of-
experts model: router, grouping, grouped GEMMs, weighted scatter-add, minfer.cuda.load.moe); the family's
variations read from the config (gemma's and olmo2's post norms, olmo2's missing pre-norms and
whole-projection q/k norms, granite's scales, smollm3's layers without RoPE); the last layer of
the last chunk for its last row only, then the output norm and the LM head GEMV. `profile`
(an OpProfile) brackets each op with events; `probe(layer, rows)` sees the residual after the
embedding (layer -1) and after each layer (the non-finite locator).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import numpy as np

from minfer.cuda.ops import attention as attn_mod
from minfer.cuda.ops import gemma_layers as G
from minfer.cuda.ops import layers as L
from minfer.cuda.runtime import devarray as da


# -- adapter to the dequant module --------------------------------------------------------------
def _embed_rows(rt, out, table_dev, qtype: int, ids_dev, K: int, V: int) -> None:
    from minfer.cuda.ops import dequant

    da.poison(rt, out)
    dequant.embed_rows(rt, table_dev, qtype, ids_dev, int(ids_dev.shape[0]), K, out, V=V)


class Forward:
    """One chunk's launches over a planned, loaded model (see the module docstring)."""

    def __init__(self, rt, model, choice, lin, groups, glu, rope_epi, weights, buf):
        self.rt, self.model, self.c, self.gcfg = rt, model, model.config, choice
        self.lin = lin  # weight name -> its route object (paths.LinearRoute)
        self.groups = groups  # per layer {"attn", "ffn"}: fusion.plan_groups
        self.glu = glu  # gate|up groups whose GEMM writes the swiglu (plan_glu)
        self.glu_act = "gelu" if model.config.ffn_gelu else "silu"  # their activation
        self.rope_epi = rope_epi  # q|k|v groups whose GEMM ropes (layers.QkvRope per group)
        # ... and their routes (a member's: fusion.plan_fusion puts a group on one path)
        self.rope_route = {
            g.weight: lin[g.member]
            for il in range(model.config.n_layers)
            for g in groups[il]["attn"]
            if g.weight in rope_epi
        }
        self.w, self.emb, self.emb_qtype = weights.w, weights.emb, weights.emb_qtype
        self.buf = buf
        self.ubatch = int(buf.x.shape[0])  # the rows every activation buffer holds
        self.profile = None
        self.probe = None
        self.moe = (
            None  # minfer.cuda.load.moe.MoeLayers of a mixture-of-experts model (the backend's)
        )
        c = self.c  # each layer's RoPE table (gemma: the local layers' own base; smollm3's
        # layers without RoPE: the identity table)
        self.rope = [
            buf.rope_none
            if not c.has_rope(il)
            else buf.rope_swa
            if buf.rope_swa is not None and c.layer_rope(il) != (c.rope_base, c.rope_scaling)
            else buf.rope
            for il in range(c.n_layers)
        ]
        # each layer's attention options: its window, the model's scale (gemma's q scale and
        # granite's kq scale both scale the scores here) and soft-cap
        self.attn_opts = [
            dict(
                window=c.sliding_window if c.is_local(il) else 0,
                softcap=c.attn_softcap,
                scale=c.attn_scale or c.kq_scale or None,
            )
            for il in range(c.n_layers)
        ]

    def with_runtime(self, rt) -> "Forward":
        """The same forward on another runtime (prepare.Recorder: the kernel prebuild)."""
        f = copy.copy(self)
        f.rt = rt
        return f

    @contextmanager
    def _op(self, label: str, flops: float = 0.0):
        if self.profile is None:
            yield
        else:
            with self.profile.op(label, flops):
                yield

    def _quantize(self, A, *names: str):
        """A f16 [M, K] -> the operands the routes of the GEMMs `names` read, made once each
        into their scratch (Operand.prepass): a dict Operand -> operand, or None when all read
        A itself. The scratch is reused by the next activation (the GEMMs that read it are
        queued before, on the same stream)."""
        kinds = {self.lin[n].operand for n in names} - {None}
        if not kinds:
            return None
        with self._op("prepass"):
            return {k: k.prepass(self.rt, A, self.buf.operands[k.scratch]) for k in kinds}

    def _norm(self, h16, x, wname: str, *names: str):
        """h16 f16 [M, D] = rmsnorm(x) * w[wname] as the input of the GEMMs `names` -> their
        operands (_quantize). When they read one operand that the norm's launch can write
        (Operand.norm), that launch makes it, writing h16 only if an
        f16 GEMM reads it too (tuning variant no-fused-prepass: two launches)."""
        op = self._fused("rmsnorm+prepass", h16, x, self.w[wname], names)
        if op is not None:
            return op
        with self._op("rmsnorm"):
            da.poison(self.rt, h16)
            L.rmsnorm(self.rt, h16, x, self.w[wname], self.c.rms_eps)
        return self._quantize(h16, *names)

    def _fused(self, label: str, h16, x, w, names, t=None):
        """The operands of the GEMMs `names` (f16 [M, D] h16 too if an f16 GEMM reads it) from
        one launch of their one operand's norm kernel (Operand.norm: of f16(rmsnorm(x) * w);
        w None: of f16(x); t: x += rmsnorm(t) * w first), or None where it cannot (then the
        separate launches; tuning variant no-fused-prepass)."""
        kinds = {self.lin[n].operand for n in names}
        q = kinds - {None}
        k = next(iter(q)) if len(q) == 1 else None
        if not self.gcfg.on("fused-prepass") or k is None or k.norm is None:
            return None
        with self._op(label):
            da.poison(self.rt, h16)  # (unwritten unless an f16 GEMM reads it)
            op = k.norm(
                self.rt,
                x,
                w,
                self.c.rms_eps,
                self.buf.operands[k.scratch],
                h16 if None in kinds else None,
                t=t,
            )
        return None if op is None else {k: op}

    def _attn_operand(self, name: str, T: int, per_token: bool):
        """(the array the attention launch writes the input form of GEMM `name` into, that
        form as _quantize's dict) where its epilogue can (Operand.attn, attention.operand_fuses:
        the wgmma attention at head_dim 128); else (None, None): the attention
        writes f16 and _linear makes the form (as with the tuning variant no-fused-prepass)."""
        k = self.lin[name].operand
        c = self.c
        if (
            not self.gcfg.on("fused-prepass")
            or k is None
            or k.attn is None
            or not attn_mod.operand_fuses(
                self.rt, T, c.n_heads // c.n_kv_heads, c.head_dim, per_token
            )
        ):
            return None, None
        tt, op = k.attn(self.rt, self.buf.operands[k.scratch], T, c.n_heads * c.head_dim)
        return tt, {k: op}

    def _residual(self, x, A, name: str, label: str, q8, post: str, then=None):
        """x f32 [M, d_model] += A @ W[name].T; with post norms (gemma, olmo2) the product goes
        to post32 first and x += rmsnorm(it) * w[post]; with a residual scale (granite)
        x += it * scale. then (a family without pre-norms, olmo2): (h16, names) of the GEMMs
        that read x next, whose operands the post-norm's launch makes and returns (_fused);
        else None."""
        c = self.c
        if not c.post_norms and c.residual_scale == 1.0:
            self._linear(x, A, name, "acc", label, q8)
            return None
        t = da.rows(self.buf.post32, 0, int(x.shape[0]))
        da.poison(self.rt, t)
        self._linear(t, A, name, "f32", label, q8)
        if c.post_norms:
            if c.residual_scale != 1.0:
                raise NotImplementedError("post norms with a residual scale")
            if then is not None:
                op = self._fused("rmsnorm_add+prepass", then[0], x, self.w[post], then[1], t)
                if op is not None:
                    return op
            with self._op("rmsnorm"):
                G.rmsnorm_add(self.rt, x, t, self.w[post], c.rms_eps)
            return None
        with self._op("scale_add"):
            G.scale_add(self.rt, x, t, c.residual_scale)
        return None

    def _norm_in(self, h16, x, wname: str, *names: str):
        """_norm, or for a family without pre-norms (olmo2) x itself rounded to f16 as the
        GEMMs' input (their operands made from it by _quantize)."""
        if self.c.pre_norms:
            return self._norm(h16, x, wname, *names)
        op = self._fused("cvt+prepass", h16, x, None, names)
        if op is not None:
            return op
        with self._op("cvt"):
            da.poison(self.rt, h16)
            L.to_f16(self.rt, h16, x)
        return self._quantize(h16, *names)

    def _swiglu(self, f16, g, u=None) -> None:
        """f16 [M, F] = swiglu(g, u) (u None: g is the fused gate|up output [M, 2F]); GeGLU
        (gelu(g) * u) for gemma."""
        if self.c.ffn_gelu:
            with self._op("geglu"):
                da.poison(self.rt, f16)
                G.geglu(self.rt, f16, g, u)
            return
        with self._op("swiglu"):
            da.poison(self.rt, f16)
            if u is None:
                L.swiglu_fused(self.rt, f16, g)
            else:
                L.swiglu(self.rt, f16, g, u)

    def _linear(self, C, A, name: str, mode: str, label: str, q8=None, member=None) -> None:
        """C (mode 'f32' =, 'f16' =, 'acc' +=) A @ W.T on the weight's route object; q8: A's
        prepass outputs (from _quantize), made here when not given. A fused weight (q|k|v,
        gate|up: not in routes) takes the route of `member`, one of its members (plan_fusion:
        all share it). Mode 'glu' (a plan_glu gate|up group): C f16 [M, F] = act(gate) * up
        from the GEMM's epilogue (act: the model's, silu or gemma's gelu)."""
        M, K = A.shape
        N = C.shape[1]
        r = self.lin[member or name]
        if r.operand is not None and q8 is None:  # (its own op: not inside the GEMM's events)
            q8 = self._quantize(A, member or name)
        x = A if r.operand is None else q8[r.operand]
        if mode == "glu":
            with self._op("gemm:" + label, 2.0 * M * 2 * N * K):
                r.run_glu(self.rt, self.buf, C, x, self.w[name], self.glu_act)
            return
        with self._op("gemm:" + label, 2.0 * M * N * K):
            r.run(self.rt, self.buf, C, x, self.w[name], mode)

    def _run_groups(self, groups, flat, A, T: int, q8, bias: bool = False) -> dict:
        """Each GEMM of `groups` (fusion.plan_groups) on A into its own part of `flat` (the
        ubatch-sized f32 buffer: parts one after another, Tu rows each), plus its bias ->
        part name -> (output, first column)."""
        src, off = {}, 0
        for g in groups:
            out = self._part(flat, self.ubatch * off, (T, g.width))
            off += g.width
            self._linear(out, A, g.weight, "f32", g.label, q8, g.member)
            if bias:
                with self._op("bias"):
                    L.add_bias(self.rt, out, self.w[g.weight.replace(".weight", ".bias")])
            src.update({part: (out, col) for part, col in g.parts})
        return src

    @staticmethod
    def _part(flat, start: int, shape):
        """View of `flat` (1-D) elements [start, start + prod(shape)) as `shape` (no copy)."""
        n = int(np.prod(shape))
        return da.reshape(da.rows(flat, start, n), shape)

    def chunk(self, ids_T: int, hi: int, last: bool, per_token: bool | None = None) -> None:
        """Every launch of one chunk of T tokens (ids and their layout buf.tok, (slot, lo) per
        token, already on the device: the kernels read the positions from it). hi: one past
        the largest KV slot of the layout, for the host-side checks only. last: the chunk ends
        one sequence whose last row alone goes through the final layer and the LM head.
        per_token: the layout is a decode step's (attention.per_token_pays: the one-token-per-
        block attention kernel); None: T == 1 (one sequence's decode)."""
        rt, c, b = self.rt, self.c, self.buf
        T = ids_T
        per_token = T == 1 if per_token is None else per_token
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        qd, kd = H * D, Hkv * D
        R = da.rows
        x = R(b.x, 0, T)
        h16 = R(b.h16, 0, T)
        with self._op("embed"):
            _embed_rows(rt, x, self.emb, self.emb_qtype, R(b.ids, 0, T), c.d_model, c.vocab_size)
            if c.embed_scale != 1.0:  # gemma: times sqrt(d_model)
                G.scale(rt, x, c.embed_scale)
        if self.probe is not None:
            self.probe(-1, x)
        # the qkv GEMM ropes in its epilogue where its route says it pays (f16: where its tiles
        # fit one wave): one answer per chunk
        rope_in_gemm = bool(self.rope_epi) and next(iter(self.rope_route.values())).rope_pays(
            rt, T, qd + 2 * kd
        )
        carry = None  # olmo2: this layer's q|k|v operands from the last post-norm's launch
        for il in range(c.n_layers):
            p = f"blk.{il}."
            final = last and il == c.n_layers - 1
            groups = self.groups[il]["attn"]
            hq8, carry = carry, None
            if hq8 is None:
                hq8 = self._norm_in(h16, x, p + "attn_norm.weight", *(g.member for g in groups))
            if rope_in_gemm and groups[0].weight in self.rope_epi:  # no rope launch after it
                g = groups[0]
                with self._op("gemm:" + g.label, 2.0 * T * g.width * c.d_model):
                    da.poison(rt, R(b.q16, 0, T))
                    self.rope_route[g.weight].run_rope(
                        rt, b, h16, self.w[g.weight], self.rope_epi[g.weight], hi
                    )
            else:  # each GEMM into its part of qkv32, then one rope launch reads q, k, v
                src = self._run_groups(groups, b.qkv32, h16, T, hq8, bias=c.qkv_bias)
                norm = None  # qwen3 / gemma3: each head of q and k rmsnorm'd before the rope;
                if c.qk_norm:  # olmo2: all heads as one row (rope_qkv's launch does both)
                    norm = L.QkNorm(
                        self.w[p + "attn_q_norm.weight"],
                        self.w[p + "attn_k_norm.weight"],
                        c.rms_eps,
                        c.qk_norm_full,
                    )
                with self._op("qk_norm+rope" if norm else "rope"):
                    da.poison(rt, R(b.q16, 0, T))  # (the K/V cache rows: the layout on device)
                    L.rope_qkv(
                        rt,
                        R(b.q16, 0, T),
                        *(src[k][0] for k in "qkv"),
                        b.kc[il],
                        b.vc[il],
                        self.rope[il],
                        hi,
                        R(b.tok, 0, T),
                        c.rope_dim,
                        c.rope_neox,
                        tuple(src[k][1] for k in "qkv"),
                        norm=norm,
                    )
            # from here on the final layer needs the last position only
            t0, Tq = (T - 1, 1) if final else (0, T)
            xq = R(b.x, t0, Tq)
            a16 = R(b.a16, 0, Tq)
            one = per_token or Tq == 1  # (a last chunk's final layer: its last row alone)
            tt, aq = self._attn_operand(p + "attn_output.weight", Tq, one)
            with self._op("attention"):
                da.poison(rt, a16)
                attn_mod.attention(
                    rt,
                    da.reshape(a16, (Tq, H, D)),
                    R(b.q16, t0, Tq),
                    b.kc[il],
                    b.vc[il],
                    0,
                    R(b.tok, t0, Tq),
                    hi,
                    operand=tt,
                    o_out=tt is None,
                    impl="tok" if one else None,
                    **self.attn_opts[il],
                )
            hq = R(b.h16, 0, Tq)
            f16 = R(b.f16, 0, Tq)
            down = p + "ffn_down.weight"
            groups = self.groups[il]["ffn"]
            members = tuple(g.member for g in groups)
            fq8 = self._residual(
                xq,
                a16,
                p + "attn_output.weight",
                "attn_output",
                aq,
                p + "post_attention_norm.weight",
                None if c.pre_norms else (hq, members),
            )
            if fq8 is None:
                fq8 = self._norm_in(hq, xq, p + "ffn_norm.weight", *members)
            if self.moe is not None:  # the routed experts: x += moe(hq) (minfer.cuda.load.moe)
                self.moe.ffn(rt, il, xq, hq, self._op)
                if self.probe is not None:
                    self.probe(il, xq)
                continue
            if groups[0].weight in self.glu:  # the GEMM's epilogue writes the swiglu / geglu
                self._linear(
                    f16, hq, groups[0].weight, "glu", groups[0].label, fq8, groups[0].member
                )
            else:
                src = self._run_groups(groups, b.gu32, hq, Tq, fq8)
                gate, up = src["gate"], src["up"]
                self._swiglu(f16, gate[0], None if up[0] is gate[0] else up[0])
            nxt = None  # olmo2: the next layer's q|k|v, which read all T rows of x
            if not c.pre_norms and il + 1 < c.n_layers:
                nxt = (h16, tuple(g.member for g in self.groups[il + 1]["attn"]))
            carry = self._residual(xq, f16, down, "ffn_down", None, p + "post_ffw_norm.weight", nxt)
            if self.probe is not None:  # (the final layer writes its last row only)
                self.probe(il, xq)
        if last:
            with self._op("rmsnorm"):
                da.poison(rt, b.last16)
                L.rmsnorm(rt, b.last16, R(b.x, T - 1, 1), self.w["output_norm.weight"], c.rms_eps)
            self._linear(b.logits, b.last16, self.model.output_name, "f32", "lm_head")
            self._softcap(b.logits)

    def head(self, row0: int, m: int, out, rows=None):
        """out f32 [m, vocab] = (rmsnorm(x[r]) * output_norm) @ W_out.T for the residual rows
        r = row0 .. row0 + m - 1 of the chunk just run (perplexity's scored rows), or r =
        rows[0 .. m - 1] (int32 device array: a packed batch's rows that need logits)."""
        c, b, R = self.c, self.buf, da.rows
        h16 = R(b.h16, 0, m)
        with self._op("rmsnorm"):
            da.poison(self.rt, h16)
            if rows is None:
                L.rmsnorm(self.rt, h16, R(b.x, row0, m), self.w["output_norm.weight"], c.rms_eps)
            else:
                L.rmsnorm_rows(self.rt, h16, b.x, rows, self.w["output_norm.weight"], c.rms_eps)
        self._linear(out, h16, self.model.output_name, "f32", "lm_head")
        self._softcap(out)

    def _softcap(self, logits) -> None:
        """granite's logit scale, then gemma's final logit soft-capping, in place on f32
        logits rows."""
        if self.c.logit_mul != 1.0:
            with self._op("scale"):
                G.scale(self.rt, logits, self.c.logit_mul)
        if self.c.logit_softcap:
            with self._op("softcap"):
                G.softcap(self.rt, logits, self.c.logit_softcap)
