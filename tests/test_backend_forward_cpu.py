"""CPU: CudaBackend's whole forward on a fake runtime (every launch recorded, no kernel runs) for
every path of the table, so the host side of each route object (prepass, launch, epilogue), the
buffers and the layer loop run without a GPU: each GEMM launches the kernel of its route, the
int8 routes' prepasses run, nothing in the forward chooses a path. The numbers are the GPU
tests' business (tests/gpu)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from fake_gpuarray import FakeGPUArray, upload_drv
from synth_data import tiny_model


class _Ptr(int):
    def free(self) -> None:
        pass


class _Arr(FakeGPUArray):
    def set(self, a) -> None:
        assert np.asarray(a).size <= self.size

    def get(self):
        return np.zeros(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class _Memcpy2D:
    def set_src_host(self, a):
        pass

    def set_src_device(self, p):
        pass

    def set_dst_device(self, p):
        pass

    def __call__(self, aligned_or_stream=True):
        pass


class FakeRT:
    sm_count, smem_optin = 132, 232448
    poisoning = False
    stream = None

    def __init__(self, arch: str):
        self.arch = arch
        self.cfg = types.SimpleNamespace(debug=False, poison=False)
        self.drv = types.SimpleNamespace(
            memcpy_htod=lambda p, a: None,
            Memcpy2D=_Memcpy2D,
            memset_d8=lambda p, b, n: None,
            Error=RuntimeError,
            **upload_drv(),
        )
        self.launches: list[tuple[str, str]] = []
        self._next = 1 << 20

    def alloc(self, nbytes: int, what: str = "buffer"):
        p = self._next
        self._next += (int(nbytes) + 255) // 256 * 256 + 256
        return _Ptr(p)

    def mem_info(self):
        return 80 << 30, 80 << 30

    def synchronize(self):
        pass

    def workspace(self, name, nbytes, zero_bytes):
        return np.uintp(self.alloc(nbytes)), np.uintp(self.alloc(zero_bytes))

    def function(self, name, entry, options=(), dyn_smem=0):
        return name, entry

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append(fn)


def fake_tensor_maps(monkeypatch):
    """The f16 GEMM's TMA tensor maps without a driver; the wgmma attention on its cp.async
    entries, whose arguments the tests below read by position (its TMA entries' layout is
    test_attention_launcher_cpu's)."""
    from minfer.cuda.ops import attention
    from minfer.cuda.paths.f16 import gemm

    monkeypatch.setattr(gemm, "tmap_f16_2d", lambda *a: np.zeros(128, np.uint8))
    monkeypatch.setattr(attention, "WG_TMA", False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("fwd"), seed=3, workers=None))


ENTRY = {
    "f16": ("gemm_f16", "gemm_f16_sm90a"),
    "blk": ("mmq_blk",),
    "wide-kd4": ("mmq_q4k", "mmq_q6k"),
    "wide-kd8": ("mmq_q4k", "mmq_q6k"),
    "narrow": ("mmq_q4k", "mmq_q6k"),
    "r1": ("mmq_q4k", "mmq_q6k"),
    "blk-split": ("mmq_blk", "blk_split"),
}
PREPASS = {
    "f16": set(),
    "blk": {"blk_operand_f16", "rmsnorm_blk_operand"},
    "wide-kd4": {"quantize_q8_1_raw_f16"},
    "wide-kd8": {"quantize_q8_1_raw_f16"},
    "narrow": {"quantize_q8_1_raw_f16"},
    "r1": {"quantize_q8_1_raw_f16"},
    # ffn_down: its kept columns moved out, then the zeroed act's operand
    "blk-split": {"blk_operand_f16", "rmsnorm_blk_operand", "blk_split_cols"},
}


@pytest.mark.parametrize("path", list(ENTRY))
def test_forward_launches_each_route(monkeypatch, tiny, path):
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90" if path in ("blk", "f16", "blk-split") else "sm_80")
    be = CudaBackend(
        tiny, GemmChoice(path), rt=rt, max_tokens=64, ubatch=16, warmup=False, graphs=False
    )
    int8 = {n for n, (p, _) in be.routes.items() if p != "f16"}
    assert bool(int8) == (path != "f16")
    assert all(be.lin[n].name == be.routes[n][0] for n in be.routes)
    for ids, pos0 in ((np.arange(21, dtype=np.int32) % 50, 0), (np.array([3], np.int32), 21)):
        rt.launches.clear()
        be.forward_device(ids, pos0)
        files = {f for f, _ in rt.launches}
        entries = {e for _, e in rt.launches}
        assert set(ENTRY[path]) & files, files
        if path != "f16":
            assert "gemm_f16" in files or "gemm_f16_sm90a" in files  # (f16 routes remain)
            assert PREPASS[path] <= entries, entries
        else:
            assert not {f for f in files if f.startswith("mmq")}
        if path == "blk":  # both norms of every layer, each ubatch, write the operand themselves
            chunks = -(-len(ids) // 16)
            fused = [e for _, e in rt.launches].count("rmsnorm_blk_operand")
            assert fused == 2 * tiny.config.n_layers * chunks
    assert be.n_past == 22


@pytest.mark.parametrize("path", ["f16", "wide-kd4"])
def test_window_logits_runs_every_row_then_the_head(monkeypatch, tiny, path):
    """CudaBackend.window_logits on the fake runtime: a fresh sequence in ubatch chunks, each a
    non-final chunk (no last-row LM head inside it), then one norm + LM head launch pair per
    HEAD_ROWS block of the rows >= first; the host array has those rows only."""
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90" if path == "f16" else "sm_80")
    be = CudaBackend(
        tiny,
        GemmChoice.parse_ab(path, env={}),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
    )
    be.HEAD_ROWS = 4
    heads = []
    real_head = be._head
    monkeypatch.setattr(be, "_head", lambda r0, m: heads.append((r0, m)) or real_head(r0, m))
    chunks = []
    real_chunk = be._forward_chunk
    monkeypatch.setattr(
        be,
        "_forward_chunk",
        lambda ids, pos0, last: (
            chunks.append((len(ids), pos0, last)) or real_chunk(ids, pos0, last)
        ),
    )
    be.n_past = 5  # window_logits starts a fresh sequence whatever the cache held
    ids = np.arange(40, dtype=np.int32) % 50
    out = be.window_logits(ids, 21)
    assert out.shape == (19, tiny.config.vocab_size) and out.dtype == np.float32
    assert chunks == [(16, 0, False), (16, 16, False), (8, 32, False)]
    # rows 21..39: chunk 2 holds 21..31 (from its row 5), chunk 3 32..39, 4 rows per launch
    assert heads == [(5, 4), (9, 4), (13, 3), (0, 4), (4, 4)]
    assert be.n_past == 40
    assert be._head_out.shape == (4, tiny.config.vocab_size)
    with pytest.raises(Exception, match="first 40 outside"):
        be.window_logits(ids, 40)


def test_blk_attention_epilogue_writes_the_operand(monkeypatch, tmp_path):
    """--gemm blk at head_dim 128 on sm_90: the attention launch writes attn_output's token
    operand (attn_wg_d128_blk, no f16 o) where the wgmma kernel runs (a chunk of >= 128 rows);
    the final layer's single row takes the f16 attention and the prepass; the norms write
    their operands themselves, and ffn_down runs on f16 (blk's f16_kinds), so no plain prepass
    runs but the last attn_output's."""
    from fake_gpuarray import install
    from synth_data import small_parts, write_small

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    model = load_model(
        write_small(
            tmp_path / "hd128.gguf", *small_parts(seed=1, d_model=256, n_heads=2, n_kv_heads=1)
        )
    )
    L = model.config.n_layers
    assert model.config.head_dim == 128
    rt = FakeRT("sm_90")
    be = CudaBackend(
        model, GemmChoice("blk"), rt=rt, max_tokens=128, ubatch=64, warmup=False, graphs=False
    )
    rt.launches.clear()  # (the weights' requantization at load)
    be.forward_device(np.arange(64, dtype=np.int32) % 200, 0)  # 64 tokens x G 2 = 128 rows
    entries = [e for _, e in rt.launches]
    assert entries.count("attn_wg_d128_blk") == L - 1 and entries.count("attn_wg_d128") == 0
    assert entries.count("rmsnorm_blk_operand") == 2 * L
    assert entries.count("blk_operand_f16") == 1  # the last attn_output's
    assert sum(e.startswith("mmq_blk") for e in entries) == 3 * L  # qkv, attn_output, gate|up
    # the tuning variant blk:no-fused-prepass: the norm, the attention, one prepass per GEMM
    be = CudaBackend(
        model,
        GemmChoice("blk", frozenset({"fused-prepass"})),
        rt=rt,
        max_tokens=128,
        ubatch=64,
        warmup=False,
        graphs=False,
    )
    rt.launches.clear()
    be.forward_device(np.arange(64, dtype=np.int32) % 200, 0)
    entries = [e for _, e in rt.launches]
    assert "rmsnorm_blk_operand" not in entries and "attn_wg_d128_blk" not in entries
    assert entries.count("attn_wg_d128") == L - 1 and entries.count("blk_operand_f16") == L
    assert entries.count("blk_operand_f16_tok") == 2 * L  # the inputs of q|k|v and gate|up


def test_blk_token_scales_go_to_the_gemms_after_a_norm(monkeypatch, tmp_path):
    """On blk the GEMMs after an rmsnorm (q|k|v, gate|up) read a per-token operand through the
    mmq_blk_tok entries, attn_output a per-(token, 128) one through mmq_blk, ffn_down runs on
    f16; the tuning variant blk:no-token-scale runs mmq_blk everywhere, blk:no-exact-down
    ffn_down too (a per-(token, 128) operand)."""
    from fake_gpuarray import install
    from synth_data import small_parts, write_small

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    model = load_model(
        write_small(
            tmp_path / "hd128.gguf", *small_parts(seed=1, d_model=256, n_heads=2, n_kv_heads=1)
        )
    )
    L = model.config.n_layers
    rt = FakeRT("sm_90")
    for off, tok in ((frozenset(), True), (frozenset({"token-scale", "exact-down"}), False)):
        be = CudaBackend(
            model,
            GemmChoice("blk", off),
            rt=rt,
            max_tokens=128,
            ubatch=64,
            warmup=False,
            graphs=False,
        )
        forms = {n.split(".")[-2]: getattr(be.lin[n].operand, "name", "none") for n in be.lin}
        want = "blk-tok" if tok else "blk"
        assert all(
            forms[k] == want for k in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
        ), forms
        assert forms["attn_output"] == "blk"
        assert forms["ffn_down"] == ("none" if tok else "blk")
        rt.launches.clear()
        be.forward_device(np.arange(64, dtype=np.int32) % 200, 0)
        entries = [e for _, e in rt.launches]
        assert entries.count("mmq_blk_tok_swiglu") == (L if tok else 0)
        assert entries.count("mmq_blk_swiglu") == (0 if tok else L)
        assert entries.count("mmq_blk_acc") == (1 if tok else 2) * L
        assert "mmq_blk_tok_acc" not in entries
        assert (entries.count("mmq_blk_tok") > 0) == tok


@pytest.mark.parametrize("path", ["f16", "blk", "wide-kd4"])
def test_qwen3_norms_q_and_k_before_the_rope(monkeypatch, tmp_path, path):
    """qwen3 (tiny-qwen3: head_dim 128 over d_model 256): each layer's q and k get their
    per-head rmsnorm in the rope's launch (rope_qkv_norm_f32_f16_v4: the layer's weights,
    per head) after the q|k|v GEMMs, on every path; the f16 path's rope epilogue is off (the
    norm needs the GEMM's output)."""
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    p = tmp_path / "q3.gguf"
    make_synthetic_model(
        p,
        SynthOptions(
            preset="tiny-qwen3", qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1
        ),
        progress=False,
    )
    model = load_model(p)
    rt = FakeRT("sm_90" if path in ("blk", "f16") else "sm_80")
    be = CudaBackend(
        model, GemmChoice(path), rt=rt, max_tokens=64, ubatch=16, warmup=False, graphs=False
    )
    assert not be.rope_epi
    calls = []
    rt.launch = lambda fn, grid, block, a, smem=0, stream=None: calls.append((fn[1], grid, a))
    be.forward_device(np.arange(21, dtype=np.int32) % 50, 0)
    entries = [e for e, _, _ in calls]
    L, chunks = model.config.n_layers, 2
    assert "head_rmsnorm_f32" not in entries
    ropes = [(g, a) for e, g, a in calls if e.startswith("rope_qkv")]
    assert len(ropes) == L * chunks
    assert entries.count("rope_qkv_norm_f32_f16_v4") == L * chunks
    for j, (grid, a) in enumerate(ropes):
        il = j % L
        assert len(grid) == 1  # a block a token
        wq, wk = (int(devarray.ptr(be.w[f"blk.{il}.attn_{x}_norm.weight"])) for x in "qk")
        assert (int(a[17]), int(a[18]), int(a[20])) == (wq, wk, 0)  # per head


def test_the_plan_is_computed_once(monkeypatch, tiny):
    """CudaBackend takes make_plan's frozen Plan: one route plan and one fusion per candidate
    (a forced path that fits: one), none recomputed by the backend, the memory check or the
    upload; the plan's parts are what the memory line was decided by."""
    from fake_gpuarray import install

    from minfer.cuda import backend as B
    from minfer.cuda.plan import plan as P
    from minfer.cuda.plan import routes
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    calls = {"routes": 0, "fusion": 0}

    def counted(name, f):
        def g(*a, **k):
            calls[name] += 1
            return f(*a, **k)

        return g

    monkeypatch.setattr(routes, "plan_routes", counted("routes", routes.plan_routes))
    monkeypatch.setattr(P, "plan_fusion", counted("fusion", P.plan_fusion))
    be = B.CudaBackend(
        tiny,
        GemmChoice("f16"),
        rt=FakeRT("sm_90"),
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
    )
    assert calls == {"routes": 1, "fusion": 1}
    assert be.memory.need == be.plan.need == sum(be._plan().values())
    assert be.routes == dict(be.plan.routes) and be.fwd.groups is be.plan.groups
    with pytest.raises(TypeError):
        be.plan.routes["x"] = ("f16", "")  # frozen: a mapping no one edits after planning


def test_cuda_applies_the_sliding_window(monkeypatch, tmp_path):
    """A Mistral-style file (llama.attention.sliding_window on every layer) runs on CUDA past
    its window: every layer's attention launch carries the window (attention_common.cuh's
    `window` argument, after scale_log2) and no soft-cap; a file without the key passes 0."""
    from fake_gpuarray import install
    from synth_data import small_parts, write_small

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    for window in (32, 0):
        meta, tensors = small_parts(d_model=256, n_heads=4, n_kv_heads=2)
        if window:
            meta["llama.attention.sliding_window"] = window
        model = load_model(write_small(tmp_path / f"w{window}.gguf", meta, tensors))
        rt = FakeRT("sm_90")
        args = []
        rt.launch = lambda fn, grid, block, a, smem=0, stream=None: args.append((fn[1], a))
        be = CudaBackend(
            model, GemmChoice("f16"), rt=rt, max_tokens=80, ubatch=16, warmup=False, graphs=False
        )
        be.forward_device(np.arange(40, dtype=np.int32), 0)
        attn = [a for e, a in args if e.startswith(("attn_wg", "attn_fwd", "attn_tok"))]
        assert len(attn) == 3 * model.config.n_layers  # 40 tokens: 3 chunks of <= 16
        assert all(int(a[12]) == window and float(a[13]) == 0.0 for a in attn)


@pytest.mark.parametrize("path", ["f16", "blk", "wide-kd4"])
def test_packed_launches_and_checks(monkeypatch, tiny, path):
    """CudaBackend.packed on the fake runtime: the chunk's layers, then per HEAD_ROWS block of
    the asked rows one gathered rmsnorm, the LM head and row_stats; its host checks refuse
    what the kernels could not run; copy_kv copies every layer's K and V rows."""
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.errors import BadInput

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90" if path in ("blk", "f16") else "sm_80")
    copies = []
    rt.drv.memcpy_dtod = lambda dst, src, n: copies.append((dst, src, n))
    be = CudaBackend(
        tiny,
        GemmChoice(path),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
        kv_slots=512,
    )
    assert (be.kv_slots, be.max_tokens) == (512, 64) and be.buf.kc[0].shape[0] == 512
    be.HEAD_ROWS = 4
    tok = np.array([(p, 0) for p in range(5)] + [(128 + p, 128) for p in range(9)], np.int32)
    ids = np.arange(14, dtype=np.int32) % 50
    rt.launches.clear()
    out = be.packed(ids, tok, np.arange(14), np.r_[ids[1:], -1])
    entries = [e for _, e in rt.launches]
    assert out.shape == (14, 4) and out.dtype == np.float32
    assert entries.count("rmsnorm_rows_f32_f16") == entries.count("row_stats_f32") == 4
    assert "attn_wg_d64" in entries or "attn_fwd_d64" in entries
    assert "attn_tok_d64" not in entries
    # a decode step's layout (one token per sequence, the last row repeated as padding): the
    # one-token-per-block attention in every layer, no tile kernel
    rt.launches.clear()
    be.packed(
        np.array([5, 7, 7], np.int32),
        np.array([(5, 0), (137, 128), (137, 128)], np.int32),
        np.arange(2),
        np.full(2, -1),
    )
    entries = [e for _, e in rt.launches]
    assert entries.count("attn_tok_d64") == tiny.config.n_layers
    assert not any(e.startswith(("attn_wg", "attn_fwd")) for e in entries)
    D = tiny.config.n_kv_heads * tiny.config.head_dim * 2
    seen, launch = [], rt.launch
    rt.launch = lambda fn, grid, block, args, *a, **k: (
        seen.append((fn[1], grid, args)),
        launch(fn, grid, block, args, *a, **k),
    )
    be.copy_kv(128, 256, 9)  # every layer's K and V rows in one launch, no memcpy
    (entry, grid, args), *more = seen
    assert entry == "copy_rows_u128" and not more and not copies
    assert grid[1] == 2 * tiny.config.n_layers
    assert [int(a) for a in args[1:]] == [128 * D, 256 * D, 9 * D]
    assert be._cache_ptrs.shape == (2 * tiny.config.n_layers,)  # (its values: tests/gpu)
    rt.launch = launch
    ok = (ids[:3], tok[:3], [2], [-1])
    be.packed(*ok)
    for bad, msg in (
        ((ids[:3], tok[:3][::-1], [2], [-1]), "non-decreasing"),
        ((ids[:3], tok[:3] + 600, [2], [-1]), "slots must"),
        ((ids[:3], tok[:3] + [70, 0], [2], [-1]), "position 72"),
        ((ids[:3], tok[:3], [3], [-1]), "rows"),
        ((ids[:3], tok[:3], [2], [10**6]), "targets"),
        ((np.zeros(17, np.int32), np.zeros((17, 2), np.int32), [], []), "1..16 tokens"),
        ((ids[:3] + 10**6, tok[:3], [2], [-1]), "token id"),
    ):
        with pytest.raises(BadInput, match=msg):
            be.packed(*bad)
    with pytest.raises(BadInput, match="overlapping"):
        be.copy_kv(0, 4, 8)
    # non-finite stats: the chunk rerun eagerly with a probe per layer names where (here every
    # layer's residual reads back finite: the output layer)
    from minfer.errors import GPUError

    real_dtoh = rt.drv.memcpy_dtoh_async  # (the stats come back into a pinned [m, 4] view)
    rt.drv.memcpy_dtoh_async = lambda dst, src, stream=None: (
        dst.fill(np.nan) if dst.shape[-1:] == (4,) else real_dtoh(dst, src, stream)
    )
    rt.launches.clear()
    with pytest.raises(GPUError, match=r"slots 0\.\.2, .*first non-finite: the output layer"):
        be.packed(*ok)
    assert [e for _, e in rt.launches].count("rmsnorm_rows_f32_f16") == 1  # not rerun
    rt.drv.memcpy_dtoh_async = real_dtoh


def test_packed_launch_queues_without_waiting(monkeypatch, tiny):
    """packed_launch (the scheduler's overlap): inputs go up by async copies from pinned
    buffers (no synchronous set() or get() of the device arrays), the outputs come back by
    async copies, an event is recorded; a second launch before the first's wait takes the
    other side of the double buffers, a third is refused; the waits give packed()'s values."""
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90")
    be = CudaBackend(
        tiny,
        GemmChoice("f16"),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
        kv_slots=512,
    )
    be.HEAD_ROWS = 4
    d = tiny.config.d_model
    ups, downs, sync = [], [], []
    rt.drv.memcpy_htod_async = lambda dst, src, stream=None: ups.append((dst, src))
    real_dtoh = rt.drv.memcpy_dtoh_async
    rt.drv.memcpy_dtoh_async = lambda dst, src, stream=None: (
        downs.append(dst),
        real_dtoh(dst, src, stream),
    )
    monkeypatch.setattr(_Arr, "set", lambda self, a: sync.append("set"))
    monkeypatch.setattr(_Arr, "get", lambda self: sync.append("get"))
    tok = np.array([(p, 0) for p in range(5)] + [(128 + p, 128) for p in range(9)], np.int32)
    ids = np.arange(14, dtype=np.int32) % 50
    a = be.packed_launch(ids, tok, np.arange(14), np.r_[ids[1:], -1], top=3, hidden=[4, 13])
    b = be.packed_launch(ids[:5], tok[:5], [4], [-1])
    assert not sync  # nothing waited for the device
    assert (a.side, b.side) == (0, 1)
    assert all(isinstance(src, np.ndarray) for _, src in ups)
    # ids, tok, rows, targets, hidden rows (one block of 2 <= HEAD_ROWS): then b's ids, tok,
    # rows, targets
    assert [len(src) for _, src in ups] == [14, 14, 14, 14, 2, 5, 5, 1, 1]
    assert [a.shape for a in downs] == [(14, 4), (14, 3), (14, 3), (2, d), (1, 4)]
    with pytest.raises(AssertionError, match="outstanding"):
        be.packed_launch(ids[:5], tok[:5], [4], [-1])
    (st, ti, tl), h = a.wait()
    assert st.shape == (14, 4) and ti.shape == tl.shape == (14, 3) and h.shape == (2, d)
    c = be.packed_launch(ids[:5], tok[:5], [4], [-1])  # a was waited for: its side is free
    assert c.side == 0
    assert b.wait().shape == c.wait().shape == (1, 4)
    with pytest.raises(AssertionError, match="twice"):
        b.wait()
    assert not sync


def test_packed_top_launches(monkeypatch, tiny):
    """packed(..., top=k): one row_topk per HEAD_ROWS block, after its row_stats, writing [m, k]
    views of the top buffers, reading the logits and stats it just wrote; (stats, ids,
    log-probs) of the reference's shapes; top 0 launches exactly what it did; a bad top is
    refused before anything runs."""
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.ops import layers as L
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.errors import BadInput
    from minfer.reference.ops import TOP_MAX

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90")
    args = []
    launch = rt.launch
    rt.launch = lambda fn, grid, block, a, **kw: (
        args.append((fn[1], grid, a)),
        launch(fn, grid, block, a),
    )
    be = CudaBackend(
        tiny,
        GemmChoice("f16"),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
        kv_slots=512,
    )
    b = be.buf
    assert b.top_ids.shape == b.top_lp.shape == (16 * TOP_MAX,)
    be.HEAD_ROWS = 4
    tok = np.array([(p, 0) for p in range(5)] + [(128 + p, 128) for p in range(9)], np.int32)
    ids = np.arange(14, dtype=np.int32) % 50
    call = (ids, tok, np.arange(13, -1, -1), np.r_[ids[1:], -1])
    args.clear()
    plain = be.packed(*call)
    base = [e for e, _, _ in args]
    assert not any(e.startswith("row_topk") for e in base) and plain.shape == (14, 4)
    for k in (1, 5, TOP_MAX):
        name = L.topk_entry(k)
        args.clear()
        st, top_ids, top_lp = be.packed(*call, top=k)
        entries = [e for e, _, _ in args]
        assert [e for e in entries if e != name] == base  # top 0's work, unchanged
        assert st.shape == (14, 4) and top_ids.shape == top_lp.shape == (14, k)
        assert top_ids.dtype == np.int32 and top_lp.dtype == np.float32
        stats = [a for e, _, a in args if e == "row_stats_f32"]
        topk = [(g, a) for e, g, a in args if e == name]
        assert len(topk) == len(stats) == 4  # 14 rows, 4 at a time
        assert [i for i, e in enumerate(entries) if e == name] == [
            i + 1 for i, e in enumerate(entries) if e == "row_stats_f32"
        ]
        for r, ((grid, a), s) in enumerate(zip(topk, stats)):
            n = min(4, 14 - 4 * r)
            assert grid == (n,) and int(a[6]) == k and int(a[5]) == tiny.config.vocab_size
            assert int(a[0]) == int(b.top_ids.gpudata) + 4 * k * 4 * r  # row 4r of [14, k]
            assert int(a[1]) == int(b.top_lp.gpudata) + 4 * k * 4 * r
            assert int(a[2]) == int(s[1])  # the logits row_stats read
            assert int(a[3]) == int(s[0]) + 12 and int(a[4]) == 4  # its stats' column 3
    st, i, lp = be.packed(ids[:2], tok[:2], [], [], top=3)
    assert st.shape == (0, 4) and i.shape == lp.shape == (0, 3)
    for bad in (TOP_MAX + 1, -1, 2.5, True):
        args.clear()
        with pytest.raises(BadInput, match="top must be"):
            be.packed(*call, top=bad)
        assert not args


@pytest.mark.parametrize(
    "preset,head_dim", [("tiny-gemma3", 0), ("tiny-gemma2", 0), ("tiny-gemma3", 256)]
)
@pytest.mark.parametrize("path", ["f16", "blk", "f16:no-glu"])
def test_gemma_forward_launches(monkeypatch, tmp_path, preset, head_dim, path):
    """gemma on CUDA (fake runtime): the embedding scaled once, per layer one post-norm add
    after attn_output and one after ffn_down (post32), GeGLU instead of any swiglu (from the
    gate|up GEMM's epilogue: the blk kernel's _geglu entry, the f16 GEMM's mode 5; with
    no-glu the geglu launch after an f32 GEMM), the local layers' rope_qkv reading the second
    RoPE table where their base differs, each attention launch with its layer's window, the
    query scale and gemma2's soft-cap; the final logits soft-capped (gemma2) after the LM
    head."""
    import math

    from fake_gpuarray import install
    from families_data import synth_family

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.paths.f16 import gemm
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    if head_dim:  # the real Gemma files' 256: attention.cu's entry, not the wgmma kernel's
        from dataclasses import replace

        from minfer.tools import synth

        monkeypatch.setitem(
            synth.PRESETS, preset, replace(synth.PRESETS[preset], head_dim=head_dim)
        )
    model = load_model(synth_family(preset, tmp_path))
    c = model.config
    rt = FakeRT("sm_90")
    calls = []
    rt.launch = lambda fn, grid, block, a, smem=0, stream=None: calls.append((fn[1], a))
    choice = GemmChoice.resolve({}, path, variants=True)
    be = CudaBackend(model, choice, rt=rt, max_tokens=256, ubatch=64, warmup=False, graphs=False)
    glu = choice.on("glu")
    assert be.buf.post32 is not None and bool(be.glu) == glu
    calls.clear()
    be.forward_device(np.arange(40, dtype=np.int32), 0)  # one chunk: the last
    entries = [e for e, _ in calls]
    L = c.n_layers
    assert entries.count("scale_f32") == 1 and entries.index("scale_f32") < 3
    assert entries.count("rmsnorm_add_f32") == 2 * L
    assert not any("swiglu" in e for e in entries)
    gegl = [a for e, a in calls if e == "geglu_f32_f16"]
    if not glu:
        assert len(gegl) == L
    elif path == "blk":
        assert not gegl and entries.count("mmq_blk_tok_geglu") == L
    else:  # the last layer's FFN runs its last row alone: the GEMV's f32, then the
        # interleaved geglu (gate|up row stride 16, 8 features a row)
        modes = [
            int(a[-2] if e.startswith("wgmma_f16_tma") else a[-1])
            for e, a in calls
            if e.startswith(("gemm_f16_nt", "wgmma_f16"))
        ]
        assert modes.count(gemm.MODE_GEGLU) == L - 1 and gemm.MODE_GLU not in modes
        assert len(gegl) == 1 and int(gegl[0][4]) == 16 and int(gegl[0][5]) == 8
    assert entries.count("softcap_f32") == (1 if c.logit_softcap else 0)
    if c.logit_softcap:
        assert entries[-1] == "softcap_f32"
    ropes = [a[14] for e, a in calls if e.startswith("rope_qkv")]  # the cos table's pointer
    attn = [a for e, a in calls if e.startswith(("attn_wg", "attn_fwd", "attn_tok"))]
    assert len(ropes) == len(attn) == L
    if head_dim:
        assert c.head_dim == head_dim
        kernels = {e for e in entries if e.startswith("attn")}
        assert f"attn_fwd_d{head_dim}" in kernels and kernels <= {
            f"attn_fwd_d{head_dim}",
            f"attn_tok_d{head_dim}",
        }
    glob = int(devarray.ptr(be.buf.rope.cos))
    for il in range(L):
        local = c.is_local(il)
        assert int(attn[il][12]) == (c.sliding_window if local else 0)
        scale = c.attn_scale
        assert math.isclose(float(attn[il][11]), math.log2(math.e) * scale, rel_tol=1e-6)
        cap_s = c.attn_softcap / scale if c.attn_softcap else 0.0
        assert math.isclose(float(attn[il][13]), cap_s, rel_tol=1e-6)
        differs = c.layer_rope(il) != (c.rope_base, c.rope_scaling)
        assert (int(ropes[il]) != glob) == differs
    assert any(c.layer_rope(il) != (c.rope_base, c.rope_scaling) for il in range(L)) == (
        be.buf.rope_swa is not None
    )


def test_blk_split_channels_reach_the_upload(monkeypatch, tiny):
    """--gemm blk-split with calibrated channels: the backend's weight load gets them (the
    staging the uploads read, Staging.channels), and each ffn_down's upload puts its own
    into the device cols it splits by."""
    from fake_gpuarray import install

    from minfer.cuda import backend as cb
    from minfer.cuda.paths.blk import split_path
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    downs = sorted(n for n in tiny.tensors if ".ffn_down." in n)
    ch = {n: np.arange(3, 3 + 2 * 8, 2, dtype=np.int32) + i for i, n in enumerate(downs)}
    seen, cols = [], {}
    real_load, real_upload = cb.load_weights, split_path.upload_split

    def load(*a, **kw):
        seen.append(a[7] if len(a) > 7 else kw.get("channels"))
        return real_load(*a, **kw)

    def upload(rt, up, parts, name):
        cols[name] = up.channels[name]
        return real_upload(rt, up, parts, name)

    monkeypatch.setattr(cb, "load_weights", load)
    monkeypatch.setattr(split_path, "upload_split", upload)
    rt = FakeRT("sm_90")
    cb.CudaBackend(
        tiny,
        GemmChoice("blk-split", channels=ch),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
    )
    assert seen == [ch] and cols == ch
