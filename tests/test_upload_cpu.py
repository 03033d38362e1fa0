"""CPU: the streaming weight upload (minfer.cuda.runtime.upload, weights.load_weights) on a fake
device whose memory is a numpy array: the chunk splitter's arithmetic, every copy bounded by the
staging slot, two pinned slots whatever the model size, and the weights that land on the device
(raw bytes, dequantized f16 rows, interleaved gate|up rows) equal to the reference, byte for
byte, for a tiny chunk that splits every tensor and for the default one."""

from __future__ import annotations

import types

import numpy as np
import pytest
from synth_data import tiny_model

from minfer.cuda.plan.config import GemmChoice
from minfer.cuda.runtime.upload import rows_per_chunk, split_rows


# -- the splitter -------------------------------------------------------------------------------
def test_split_rows():
    # 64 MiB chunks of q4_K rows at K = 4096 (2304 B): 29120 rows (a multiple of 8) per chunk
    assert rows_per_chunk(2304, 64 << 20) == 29120 and 29120 * 2304 <= 64 << 20
    parts = split_rows(100_000, 2304, 64 << 20)
    assert parts == [(0, 29120), (29120, 29120), (58240, 29120), (87360, 12640)]  # ragged last
    assert sum(n for _, n in parts) == 100_000
    assert split_rows(12, 100, 64 << 20) == [(0, 12)]  # smaller than a chunk: one
    assert split_rows(20, 100, 1000) == [(0, 8), (8, 8), (16, 4)]  # 10 rows fit: 8 taken
    assert split_rows(20, 100, 10) == [(0, 8), (8, 8), (16, 4)]  # a chunk under 8 rows: 8
    assert split_rows(20, 100, 1000, multiple=1) == [(0, 10), (10, 10)]
    assert split_rows(0, 100, 1000) == []


# -- a fake device with memory ------------------------------------------------------------------
BASE = 1 << 32


class _Ptr(int):
    rt = None  # the MemRT that made it (records frees)

    def free(self):
        if self.rt is not None:
            self.rt.freed.add(int(self))


class _Arr:
    """A GPUArray stand-in over the fake memory (what load_weights and devarray use)."""

    def __init__(self, shape, dtype, gpudata=None, base=None, strides=None):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.gpudata, self.base = gpudata, base
        self.strides = tuple(
            self.dtype.itemsize * int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape))
        )

    rt = None  # the MemRT whose memory set() writes

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def set(self, a):  # a synchronous upload (the small f32 norms)
        o = self.rt.at(self.gpudata)
        self.rt.mem[o : o + self.nbytes] = (
            np.ascontiguousarray(a, self.dtype).view(np.uint8).reshape(-1)
        )


class MemRT:
    """Allocations in one numpy byte array; async copies, 2D copies and the dequant kernel
    (its numpy twin) act on it; records the size of every host -> device copy."""

    arch, sm_count, smem_optin, poisoning, stream = "sm_80", 4, 232448, False, None
    cfg = types.SimpleNamespace(debug=False, poison=False, device=0)

    def __init__(self, size=64 << 20):
        self.mem = np.zeros(size, np.uint8)
        self.top = 0
        self.htod: list[int] = []
        self.pinned: list[int] = []
        self.launch_streams: set = set()
        self.allocs: list[tuple[int, int, str]] = []  # (pointer, bytes, what) in order
        self.freed: set[int] = set()
        self.f16_live_max = 0  # the most f16 weight bytes alive at once
        self.f16_live: list = []  # the f16 weights (ptr, bytes) alive at each allocation
        rt = self

        class Copy2D:
            def set_src_device(self, p):
                self.src = int(p)

            def set_src_host(self, a):
                raise AssertionError("the chunked upload copies device -> device")

            def set_dst_device(self, p):
                self.dst = int(p)

            def __call__(self, stream=None, aligned=False):
                for j in range(self.height):
                    s, d = (
                        rt.at(self.src + j * self.src_pitch),
                        rt.at(self.dst + j * self.dst_pitch),
                    )
                    rt.mem[d : d + self.width_in_bytes] = rt.mem[s : s + self.width_in_bytes]

        def pinned(shape, dtype):
            self.pinned.append(int(np.prod(shape)))
            return np.empty(shape, dtype)

        def htod(dst, src, stream=None):
            assert stream is not None, "an async copy on the upload stream"
            self.htod.append(int(src.nbytes))
            d = self.at(dst)
            self.mem[d : d + src.nbytes] = src.reshape(-1).view(np.uint8)

        self.drv = types.SimpleNamespace(
            pagelocked_empty=pinned,
            memcpy_htod_async=htod,
            Memcpy2D=Copy2D,
            Stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
            Event=lambda: types.SimpleNamespace(
                record=lambda s=None: None, synchronize=lambda: None
            ),
            Error=RuntimeError,
        )

    def at(self, p: int) -> int:
        o = int(p) - BASE
        assert 0 <= o < self.top, hex(p)
        return o

    def alloc(self, nbytes, what="buffer"):
        p = self.top
        self.top += (max(int(nbytes), 1) + 255) // 256 * 256
        assert self.top <= self.mem.size, "fake device full"
        ptr = _Ptr(BASE + p)
        ptr.rt = self
        self.allocs.append((int(ptr), int(nbytes), what))
        live = [(a, n) for a, n, w in self.allocs if "f16 weight" in w and a not in self.freed]
        self.f16_live.append(live)
        self.f16_live_max = max(self.f16_live_max, sum(n for _, n in live))
        return ptr

    def function(self, name, entry, options=(), dyn_smem=0):
        return types.SimpleNamespace(_minfer_name=entry)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        from minfer.cuda.ops.dequant import dequant_f16_ref, kernel_suffix
        from minfer.quants import traits_of

        self.launch_streams.add(id(self.stream))
        if fn._minfer_name == "blk_operand_f16":  # the blk requant: its numpy twin
            from minfer.cuda.paths.blk.twin import blk_operand, quantize_blk

            x, ld, R, K, _, out, smul, pair = args
            xs = self.at(x)
            w16 = self.mem[xs : xs + 2 * R * int(ld)].view(np.float16).reshape(R, int(ld))[:, :K]
            weight = float(smul) != 1.0
            assert int(pair) == (2 if weight else 1)  # (a weight: a scale per pair of blocks)
            op = blk_operand(*quantize_blk(w16, weight=weight))
            o = self.at(out)
            self.mem[o : o + op.nbytes] = op.reshape(-1)
            return
        assert fn._minfer_name.startswith("dq_f16_"), fn._minfer_name
        src, nbytes, out, n = (int(a) for a in args)
        q = next(
            q
            for q in (0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14)
            if fn._minfer_name == "dq_f16_" + kernel_suffix(traits_of(q))
        )
        s, o = self.at(src), self.at(out)
        y = dequant_f16_ref(self.mem[s : s + nbytes], q, 1, n)  # one flat row, as the kernel
        self.mem[o : o + 2 * n] = y.reshape(-1).view(np.uint8)

    def poison(self, *a, **kw):
        pass

    def synchronize(self):
        pass

    def read(self, a) -> np.ndarray:
        o = self.at(a.gpudata)
        return self.mem[o : o + a.nbytes].view(a.dtype).reshape(a.shape)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("upload"), seed=4))


@pytest.fixture
def fake_arrays(monkeypatch):
    from minfer.cuda.runtime import devarray

    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))


def _load(model, gemm: str, chunk: int):
    from minfer.cuda.load.weights import load_weights
    from minfer.cuda.plan.fusion import plan_fusion, plan_glu
    from minfer.cuda.plan.routes import plan_routes
    from minfer.cuda.plan.sizes import upload_slot

    rt = _Arr.rt = MemRT()
    choice = GemmChoice(gemm)
    routes = plan_routes(model, choice, rt, 64)
    fused = plan_fusion(model, routes)
    glu = frozenset(plan_glu(model, choice, routes, fused))
    slot = upload_slot(model, routes, chunk)
    return rt, routes, fused, glu, slot, load_weights(rt, model, routes, fused, slot, False, glu)


@pytest.mark.parametrize("gemm", ["f16", "wide-kd4"])
@pytest.mark.parametrize("chunk", [4 << 10, 64 << 20])
def test_load_weights_streams_bounded_chunks(tiny, fake_arrays, gemm, chunk):
    from minfer.cuda.ops.dequant import dequant_f16_ref
    from minfer.quants.glu import glu_rows

    rt, routes, fused, glu, slot, dw = _load(tiny, gemm, chunk)
    m = tiny
    big = max(int(m.tensor(n).data.nbytes) for n in routes)
    # host memory: two pinned slots of the slot size, every copy within one
    assert rt.pinned == [slot, slot] and max(rt.htod) <= slot
    if chunk < big:
        assert slot < big and len(rt.htod) > len(routes) + 1  # tensors were split
    else:
        assert slot == big
    assert rt.launch_streams and id(None) not in rt.launch_streams  # on the upload stream
    # the file bytes read into ready weights (the embedding once, norms included)
    assert (
        dw.nbytes >= sum(int(m.tensor(n).data.nbytes) for n in set(routes) | {"token_embd.weight"})
        and dw.seconds > 0
    )
    emb = m.tensor("token_embd.weight")
    assert np.array_equal(rt.read(dw.emb), emb.data.reshape(-1).view(np.uint8))
    checked_glu = 0
    for n, (path, _) in routes.items():
        t = m.tensor(n)
        N, K = t.shape
        raw = t.data.reshape(N, -1).view(np.uint8)
        if path != "f16":  # raw bytes, as in the file
            if n in fused and fused[n][0] in glu:
                continue
            assert np.array_equal(rt.read(dw.w[n]).reshape(N, -1), raw), n
            continue
        ref = dequant_f16_ref(raw, t.qtype, N, K)
        if n in fused and fused[n][0] in glu:  # interleaved per 16 rows with its partner
            g, r0, _ = fused[n]
            got = rt.read(dw.w[g])
            F = got.shape[0] // 2
            plain = glu_rows(F)  # interleaved row i = plain row plain[i]
            rows = np.nonzero((plain >= r0) & (plain < r0 + N))[0]
            assert np.array_equal(
                got[rows].view(np.uint16), ref[plain[rows] - r0].view(np.uint16)
            ), n
            checked_glu += 1
            continue
        assert np.array_equal(rt.read(dw.w[n]).view(np.uint16), ref.view(np.uint16)), n
    if gemm == "f16":
        assert checked_glu == 2 * m.config.n_layers  # gate and up of every layer


def test_blk_load_requantizes_one_group_at_a_time(tiny, fake_arrays):
    """--gemm blk: every weight ends as the block path's operand, bit for bit its twin's of the
    dequantized f16 rows, and at most one fused group's f16 (or one lone weight's) is alive at
    a time: the memory plan's "blk requant staging", not the whole model's f16."""
    from minfer.cuda.ops.dequant import dequant_f16_ref
    from minfer.cuda.paths.blk.launch import BlkWeight
    from minfer.cuda.paths.blk.twin import blk_operand, quantize_blk
    from minfer.cuda.plan.sizes import plan_memory

    MemRT.arch = "sm_90"
    try:
        rt, routes, fused, glu, slot, dw = _load(tiny, "blk", 64 << 20)
    finally:
        MemRT.arch = "sm_80"
    m = tiny
    blk = [n for n, (p, _) in routes.items() if p == "blk"]
    assert blk and fused
    plan = plan_memory(m, routes, 64, 64, glu_all=True)
    # (the f16 weights blk leaves on f16, ffn_down, stay alive: they are not staging)
    kept = {a for a, n, w in rt.allocs if "f16 weight" in w and a not in rt.freed}
    staged = max(sum(n for a, n in live if a not in kept) for live in rt.f16_live)
    assert kept and 0 < staged <= plan["blk requant staging"]
    assert plan["blk requant staging"] < sum(int(np.prod(m.tensor(n).shape)) * 2 for n in blk)
    for n in blk:
        t = m.tensor(n)
        N, K = t.shape
        w16 = dequant_f16_ref(t.data.reshape(N, -1).view(np.uint8), t.qtype, N, K)
        if n in fused:
            assert n not in dw.w  # a member of a requantized group: no row view
            continue
        assert isinstance(dw.w[n], BlkWeight)
        assert np.array_equal(rt.read(dw.w[n].wb), blk_operand(*quantize_blk(w16, weight=True)))
    for g in {fused[n][0] for n in blk if n in fused}:
        assert isinstance(dw.w[g], BlkWeight)


def test_staging_reads_a_large_chunk_in_parallel_and_alternates_slots():
    from minfer.cuda.runtime.upload import READERS, Staging

    rt = MemRT()
    up = Staging(rt, 8 << 20)
    assert up.pool is not None and rt.pinned == [8 << 20, 8 << 20]
    src = np.random.default_rng(0).integers(0, 256, (8 << 20) - 5, dtype=np.uint8)
    dst = int(rt.alloc(src.size))
    assert up.put(src, dst) == dst
    at = up.put(src[:1000])  # no destination: the other slot's device buffer
    assert at == int(up.dev[1]) and up.put(src[:10]) == int(up.dev[0])
    up.close()
    o = rt.at(dst)
    assert np.array_equal(rt.mem[o : o + src.size], src) and up.nbytes == src.size + 1010
    assert READERS > 1
    with pytest.raises(Exception, match="staging slot"):
        Staging(rt, 100).put(src[:101])


@pytest.mark.parametrize("gemm,arch", [("f16", "sm_80"), ("wide-kd4", "sm_80"), ("blk", "sm_90")])
def test_check_uploads_the_bytes_the_engine_loads(tiny, fake_arrays, gemm, arch):
    """`minfer check`'s weights (paths.upload_weight, one weight or fused group through its own
    staging) are the engine's (load_weights), byte for byte: both call the path's `upload`.
    Every lone weight and every fused group (the glu groups interleaved) of the tiny model."""
    from minfer.cuda.paths import TABLE, Part, upload_weight
    from minfer.cuda.paths.blk.launch import BlkWeight

    def read(rt, w):
        return rt.read(w.wb if isinstance(w, BlkWeight) else w).view(np.uint8).reshape(-1)

    MemRT.arch = arch
    try:
        rt, routes, fused, glu, slot, dw = _load(tiny, gemm, 4 << 10)
        units: dict[str, list[str]] = {}
        for n in routes:
            units.setdefault(fused[n][0] if n in fused else n, []).append(n)
        assert any(len(u) > 1 for u in units.values())
        for key, members in units.items():
            path = TABLE[routes[members[0]][0]]
            if key == "token_embd.weight":
                continue
            members.sort(key=lambda k: fused[k][1] if k in fused else 0)
            parts = [
                Part(
                    k,
                    tiny.tensor(k).data.reshape(tiny.tensor(k).shape[0], -1).view(np.uint8),
                    tiny.tensor(k).qtype,
                    int(tiny.tensor(k).shape[1]),
                )
                for k in members
            ]
            rt2 = _Arr.rt = MemRT()
            w = upload_weight(rt2, path, parts, key, glu=key in glu, slot_bytes=4 << 10)
            _Arr.rt = rt
            assert np.array_equal(read(rt2, w), read(rt, dw.w[key])), key
    finally:
        MemRT.arch = "sm_80"
