"""The mean square of each input channel of chosen linear weights, over a calibration text on the
exact CPU forward: what a grid that keeps a weight's busiest input channels exact needs
(minfer/cuda/paths/blk/outliers.py, `minfer perplexity --emulate blk-int8down`).

The text is minfer/data/calib.txt (the Apache and Mozilla licenses), never the evaluation's
(gnu-gpl.txt); WINDOWS windows of CTX tokens from its start, each a fresh sequence as
perplexity's (BOS first where the model adds it), every position run through every layer (the
forward would cut the last layer to the rows whose logits are asked for).
Results are cached in $MINFER_CACHE/calib/, keyed by the model file (path, size, mtime), the
weights, the windows and the text.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

CALIB_TEXT = Path(__file__).resolve().parents[2] / "data" / "calib.txt"
WINDOWS, CTX = 2, 512  # 1,024 tokens: the mean square's top 64 are 52 of 5,632 tokens' (SmolLM2)


class _Recorder:
    """A pass-through 'grid': the sum of squares of each input channel (its f16 values, as the
    kernels read them) and the row count of every weight it is put on."""

    name = "calibrate"

    def __init__(self):
        self.sq: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return w

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        x2 = np.asarray(x, np.float16).astype(np.float64).reshape(-1, x.shape[-1])
        s = (x2 * x2).sum(axis=0)
        self.sq[name] = self.sq[name] + s if name in self.sq else s
        self.rows[name] = self.rows.get(name, 0) + x2.shape[0]
        return x


def _key(model, names: list[str], windows: int, ctx: int, text: bytes) -> str:
    h = hashlib.sha256(b"minfer-calib-1\0")
    p = Path(model.path).resolve()
    st = p.stat()
    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{windows}\0{ctx}\0".encode())
    h.update("\0".join(names).encode())
    h.update(hashlib.sha256(text).digest())
    return h.hexdigest()[:32]


def _windows(model, text: str, windows: int, ctx: int) -> list[np.ndarray]:
    from minfer.errors import BadInput
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.perplexity.windows import window

    tok = Tokenizer.from_metadata(model.metadata)
    ids = np.asarray(tok.encode(text), np.int32)
    ctx = min(ctx, model.config.n_ctx)
    n = min(windows, len(ids) // ctx)
    if n < 1:
        raise BadInput(f"calibration text: {len(ids)} tokens, fewer than one window of {ctx}")
    bos = tok.bos_id if tok.add_bos else None
    return [window(ids, i, ctx, bos) for i in range(n)]


def channel_stats(
    model, names, windows: int = WINDOWS, ctx: int = CTX, text_path=None, cache: bool = True
) -> dict[str, np.ndarray]:
    """name -> f64 [K]: the mean of X_j^2 over the calibration windows' rows, X the input of
    linear weight `name` in the exact float32 CPU forward (every name a linear weight of
    `model`, a loaded GGUF)."""
    from minfer.host.fileio import cache_root
    from minfer.reference.forward import ReferenceBackend

    names = sorted(set(names))
    raw = Path(text_path or CALIB_TEXT).read_bytes()
    path = cache_root("calib") / f"{_key(model, names, windows, ctx, raw)}.npz"
    if cache and path.is_file():
        try:
            z = np.load(path)
            if set(z.files) == set(names):
                return {n: z[n] for n in names}
        except (OSError, ValueError):
            pass  # an unreadable cache file: computed again
    rec = _Recorder()
    wins = _windows(model, raw.decode("utf-8"), windows, ctx)
    be = ReferenceBackend(
        model, np.float32, max_tokens=len(wins[0]), grids=dict.fromkeys(names, rec)
    )
    for w in wins:
        be.window_logits(w, 0)
    missing = [n for n in names if n not in rec.sq]
    if missing:
        raise KeyError(f"calibration: no input recorded for {', '.join(missing[:3])}")
    out = {n: rec.sq[n] / rec.rows[n] for n in names}
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **out)
        os.replace(tmp, path)
    return out
