"""Perplexity and KL divergence over a text, as llama.cpp's `llama-perplexity` computes them.

Windows: the text's ids (BOS first when the model adds BOS) are cut into non-overlapping
windows of `ctx` tokens; the first id of each window is replaced by BOS when the model adds BOS.
Each window runs as a fresh sequence; positions first = ctx // 2 .. ctx - 2 are scored, each
predicting the next id of the window: ctx - 1 - ctx // 2 rows per window (255 at ctx 512), as
llama.cpp's perplexity and --kl-divergence score them.

PPL = exp(mean nll) over every scored row of every window; its standard error by the delta
method, llama.cpp's `ppl * sqrt((mean(nll^2) - mean(nll)^2) / (n - 1))`.
KL divergence per row, KL(base || this) = sum_v p_base (log p_base - log p_this); reported as
llama.cpp's --kl-divergence does: mean (+/- sqrt(var / (n - 1))), 99th percentile (linear
interpolation), same-top-1 fraction (+/- sqrt(p (1 - p) / (n - 1))), plus max |dlogit| of the
raw logits and the mean log-prob difference of the correct token. All in float64 on the host.

Logits file (--save-logits / --kld-base): MAGIC, a little-endian u32 header length, a JSON
header (model file name and size, vocab, ctx, chunks, rows per chunk, sha256 of the window ids,
backend), zero padding to a multiple of 64 bytes, then float32 logits [chunks * rows, vocab],
row-major, the scored rows only. f32, not f16: f16 logits carry a rounding of ~1e-2 at logit
magnitudes of 10-20, which biases a mean KLD gated at 0.003; hence `minfer perplexity`'s modest
default of 4 chunks (192 MiB at vocab 49,152 and ctx 512; --chunks 0 takes the whole text). The
file is read through a memory map, one chunk at a time. llama.cpp's own base file (16-bit
log-probs) is minfer.tools.perplexity.llamacpp'; compare_logprobs sums its KLD as llama.cpp does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minfer.engine.calib import window  # noqa: F401  (perplexity's windows, the calibrations')
from minfer.errors import BadInput

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "data" / "gnu-gpl.txt"
TEXT_CAP = 16 << 20  # bytes of text read at most
MAGIC = b"MINFER-LOGITS-1\n"
ALIGN = 64
ROW_BLOCK = 32  # rows per float64 pass: [32, vocab] f64 arrays stay small


# -- windows -------------------------------------------------------------------------------------
def first_scored(ctx: int) -> int:
    return ctx // 2


def rows_per_window(ctx: int) -> int:
    """Scored rows of one window: positions ctx // 2 .. ctx - 2."""
    return ctx - 1 - first_scored(ctx)


def n_windows(n_tokens: int, ctx: int, chunks: int, name: str) -> int:
    """Windows the run takes: all the text holds (chunks 0) or at most `chunks`; BadInput when
    the text is shorter than one window."""
    if n_tokens < ctx:
        from minfer.host.words import plural

        raise BadInput(
            f"{name}: the text is {plural(n_tokens, 'token')}, fewer than one window "
            f"of --ctx {ctx}; give a longer text or a smaller --ctx"
        )
    avail = n_tokens // ctx
    return avail if chunks == 0 else min(chunks, avail)


def ids_hash(windows: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for w in windows:
        h.update(np.asarray(w, "<i4").tobytes())
    return h.hexdigest()


# -- statistics ----------------------------------------------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of logits [n, vocab]."""
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def target_logprobs(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """float64 [n]: log p(targets[i]) under row i of logits [n, vocab]."""
    out = np.empty(len(targets), np.float64)
    for s in range(0, len(targets), ROW_BLOCK):
        lp = log_softmax(logits[s : s + ROW_BLOCK])
        out[s : s + ROW_BLOCK] = lp[np.arange(lp.shape[0]), targets[s : s + ROW_BLOCK]]
    return out


def ppl_stats(nll: np.ndarray) -> tuple[float, float]:
    """(PPL, its standard error) of the per-token nll values, as llama.cpp."""
    nll = np.asarray(nll, np.float64)
    n = nll.size
    mean = float(nll.mean())
    ppl = float(np.exp(mean))
    var = float((nll * nll).mean() - mean * mean)
    err = ppl * float(np.sqrt(var / (n - 1))) if n > 1 and var > 0 else 0.0
    return ppl, err


def mean_err(x: np.ndarray) -> tuple[float, float]:
    """(mean, sqrt(var / (n - 1))) as llama.cpp's kld statistics."""
    x = np.asarray(x, np.float64)
    n = x.size
    m = float(x.mean())
    var = float((x * x).mean() - m * m)
    return m, (float(np.sqrt(var / (n - 1))) if n > 1 and var > 0 else 0.0)


def compare_rows(base: np.ndarray, this: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(KL(base || this) [n], same argmax [n] bool, max |this - base|) of logits [n, vocab]."""
    n = base.shape[0]
    kld = np.empty(n, np.float64)
    same = np.empty(n, bool)
    dmax = 0.0
    for s in range(0, n, ROW_BLOCK):
        b = np.asarray(base[s : s + ROW_BLOCK], np.float64)
        t = np.asarray(this[s : s + ROW_BLOCK], np.float64)
        lp, lq = log_softmax(b), log_softmax(t)
        kld[s : s + ROW_BLOCK] = (np.exp(lp) * (lp - lq)).sum(axis=-1)
        same[s : s + ROW_BLOCK] = b.argmax(axis=-1) == t.argmax(axis=-1)
        dmax = max(dmax, float(np.abs(t - b).max()))
    return np.maximum(kld, 0.0), same, dmax  # (rounding can leave -1e-17 for equal rows)


def compare_logprobs(base_lp: np.ndarray, this: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(KL(base || this) [n], same argmax [n] bool) of a llama.cpp base's log-probs [n, vocab]
    (minfer.tools.perplexity.llamacpp) and this run's logits, summed as llama.cpp's
    --kl-divergence sums them: over the base's entries above -16 only (the rest are its
    clamp), not renormalized."""
    n = base_lp.shape[0]
    kld = np.empty(n, np.float64)
    same = np.empty(n, bool)
    for s in range(0, n, ROW_BLOCK):
        lp = np.asarray(base_lp[s : s + ROW_BLOCK], np.float64)
        lq = log_softmax(this[s : s + ROW_BLOCK])
        kld[s : s + ROW_BLOCK] = np.where(lp > -16.0, np.exp(lp) * (lp - lq), 0.0).sum(axis=-1)
        same[s : s + ROW_BLOCK] = lp.argmax(axis=-1) == lq.argmax(axis=-1)
    return kld, same


@dataclass
class Tally:
    """Per-row results accumulated over the windows."""

    nll: list[np.ndarray] = field(default_factory=list)
    running: list[float] = field(default_factory=list)  # PPL after each window
    base_nll: list[np.ndarray] = field(default_factory=list)
    kld: list[np.ndarray] = field(default_factory=list)
    same: list[np.ndarray] = field(default_factory=list)
    dmax: float | None = 0.0  # None against a llama.cpp base (log-probs, not logits)

    def add(
        self,
        logits: np.ndarray,
        targets: np.ndarray,
        base: np.ndarray | None = None,
        base_lp: np.ndarray | None = None,
    ):
        """logits (and the base's) [rows, vocab] of one window, targets int [rows]; base_lp
        instead of base: a llama.cpp base's log-probs (no logits there: max |dlogit| None)."""
        self.nll.append(-target_logprobs(logits, targets))
        self.running.append(ppl_stats(np.concatenate(self.nll))[0])
        if base_lp is not None:
            lp = np.asarray(base_lp, np.float64)
            self.base_nll.append(-lp[np.arange(len(targets)), targets])
            kld, same = compare_logprobs(lp, logits)
            self.kld.append(kld)
            self.same.append(same)
            self.dmax = None
        elif base is not None:
            self.base_nll.append(-target_logprobs(base, targets))
            kld, same, dmax = compare_rows(base, logits)
            self.kld.append(kld)
            self.same.append(same)
            self.dmax = None if self.dmax is None else max(self.dmax, dmax)

    def summary(self) -> dict:
        nll = np.concatenate(self.nll)
        ppl, err = ppl_stats(nll)
        out = {
            "n_scored": int(nll.size),
            "ppl": ppl,
            "ppl_err": err,
            "running_ppl": self.running,
            "kld": None,
        }
        if self.kld:
            kld, same = np.concatenate(self.kld), np.concatenate(self.same)
            base_nll = np.concatenate(self.base_nll)
            bppl, berr = ppl_stats(base_nll)
            k, kerr = mean_err(kld)
            dlp, dlp_err = mean_err(base_nll - nll)  # log p_this - log p_base of the target
            p = float(same.mean())
            perr = float(np.sqrt(p * (1 - p) / (same.size - 1))) if same.size > 1 else 0.0
            out["kld"] = {
                "base_ppl": bppl,
                "base_ppl_err": berr,
                "mean": k,
                "mean_err": kerr,
                "p99": float(np.percentile(kld, 99.0)),
                "median": float(np.median(kld)),
                "max": float(kld.max()),
                "same_top1": p,
                "same_top1_err": perr,
                "max_abs_dlogit": self.dmax,
                "mean_dlogprob": dlp,
                "mean_dlogprob_err": dlp_err,
            }
        return out


# -- logits file ---------------------------------------------------------------------------------
def header(model, ctx: int, chunks: int, windows: list[np.ndarray], backend: str) -> dict:
    return {
        "model": model.path.name,
        "model_bytes": model.path.stat().st_size,
        "vocab": int(model.config.vocab_size),
        "ctx": int(ctx),
        "chunks": int(chunks),
        "rows_per_chunk": rows_per_window(ctx),
        "ids_sha256": ids_hash(windows),
        "backend": backend,
        "dtype": "float32",
    }


@contextlib.contextmanager
def write_logits(path: str, hdr: dict):
    """`with write_logits(path, hdr) as append: append(rows)` for each window's scored logits
    [rows, vocab]: the file appears (renamed from a temporary, minfer.host.fileio) only when the
    block ends normally with every row of the header written."""
    from minfer.host.fileio import open_output

    with open_output(path, "wb") as f:
        head = json.dumps(hdr).encode()
        pre = len(MAGIC) + 4 + len(head)
        f.write(MAGIC + struct.pack("<I", len(head)) + head + b"\0" * (-pre % ALIGN))
        n = [0]

        def append(rows: np.ndarray) -> None:
            f.write(np.ascontiguousarray(rows, "<f4").tobytes())
            n[0] += rows.shape[0]

        yield append
        want = hdr["chunks"] * hdr["rows_per_chunk"]
        if n[0] != want:
            raise BadInput(f"{path}: {n[0]} logit rows written, the header says {want}")


def _int_field(path: str, hdr: dict, key: str, low: int) -> int:
    """hdr[key] as an int >= low; BadInput naming the field otherwise (a float, a bool, a
    string or a missing key would fail later as a TypeError or KeyError)."""
    if key not in hdr:
        raise BadInput(
            f"{path}: logits header has no {key!r} field (not a file of `minfer "
            "perplexity --save-logits`?)"
        )
    v = hdr[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise BadInput(
            f"{path}: logits header field {key!r} is {v!r:.40}, expected an integer >= {low}"
        )
    return v


def check_header(path: str, hdr, size: int, start: int) -> tuple[int, int]:
    """(rows, vocab) of a logits file's header, each field checked (type, range) and the
    file's size against them before anything is mapped or allocated; BadInput naming the
    field (exit 2) otherwise."""
    if not isinstance(hdr, dict):
        raise BadInput(f"{path}: logits header is {type(hdr).__name__}, not a JSON object")
    ctx = _int_field(path, hdr, "ctx", 4)
    chunks = _int_field(path, hdr, "chunks", 1)
    vocab = _int_field(path, hdr, "vocab", 2)
    rows = _int_field(path, hdr, "rows_per_chunk", 1)
    if rows != rows_per_window(ctx):
        raise BadInput(
            f"{path}: logits header field 'rows_per_chunk' is {rows}, a window of "
            f"ctx {ctx} scores {rows_per_window(ctx)}"
        )
    if not isinstance(hdr.get("ids_sha256"), str):
        raise BadInput(
            f"{path}: logits header field 'ids_sha256' is "
            f"{hdr.get('ids_sha256')!r:.40}, expected a hex string"
        )
    want = start + 4 * chunks * rows * vocab  # Python ints: no overflow at vocab 10**12
    if size != want:
        raise BadInput(
            f"{path}: {size:,} bytes, where the header's chunks {chunks} x "
            f"rows_per_chunk {rows} x vocab {vocab:,} f32 logits make {want:,} "
            "(truncated, or a header that does not match the data)"
        )
    return chunks * rows, vocab


def read_logits(path: str) -> tuple[dict, np.ndarray]:
    """(header, float32 memmap [chunks * rows, vocab]) of a --save-logits file; BadInput (one
    line, naming the field of a bad header) for anything else."""
    from minfer.host.fileio import check_input_file

    st = check_input_file(path, "logits")
    bad = BadInput(
        f"{path}: not a minfer logits file (made by `minfer perplexity "
        "--save-logits`), or truncated"
    )
    try:
        with open(path, "rb") as f:
            pre = f.read(len(MAGIC) + 4)
            if len(pre) < len(MAGIC) + 4 or pre[: len(MAGIC)] != MAGIC:
                raise bad
            (n,) = struct.unpack("<I", pre[len(MAGIC) :])
            if n > 1 << 20:
                raise bad
            head = f.read(n)
        try:
            hdr = json.loads(head.decode())
        except (ValueError, UnicodeDecodeError):
            raise bad from None
        start = len(MAGIC) + 4 + n
        start += -start % ALIGN
        rows, vocab = check_header(path, hdr, st.st_size, start)
        return hdr, np.memmap(path, "<f4", "r", offset=start, shape=(rows, vocab))
    except OSError as e:
        from minfer.host.fileio import read_error

        raise read_error(e, path, "read logits file") from None


def check_finite(path: str, rows: np.ndarray, chunk: int) -> None:
    """NumericError (exit 3) naming the first row of a base chunk [rows, vocab] that holds
    NaN or inf: a KLD over it would be NaN, printed as a result."""
    ok = np.isfinite(rows).all(axis=-1)
    if not ok.all():
        from minfer.errors import NumericError

        r = int(np.argmin(ok))
        bad = rows[r][~np.isfinite(rows[r])]
        what = "NaN" if np.isnan(bad).any() else "inf"
        raise NumericError(
            f"{path}: the base's chunk {chunk + 1}, row {r + 1} holds {what} "
            f"({bad.size} non-finite values); no KL divergence can be taken "
            "against it"
        )


def nonfinite(out: dict, prefix: str = "") -> list[str]:
    """The keys (dotted) of float values in `out` (nested dicts, lists) that are NaN or inf."""
    bad = []
    for k, v in out.items():
        if isinstance(v, dict):
            bad += nonfinite(v, f"{prefix}{k}.")
        elif isinstance(v, float) and not np.isfinite(v):
            bad.append(prefix + k)
        elif isinstance(v, list) and any(isinstance(x, float) and not np.isfinite(x) for x in v):
            bad.append(prefix + k)
    return bad


def json_safe(x):
    """`x` with every NaN / inf float as None (JSON has no NaN: json.dumps would print a bare
    NaN no parser takes)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def check_base(path: str, base: dict, this: dict) -> None:
    """BadInput (one line) when the base logits were not made from this run's windows."""
    for key, what in (
        ("vocab", "vocabulary size"),
        ("ctx", "--ctx"),
        ("chunks", "--chunks"),
        ("ids_sha256", "text (token ids)"),
    ):
        if base.get(key) != this[key]:
            got = "differ" if key == "ids_sha256" else f"{base.get(key)} there, {this[key]} here"
            raise BadInput(
                f"{path}: base logits made with another {what} ({got}; base model "
                f"{base.get('model')}); rerun --save-logits with this text and "
                "--ctx / --chunks"
            )
