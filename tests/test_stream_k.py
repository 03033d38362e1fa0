"""CPU: the persistent kernels' stream-K schedule (minfer.cuda.paths.blk.stream_k) and its work-item
twin."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.blk.stream_k import schedule, sk_items, tile_origin


@pytest.mark.parametrize(
    "tiles,sms,want",
    [
        (100, 132, (100, 100)),
        (264, 132, (264 // 2, 264)),
        (160, 132, (132, 0)),
        (896, 132, (132, 660)),
        (256, 132, (132, 0)),
        (7, 3, (3, 3)),
    ],
)
def test_schedule(tiles, sms, want):
    """One wave or whole waves: all round-robin; a ragged last wave: the last 1-2 waves' tiles
    (between grid and 2 * grid) go stream-K. Off, or not persistent: whole tiles."""
    assert schedule(tiles, sms) == want
    assert schedule(tiles, sms, stream_k=False) == (min(tiles, sms), tiles)
    assert schedule(tiles, sms, persist=False) == (tiles, tiles)


@pytest.mark.parametrize(
    "tiles,KT,sms",
    [
        (160, 32, 132),
        (192, 32, 132),
        (896, 32, 132),
        (7, 2, 3),
        (6, 5, 4),
        (9, 1, 4),
        (24, 4, 5),
        (401, 112, 132),
        (133, 3, 132),
    ],
)
def test_sk_items_cover_every_stage_once(tiles, KT, sms):
    """The twin of the kernels' TileSched under `schedule`: every (tile, stage) exactly once;
    a split tile has two parts, its tail (k0 > 0) the first stream-K item of block b+1 and its
    head (k0 == 0, k1 < KT) the last item of block b, the pairing sk_put / sk_add rely on."""
    grid, dp = schedule(tiles, sms)
    items = sk_items(tiles, KT, grid, dp)
    cover = np.zeros((tiles, KT), np.int32)
    parts: dict[int, list] = {}
    for b, its in enumerate(items):
        for i, (t, k0, k1) in enumerate(its):
            assert 0 <= k0 < k1 <= KT
            cover[t, k0:k1] += 1
            parts.setdefault(t, []).append((b, i, k0, k1))
    assert (cover == 1).all()
    for ps in parts.values():
        assert len(ps) <= 2
        if len(ps) == 2:
            (bh, ih, h0, h1), (bt, it, t0, t1) = sorted(ps, key=lambda p: p[2])
            assert h0 == 0 and h1 == t0 and t1 == KT and bt == bh + 1
            assert ih == len(items[bh]) - 1  # the head: block b's last item
            assert it == sum(1 for x in items[bt] if x[0] < dp)  # the tail: b+1's first SK item
    loads = [sum(k1 - k0 for _, k0, k1 in its) for its in items]
    assert max(loads) - min(loads) <= KT + 1  # stream-K evens the work out to a tile


@pytest.mark.parametrize(
    "M,N,group",
    [
        (16384, 28672, 8),
        (1300, 384, 8),
        (2048, 4096, 16),
        (77, 333, 8),
        (1300, 384, 3),
        (128 * 17 + 1, 130, 4),
    ],
)
def test_tile_origin_is_a_grouped_bijection(M, N, group):
    """The grouped tile order (the twin of gemm_f16::tile_origin, which mmq_blk and the f16
    GEMM share) visits every tile once, a group of `group` M-tiles (the last one ragged) at a
    time, M fastest within it; so any `group * npn` consecutive tiles touch <= `group` M-tiles."""
    npm, npn = -(-M // 128), -(-N // 128)
    got = [tile_origin(p, M, N, group_m=group) for p in range(npm * npn)]
    assert sorted(got) == [(m * 128, n * 128) for m in range(npm) for n in range(npn)]
    for p0 in range(0, npm * npn, group * npn):
        span = got[p0 : p0 + group * npn]
        assert len({m for m, _ in span}) <= group and len({n for _, n in span}) == npn
    if npm > 1:  # M fastest: the first two tiles share their N-tile
        assert got[0][1] == got[1][1] and got[0][0] != got[1][0]
