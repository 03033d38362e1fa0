"""Why `minfer prefill` and `minfer bench --min-ms 0` print different tok/s for one prompt length
(device): one process, every config's CUDA backend built and warmed up, then per config and
regime the wall tok/s (as bench and prefill time it), the GPU's own time of the same prefill
(CUDA events around it: the host's share is the difference) and the SM clock at its start and
end (NVML).

python3 lab/regimes.py MODEL.gguf [--tokens 2048] [--ab f16,blk] [--repeats 5] [--idle-s 2]

Regimes, each sample of each config in turn (the configs interleaved as bench does):
  after-other   one prefill right after the other config's (bench's --min-ms 0 today)
  idle          --idle-s of an idle GPU, then one prefill (a cold start, no warm-up)
  idle+pre      --idle-s idle, one untimed prefill, then the timed one (what `minfer prefill`
                times: its warm-up runs the prompt's forward once, then the timed replay)
  sustained     a pre-roll, then back-to-back prefills for 500 ms (bench's default)
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


def nvml_readers():
    """(clock, power): () -> the SM clock in MHz / the board's power in W now (NVML), or
    () -> None each without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return (
            lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
        )
    except Exception:  # (a lab script: no NVML, no clocks)
        return (lambda: None), (lambda: None)


class Sampler:
    """The SM clock sampled every ~2 ms on a thread between start() and stop() -> median MHz."""

    def __init__(self, read):
        self.read, self.vals, self.on = read, [], False

    def _run(self):
        while self.on:
            v = self.read()
            if v is not None:
                self.vals.append(v)
            time.sleep(0.002)

    def start(self):
        self.vals, self.on = [], True
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def stop(self):
        self.on = False
        self.t.join()
        return statistics.median(self.vals) if self.vals else float("nan")


def timed(be, ids, drv, k=1):
    """(wall s, GPU s) of k back-to-back prefills from an empty cache: bench.time_prefill's
    loop with CUDA events on the backend's stream around the GPU's share of it."""
    e0, e1 = drv.Event(), drv.Event()
    be.synchronize()
    t0 = time.perf_counter()
    for i in range(k):
        be.reset()
        if i == 0:
            e0.record(be.stream)
        be.forward(ids, 0)
    e1.record(be.stream)
    be.synchronize()
    wall = time.perf_counter() - t0
    return wall, e1.time_since(e0) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ab", default="f16,blk")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=2.0)
    a = ap.parse_args()

    import pycuda.driver as drv

    from minfer.commands.gemm_flags import gemm_choice
    from minfer.engine.backends import make_backend
    from minfer.gguf.loader import load_model
    from minfer.tools.bench.ab import prompt_ids

    model = load_model(a.model)
    n = a.tokens
    ids = prompt_ids(model, n)
    cfgs = a.ab.split(",")
    bes = {c: make_backend("cuda", model, gemm_choice(ab=c), n, n, progress=False) for c in cfgs}
    for be in bes.values():
        be.warmup([n])
        be.reset()
    read, power = nvml_readers()
    samp = Sampler(read)
    res = {(c, r): [] for c in cfgs for r in ("after-other", "idle", "idle+pre", "sustained")}
    for rep in range(a.repeats):
        for regime in ("after-other", "idle", "idle+pre", "sustained"):
            for c in cfgs[rep % len(cfgs) :] + cfgs[: rep % len(cfgs)]:
                be, k = bes[c], 1
                if regime == "after-other":
                    other = bes[cfgs[(cfgs.index(c) + 1) % len(cfgs)]]
                    timed(other, ids, drv)
                elif regime.startswith("idle"):
                    time.sleep(a.idle_s)
                    if regime == "idle+pre":
                        timed(be, ids, drv)
                else:
                    w, _ = timed(be, ids, drv)  # pre-roll, and the count for 500 ms
                    k = max(1, int(0.5 / w))
                clk0, pw0 = read(), power()
                samp.start()
                wall, gpu = timed(be, ids, drv, k)
                med = samp.stop()
                res[(c, regime)].append((n * k / wall, n * k / gpu, clk0, med, pw0))
    print(
        f"{n} tokens, {a.repeats} repeats, idle {a.idle_s:g} s; medians (min..max) of: wall "
        "tok/s (as bench), GPU tok/s (events), SM MHz at the start / median during, board W "
        "at the start"
    )
    print(
        "| config | regime | wall tok/s | GPU tok/s | host share | MHz start | MHz during | "
        "W start |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (c, r), xs in res.items():
        col = list(zip(*xs))
        med = [statistics.median([v for v in x if v is not None] or [float("nan")]) for x in col]
        lo, hi = min(col[0]), max(col[0])
        print(
            f"| {c} | {r} | {med[0]:,.0f} ({lo:,.0f}..{hi:,.0f}) | {med[1]:,.0f} | "
            f"{1 - med[0] / med[1]:.1%} | {med[2]:,.0f} | {med[3]:,.0f} | {med[4]:,.0f} |"
        )


if __name__ == "__main__":
    main()
