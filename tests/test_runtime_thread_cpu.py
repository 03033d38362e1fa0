"""The GPU context on the calling thread (Runtime.on_thread, Engine's GPU entry points): pycuda's
context stack is per thread, and Ray Data calls an actor's batches on another thread than its
constructor, which on an H100 failed with "invalid device context" at the first synchronize.
Here a fake pycuda driver keeps a context stack per thread, as CUDA does."""

from __future__ import annotations

import threading
import types

import pytest
from helpers import on_thread as on_other_thread

from minfer.cuda.runtime import runtime as R


class FakeCtx:
    stacks = threading.local()

    def __init__(self, handle: int):
        self.handle = handle

    @classmethod
    def stack(cls) -> list:
        if not hasattr(cls.stacks, "s"):
            cls.stacks.s = []
        return cls.stacks.s

    def push(self):
        self.stack().append(self)

    def pop(self):
        self.stack().pop()

    @classmethod
    def get_current(cls):
        s = cls.stack()
        return FakeCtx(s[-1].handle) if s else None  # a new object, as pycuda returns


def fake_drv():
    dev = types.SimpleNamespace(
        retain_primary_context=lambda: FakeCtx(0x5EED),
        compute_capability=lambda: (9, 0),
        get_attribute=lambda a: 132,
        name=lambda: "fake H100",
    )
    return types.SimpleNamespace(
        init=lambda: None,
        Device=types.SimpleNamespace(count=lambda: 1, __call__=None),
        Context=FakeCtx,
        device_attribute=types.SimpleNamespace(
            MULTIPROCESSOR_COUNT=0, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=1
        ),
        _dev=dev,
    )


@pytest.fixture
def runtime(monkeypatch):
    drv = fake_drv()

    class Device:
        @staticmethod
        def count():
            return 1

        def __new__(cls, i):
            return drv._dev

    drv.Device = Device
    monkeypatch.setattr(R, "_import_pycuda", lambda: drv)
    monkeypatch.setattr(R.atexit, "register", lambda f: None)
    return R.Runtime()


def test_another_thread_gets_the_context_inside_and_loses_it_after(runtime):
    def work():
        before = FakeCtx.get_current()
        with runtime.on_thread():
            inside = FakeCtx.get_current().handle
        return before, inside, FakeCtx.get_current(), len(FakeCtx.stack())

    before, inside, after, depth = on_other_thread(work)
    assert before is None  # the failure Ray hit: no context on a fresh thread
    assert inside == 0x5EED
    assert after is None and depth == 0


def test_the_making_thread_pushes_nothing(runtime):
    depth = len(FakeCtx.stack())  # the runtime pushed its context here once
    assert FakeCtx.get_current().handle == 0x5EED
    with runtime.on_thread():
        assert len(FakeCtx.stack()) == depth
    assert len(FakeCtx.stack()) == depth


def test_engine_gpu_entry_points_enter_the_context(monkeypatch):
    """Engine.run and Engine.prepare run inside get_runtime().on_thread() on the cuda backend,
    and never touch the runtime on the cpu one."""
    from minfer.engine import api

    entered = []

    class Rt:
        def on_thread(self):
            import contextlib

            entered.append(threading.get_ident())
            return contextlib.nullcontext()

    monkeypatch.setattr(R, "get_runtime", lambda: Rt())
    for name in ("run", "prepare"):
        assert getattr(api.Engine, name).__wrapped__  # the decorated method
    eng = object.__new__(api.Engine)
    seen = []
    wrapped = api._on_gpu_thread(lambda self: seen.append(threading.get_ident()))
    eng.kind = "cuda"
    tid = on_other_thread(lambda: (wrapped(eng), threading.get_ident())[1])
    assert entered == [tid] and seen == [tid]
    eng.kind = "cpu"
    wrapped(eng)
    assert len(entered) == 1 and len(seen) == 2
