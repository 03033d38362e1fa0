"""Diagnostic: the int8 wgmma rate one SM reaches on a bare stream of m64n128k32 (2 warpgroups,
groups of 4, wait 1), in MACs per clock against the 4096 of the spec (1979 dense TOPS).
python3 scripts/wgmma_peak.py"""
import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.runtime import get_runtime

rt = get_runtime()
for n in (128, 256):
    fn = rt.function("../scripts/wgmma_peak", f"wgmma_peak{n}", ("-arch=sm_90a",),
                     dyn_smem=64 * 1024)
    for iters in (1000, 4000):
        cyc = da.to_device(rt, np.zeros(rt.sm_count, np.int64))
        sink = da.to_device(rt, np.zeros(1, np.int32))
        rt.launch(fn, (rt.sm_count,), (256,), (da.arg(cyc), np.int32(iters), da.arg(sink)), 64 * 1024)
        rt.synchronize()
        c = cyc.get().astype(np.float64)
        macs = 2 * iters * 4 * 64 * n * 32
        print(f"m64n{n}k32 x4 per group, 2 WGs, {iters} groups: {np.median(c):.0f} clk, "
              f"{macs / np.median(c):.0f} MAC/clk/SM ({macs / np.median(c) / 4096:.0%} of 4096)")

for name, what, threads in (
        ("wgmma_fold128", "the kernel's pattern: wgmma + dependent folds", 256),
        ("wgmma_nofold128", "the wgmmas alone", 256),
        ("ffma_fold128", "the folds alone", 256),
        ("wgmma_indep128", "wgmmas + as many FFMAs that read no accumulator", 256),
        ("wgmma_thirdwg128", "2 WGs of wgmmas, the FFMAs on a third WG", 384),
        ("wgmma_pingpong128", "ping-pong: 2 chunks a turn, fold under the other's", 256),
        ("wgmma_instep128", "the ping-pong's work in step (no turns)", 256),
        ("wgmma_edge128", "+ a 64-FFMA rescale, wait 0 at each edge (the kernel)", 256),
        ("wgmma_edgepipe128", "+ the rescale, 2 SBs an iteration, the edge between them pipelined", 256)):
    fn = rt.function("../scripts/wgmma_peak", name, ("-arch=sm_90a",), dyn_smem=64 * 1024)
    for iters in (500, 2000):
        cyc = da.to_device(rt, np.zeros(rt.sm_count, np.int64))
        sink = da.to_device(rt, np.zeros(1, np.int32))
        ev = [rt.drv.Event(), rt.drv.Event()]
        ev[0].record()
        rt.launch(fn, (rt.sm_count,), (threads,), (da.arg(cyc), np.int32(iters), da.arg(sink),
                                                np.float32(1.5), np.float32(2.5)), 64 * 1024)
        ev[1].record()
        rt.synchronize()
        c = cyc.get().astype(np.float64)
        macs = 2 * iters * 8 * 64 * 128 * 32
        ms = ev[1].time_since(ev[0])
        print(f"SB inner loop, {what}, {iters} iters: {np.median(c):.0f} clk, "
              f"{macs / np.median(c):.0f} MAC-equivalents/clk/SM ({macs / np.median(c) / 4096:.0%}); "
              f"SM clock {np.median(c) / ms / 1e6:.2f} GHz")
