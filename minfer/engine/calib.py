"""Per-channel statistics over a calibration text: the pieces the CPU calibration
(minfer.tools.perplexity.calibrate, `--emulate blk-int8down`) and the GPU one here share (the
text, its windows, the cache), and the GPU calibration of a path that keeps calibrated input
channels (GemmPath.calibrated_kinds: blk-split's ffn_down) runs in minfer.engine.backends
(`cuda_channel_stats`, `bind_channels`: where a CUDA backend is built).

The text is minfer/data/calib.txt (the Apache and Mozilla licenses), never the evaluation's
(gnu-gpl.txt); WINDOWS windows of CTX tokens from its start, each a fresh sequence as
perplexity's (BOS first where the model adds it), every position run through every layer.
Results are cached in $MINFER_CACHE/calib/, keyed by the model file (path, size, mtime), the
weights, the windows, the text and the backend ("cuda": its f16 activations are not the CPU
reference's f32 ones rounded, so the two never share an entry).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

CALIB_TEXT = Path(__file__).resolve().parents[1] / "data" / "calib.txt"
WINDOWS, CTX = 2, 512  # 1,024 tokens: the mean square's top 64 are 52 of 5,632 tokens' (SmolLM2)


def window(ids: np.ndarray, i: int, ctx: int, bos: int | None) -> np.ndarray:
    """int32 [ctx]: window i of ids, its first id replaced by `bos` (None: kept)."""
    w = np.array(ids[i * ctx : (i + 1) * ctx], dtype=np.int32)
    if bos is not None:
        w[0] = bos
    return w


def calib_windows(model, text: str, windows: int = WINDOWS, ctx: int = CTX) -> list[np.ndarray]:
    """The calibration windows of `text` for `model` (ctx capped at its context)."""
    from minfer.errors import BadInput
    from minfer.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(model.metadata)
    ids = np.asarray(tok.encode(text), np.int32)
    ctx = min(ctx, model.config.n_ctx)
    n = min(windows, len(ids) // ctx)
    if n < 1:
        raise BadInput(f"calibration text: {len(ids)} tokens, fewer than one window of {ctx}")
    bos = tok.bos_id if tok.add_bos else None
    return [window(ids, i, ctx, bos) for i in range(n)]


def cache_key(model, names, windows: int, ctx: int, text: bytes, backend: str = "") -> str:
    """The cache entry's name; backend: "" the CPU reference's (its keys as before), "cuda"."""
    h = hashlib.sha256(b"minfer-calib-1\0")
    p = Path(model.path).resolve()
    st = p.stat()
    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{windows}\0{ctx}\0".encode())
    h.update("\0".join(names).encode())
    h.update(hashlib.sha256(text).digest())
    if backend:
        h.update(f"\0backend={backend}".encode())
    return h.hexdigest()[:32]


def cache_path(key: str) -> Path:
    from minfer.host.fileio import cache_root

    return cache_root("calib") / f"{key}.npz"


def load_cached(path: Path, names) -> dict | None:
    """name -> array from a cache file holding exactly `names`, else None (unreadable: None)."""
    if not path.is_file():
        return None
    try:
        z = np.load(path)
        if set(z.files) == set(names):
            return {n: z[n] for n in names}
    except (OSError, ValueError):
        pass  # an unreadable cache file: computed again
    return None


def store(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)


def announce(names, wins: list, path: Path, where: str) -> None:
    """One note before a calibration runs (it is not instant: a forward over the windows), naming
    what it measures and where the result is kept, so the next run's silence is explained."""
    from minfer.host.log import log

    n = len(wins[0]) if wins else 0
    log.info(
        f"calibrating {len(names)} weights' input channels on {where}: {len(wins)} windows of "
        f"{n} tokens of {CALIB_TEXT.name} (once; cached in {path.parent})"
    )


def cached_stats(
    model,
    names,
    measure,
    where: str,
    backend: str = "",
    windows: int = WINDOWS,
    ctx: int = CTX,
    text_path=None,
    cache: bool = True,
) -> dict[str, np.ndarray]:
    """name -> f64 [K]: the cache's entry for (model, names, windows, text, backend), else
    measure(names, wins) over the calibration windows (announced as run on `where`), stored."""
    names = sorted(set(names))
    raw = Path(text_path or CALIB_TEXT).read_bytes()
    path = cache_path(cache_key(model, names, windows, ctx, raw, backend))
    got = load_cached(path, names) if cache else None
    if got is not None:
        return got
    wins = calib_windows(model, raw.decode("utf-8"), windows, ctx)
    announce(names, wins, path, where)
    out = measure(names, wins)
    if cache:
        store(path, out)
    return out


__all__ = [
    "CALIB_TEXT",
    "CTX",
    "WINDOWS",
    "announce",
    "cache_key",
    "cache_path",
    "cached_stats",
    "calib_windows",
    "load_cached",
    "store",
    "window",
]
