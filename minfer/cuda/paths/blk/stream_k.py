"""The tile schedule of the persistent int8 wgmma kernel (mmq_blk.cu; kernels/wgmma_common.cuh
TileSched, sk_put / sk_add): whole waves of tiles round-robin over the grid, then stream-K over
the last 1-2 waves' worth. `schedule` is the launcher's choice, `sk_items` the Python twin of
the kernels' per-block work items (tests/test_stream_k.py checks that they cover every stage of
every tile once, with at most two parts per tile), `sk_workspace` the partial-sum slots and
flags, `launch_persistent` one launch under that schedule. docs/mmq.md "Work items".
"""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError

SK_SLOT_BYTES = 256 * 64 * 4  # one block's partial sums (256 threads x 64 f32, q4_K's tile)


def schedule(tiles: int, sms: int, persist: bool = True, stream_k: bool = True) -> tuple[int, int]:
    """(grid, dp) of a persistent launch: `dp` tiles run data-parallel, round-robin over the
    grid, and the rest stream-K (the kernels' wgmma::TileSched). Persistent: grid = min(tiles,
    sms). With stream-K and a ragged last wave, the last 1-2 waves' tiles (between grid and
    2 * grid of them) are split by k-stages evenly over the grid, so every block's share is at
    least one tile's stages and a split tile has exactly two parts; otherwise dp = tiles."""
    if not persist:
        return tiles, tiles
    grid = min(tiles, sms)
    waves, rem = divmod(tiles, grid)
    if not stream_k or rem == 0:
        return grid, tiles
    return grid, (waves - 1) * grid


def sk_items(tiles: int, KT: int, grid: int, dp: int) -> list[list[tuple[int, int, int]]]:
    """The Python twin of wgmma::TileSched::next (the same integer formulas): per block, its
    work items (tile, k0, k1) in the order it runs them. tests/test_stream_k.py checks that
    they cover every (tile, stage) once, with at most two parts per tile."""
    U = (tiles - dp) * KT
    out = []
    for b in range(grid):
        ndp = (dp - b + grid - 1) // grid if dp > b else 0
        items = [(b + i * grid, 0, KT) for i in range(ndp)]
        u0, u1 = U * b // grid, U * (b + 1) // grid
        j = 0
        while True:
            u = u0 if j == 0 else (u0 // KT + j) * KT
            if u >= u1:
                break
            k0 = u % KT
            items.append((dp + u // KT, k0, min(KT, k0 + (u1 - u))))
            j += 1
        out.append(items)
    return out


def tile_origin(
    pid: int, M: int, N: int, BM: int = 128, BN: int = 128, group_m: int = 8
) -> tuple[int, int]:
    """The twin of gemm_f16::tile_origin (kernels/gemm_f16_common.cuh): tile `pid` of the
    ceil(M / BM) x ceil(N / BN) grid in the grouped order starts at (m0, n0). Groups of
    `group_m` M-tiles (the last one ragged) sweep every N-tile, M fastest, so the blocks
    running at once share a few operand stripes that stay in L2 (the f16 GEMM and mmq_blk)."""
    npm, npn = -(-M // BM), -(-N // BN)
    in_group = group_m * npn
    first = pid // in_group * group_m
    gsz = min(npm - first, group_m)
    return (first + pid % in_group % gsz) * BM, pid % in_group // gsz * BN


def sk_workspace(rt):
    """(partials, flags) of the stream-K launches: SK_SLOT_BYTES per SM and one int32 flag per
    SM, zeroed once and kept by the runtime (the kernels clear every flag they raise, so graph
    replays need no reset). One workspace per runtime: blk launches must not run concurrently
    (the engine and `minfer check` issue them on one stream). Made at the first blk launch, an
    eager one (never while a CUDA graph is being captured: the engine's first forward of a
    shape runs eagerly)."""
    return rt.workspace(
        "mmq stream-K", rt.sm_count * (SK_SLOT_BYTES + 4), rt.sm_count * SK_SLOT_BYTES
    )


__all__ = ["SK_SLOT_BYTES", "schedule", "sk_items", "sk_workspace", "tile_origin"]


PERSIST = True  # grid <= one block per SM, each walking its work items (A/B: -DMMQ_WG_PERSIST=0)
STREAM_K = True  # the last 1-2 waves' tiles split by k-stages (A/B: -DMMQ_WG_SK=0)
_GEOMETRY_ONLY = ("-DMMQ_WG_PERSIST", "-DMMQ_WG_SK")  # A/B options the launcher reads, not nvcc
_OPTS = ("-arch=sm_90a",)  # last -arch wins in nvcc: wgmma needs the sm_90a target


def build_define(build_opts: tuple, name: str, default: int) -> int:
    """The value a kernel build gives the macro `name` (-DNAME=N among build_opts), else
    `default` (the launchers size shared memory by their kernels' ring depths this way)."""
    for o in build_opts:
        if o.startswith(f"-D{name}="):
            return int(o.split("=", 1)[1])
    return default


def _geometry(build_opts: tuple) -> tuple[bool, bool]:
    """(persistent, stream-K) of a kernel build: the defaults, or -D overrides (kernel A/B
    builds; they only steer the launch geometry)."""
    persist, sk = PERSIST, STREAM_K
    for o in build_opts:
        key, _, val = o.partition("=")
        if key == "-DMMQ_WG_PERSIST":
            persist = bool(int(val))
        elif key == "-DMMQ_WG_SK":
            sk = bool(int(val))
    return persist, sk


def launch_persistent(
    rt,
    entry: str,
    name: str,
    smem: int,
    tiles: int,
    KT: int,
    args,
    build_opts: tuple,
    stream_k: bool,
    sms: int | None,
    block: int = 256,
) -> None:
    """One launch of the persistent kernel kernels/<name>.cu's `entry` with `block` threads:
    the grid and the stream-K split of `tiles` tiles of KT k-units (`schedule`), the smem cap,
    the workspace; args end before (dp, ws, flags)."""
    persist, sk = _geometry(build_opts)
    if smem > rt.smem_optin:
        raise GPUError(
            f"{entry}: {smem} B of shared memory needed, over this GPU's opt-in cap "
            f"of {rt.smem_optin} B"
        )
    nvcc = tuple(o for o in build_opts if o.partition("=")[0] not in _GEOMETRY_ONLY)
    fn = rt.function(name, entry, (*_OPTS, *nvcc), dyn_smem=smem)
    sms = rt.sm_count if sms is None else min(int(sms), rt.sm_count)
    grid, dp = schedule(tiles, sms, persist, stream_k and sk)
    if (tiles - dp) * KT >= 2**31:
        raise GPUError(f"{entry}: too many stream-K units ({tiles - dp} tiles x {KT} stages)")
    ws, flags = sk_workspace(rt)
    rt.launch(fn, (grid,), (block,), (*args, np.int32(dp), ws, flags), smem)
