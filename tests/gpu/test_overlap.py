"""The scheduler's overlap on the GPU (minfer/batch/launch.py, CudaBackend.packed_launch):
packed_launch + wait gives packed()'s bits (top, hidden rows; eager, captured and replayed
chunks); two launches then two waits give the bits of two serial packed() calls, a chunk that
reads the KV rows the launch before it writes included (the double pinned buffers, the
stream order); Engine.embed's pooled jobs and scoring / generation jobs through the scheduler
give the same bits with overlap on and off (the same forwards, packed alike)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _bits(a, b) -> bool:
    """Whether two packed() results (arrays, tuples of them, nested) hold the same bytes."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_bits, a, b))
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _layout(lengths, base0=0, align=128):
    """ids positions: tok int32 [sum, 2] of sequences at base0, base0 + align*k, ..."""
    rows, base = [], base0
    for n in lengths:
        rows += [(base + p, base) for p in range(n)]
        base += -(-n // align) * align
    return np.array(rows, np.int32)


@pytest.fixture(scope="module")
def gpu(model):
    from minfer.cuda.backend import CudaBackend

    return CudaBackend(model, max_tokens=256, ubatch=64, kv_slots=2048)


def _calls(model):
    """(ids, tok, rows, targets, kw) of a few shapes: prefill rows of three sequences with and
    without top and hidden, a decode step's layout (one token a sequence, padded), hidden only."""
    rng = np.random.default_rng(3)
    V = model.config.vocab_size
    tok = _layout([9, 30, 2])
    ids = rng.integers(0, V, len(tok)).astype(np.int32)
    ends = np.cumsum([9, 30, 2]) - 1
    every = np.arange(len(ids))
    # one token after each prompt (whose rows the first call writes), the last one repeated
    dec = np.array([(9, 0), (158, 128), (258, 256), (258, 256)], np.int32)
    dec_ids = ids[[0, 1, 2, 2]]
    return [
        (ids, tok, every, np.r_[ids[1:], -1], {}),
        (ids, tok, every[::-1].copy(), np.full(len(ids), -1), {"top": 5}),
        (ids, tok, ends, np.full(3, -1), {"top": 3, "hidden": every}),
        (ids, tok, [], [], {"hidden": ends}),
        (dec_ids, dec, np.arange(3), np.full(3, -1), {"top": 2}),
    ]


def test_launch_and_wait_equal_packed(gpu, model):
    for ids, tok, rows, tg, kw in _calls(model):
        want = gpu.packed(ids, tok, rows, tg, **kw)
        for _ in range(3):  # eager, eager then captured, the graph replayed
            got = gpu.packed_launch(ids, tok, rows, tg, **kw).wait()
            assert _bits(got, want), (len(ids), kw)


def test_two_launches_then_two_waits_equal_serial_calls(gpu, model):
    """Independent chunks, and a sequence's second chunk launched while its first (whose KV
    rows it reads) is still queued: the bits of packed() one after the other."""
    calls = _calls(model)
    rng = np.random.default_rng(4)
    V = model.config.vocab_size
    seq = rng.integers(0, V, 100).astype(np.int32)
    first, second = [], []
    for base in (1024, 1536):  # the serial run, then the overlapped one on its own slots
        t = _layout([100], base)
        first.append((seq[:60], t[:60], np.arange(60), seq[1:61], {"top": 4}))
        second.append((seq[60:], t[60:], np.arange(40), np.r_[seq[61:], -1], {"hidden": [39]}))
    cases = [
        ((calls[0], calls[2]), (calls[0], calls[2])),
        ((calls[3], calls[4]), (calls[3], calls[4])),
        ((first[0], second[0]), (first[1], second[1])),  # (own slots, the same alignment)
    ]
    for serial, (a, b) in cases:
        want = [gpu.packed(ids, tok, rows, tg, **kw) for ids, tok, rows, tg, kw in serial]
        for _ in range(2):
            ha = gpu.packed_launch(*a[:4], **a[4])
            hb = gpu.packed_launch(*b[:4], **b[4])
            with pytest.raises(AssertionError, match="outstanding"):
                gpu.packed_launch(*a[:4], **a[4])
            assert _bits(ha.wait(), want[0]) and _bits(hb.wait(), want[1])


class _Recorder:
    """The backend with each launch's token count recorded (the packing of a run)."""

    def __init__(self, be):
        self.be, self.sizes = be, []
        self.kv_slots = be.kv_slots
        if hasattr(be, "max_tokens"):  # (what Engine.prepare reads of a CudaBackend)
            self.max_tokens = be.max_tokens

    def packed_launch(self, ids, *a, **kw):
        self.sizes.append(len(ids))
        return self.be.packed_launch(ids, *a, **kw)

    def packed(self, *a, **kw):
        return self.packed_launch(*a, **kw).wait()

    def copy_kv(self, *a):
        self.be.copy_kv(*a)

    def thread_context(self):
        return self.be.thread_context()


def test_embed_and_scoring_bits_with_overlap_on_and_off(model):
    from minfer.batch.jobs import run_pooled
    from minfer.batch.scheduler import Job, Scheduler
    from minfer.engine.api import Engine

    eng = Engine(model, backend="cuda")
    rng = np.random.default_rng(5)
    V = model.config.vocab_size
    prompts = [rng.integers(0, V, int(n)).astype(np.int32) for n in rng.integers(1, 300, 48)]
    run_pooled(eng, prompts, "last", keep=False)  # (the backend made, kernels, graphs)
    real = eng.backend
    out, sizes = {}, {}
    try:
        for overlap in (True, False, True):
            eng.backend = rec = _Recorder(real)
            for pool in ("last", "mean"):
                got = run_pooled(eng, prompts, pool, keep=False, overlap=overlap)
                out.setdefault((overlap, pool), []).append(np.stack([r.vec for r in got]))
            sizes.setdefault(overlap, []).append(rec.sizes)
    finally:
        eng.backend = real
    assert sizes[True][0] == sizes[True][1] == sizes[False][0]  # packed alike
    for pool in ("last", "mean"):
        a, b = out[(True, pool)], out[(False, pool)]
        assert _bits(a[0], b[0]) and _bits(a[1], b[0]), pool

    # scoring (echo log-probs, top 5, one token: lm-eval's shape) and generation, a shared
    # head among them (the prefix cache), through the server's scheduler
    head = rng.integers(0, V, 40).astype(np.int32)
    texts = [np.concatenate([head, rng.integers(0, V, k).astype(np.int32)]) for k in (3, 30)]
    texts += [rng.integers(0, V, n).astype(np.int32) for n in (7, 100, 250, 64)]
    if sum(map(len, texts)) > eng.ubatch:  # (one forward holds the first prompts: packed alike)
        pytest.skip(f"ubatch {eng.ubatch} < the prompts' {sum(map(len, texts))} tokens")
    res, sizes = {}, {}
    for overlap in (True, False):
        got = {i: [] for i in range(2 * len(texts))}
        rec = _Recorder(real)
        sched = Scheduler(rec, eng.kv_slots, eng.ubatch, overlap=overlap)
        jobs = [
            Job(
                t,
                1 if i < len(texts) else 4,
                (lambda i: lambda k, v: got[i].append((k, _plain(k, v))))(i),
                prompt_stats=i < len(texts),
                top=5,
                gen_logprobs=True,
            )
            for i, t in enumerate(texts + texts)
        ]
        sched.submit(jobs)
        for _ in range(1000):
            if sched.idle():
                break
            sched.step()
        assert sched.idle()
        res[overlap], sizes[overlap] = got, rec.sizes
    print(f"\nscoring forwards' tokens: {sizes[True]}")
    assert sizes[True] == sizes[False]  # packed alike (the followers copy a step later)
    assert res[True] == res[False]
    assert all(v and v[-1] == ("done", "length") for v in res[True].values())


def _plain(kind, v):
    if kind == "prompt":
        return (v.argmax.tobytes(), v.logprob.tobytes(), v.top_ids.tobytes(), v.top_lp.tobytes())
    if kind == "token":
        return (v.id, v.logprob, v.top_ids.tobytes(), v.top_lp.tobytes())
    return v
