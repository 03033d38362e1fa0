"""minfer.cuda.runtime.profile.interleaved_us (the timing scripts' method) on a fake clock: each
config warmed, the pre-roll run until its milliseconds pass, then `groups` rounds of
`launches` launches each, interleaved, each sample the events' time over its launches."""

from __future__ import annotations

import types

from minfer.cuda.runtime.profile import interleaved_us


def test_warm_preroll_then_interleaved_groups():
    clock = [0.0]  # ms
    calls: list[str] = []

    class Event:
        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def time_since(self, other):
            return self.t - other.t

    def launcher(name, ms):
        def fn():
            calls.append(name)
            clock[0] += ms

        return fn

    rt = types.SimpleNamespace(drv=types.SimpleNamespace(Event=Event), synchronize=lambda: None)
    runs = {"a": launcher("a", 0.002), "b": launcher("b", 0.005)}
    us = interleaved_us(rt, runs, launches=4, groups=3, warm=2, preroll_ms=0.02)
    assert calls[:4] == ["a", "a", "b", "b"]  # warmed, config by config
    timed = calls[-24:]  # 3 rounds of 4 a's, then 4 b's
    assert timed == (["a"] * 4 + ["b"] * 4) * 3
    preroll = calls[4:-24]
    assert len(preroll) >= 2 and preroll[:2] == ["a", "b"]
    assert sum(0.002 if c == "a" else 0.005 for c in preroll) >= 0.02 - 1e-12
    assert [round(u, 6) for u in us["a"]] == [2.0] * 3 and [round(u, 6) for u in us["b"]] == [
        5.0
    ] * 3
    calls.clear()
    interleaved_us(rt, runs, launches=1, groups=1)  # no pre-roll: warm once, one round
    assert calls == ["a", "b", "a", "b"]
    calls.clear()
    interleaved_us(rt, runs, launches=1, groups=1, preroll_ms=0)  # a pre-roll of one round
    assert calls == ["a", "b"] * 3
