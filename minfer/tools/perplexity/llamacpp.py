"""llama.cpp's `--kl-divergence-base` file, read and written, so minfer and llama-perplexity
compare against each other's base runs (tools/perplexity/perplexity.cpp):

    "_logits_"                      8 bytes, the magic
    n_ctx, n_vocab, n_chunk         int32 each (little-endian)
    tokens                          int32 [n_chunk * n_ctx]: the text's ids (BOS first when the
                                    model adds BOS), before each window's first id becomes BOS
    per chunk, per scored row       uint16 [nv], nv = 2 * ((n_vocab + 1) // 2) + 4:
                                    float32 scale, float32 min_log_prob (the first 4 uint16),
                                    then n_vocab quantized log-probs and a pad to even

Rows are positions n_ctx/2 .. n_ctx-2 of each window, as minfer scores them. A row holds the
log-softmax of the logits, clamped 16 below the top logit: log p_i = scale * q_i +
min_log_prob, q_i = round((logit_i - lo) / scale), lo = max(min logit, max logit - 16),
scale = (max - lo) / 65535, q = 0 at or below lo. llama.cpp's KL divergence sums only the
base's entries above log p = -16 and takes the base's nll from the quantized row as it stands;
minfer.tools.perplexity.compare_logprobs does the same, so a minfer run against a llama.cpp base reads as llama-perplexity
--kl-divergence would print it (to the float rounding of its own sums).
"""

from __future__ import annotations

import contextlib
import struct

import numpy as np

from minfer.errors import BadInput

MAGIC = b"_logits_"
HEAD = len(MAGIC) + 12
CLAMP = 16.0  # llama.cpp: logits more than 16 below the top are not stored


def row_width(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


def is_llamacpp(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class Base:
    """A read llama.cpp base: ctx, vocab, chunks, tokens int32 [chunks * ctx], and
    `logprobs(chunk)`: float32 [rows, vocab] log-probs of that chunk's scored rows."""

    def __init__(self, path: str):
        from minfer.host.fileio import check_input_file, read_error

        st = check_input_file(path, "logits")
        self.path = path
        try:
            with open(path, "rb") as f:
                head = f.read(HEAD)
            if len(head) < HEAD or head[: len(MAGIC)] != MAGIC:
                raise self._bad("no llama.cpp header")
            self.ctx, self.vocab, self.chunks = struct.unpack("<3i", head[len(MAGIC) :])
            for name, v, low in (
                ("n_ctx", self.ctx, 4),
                ("n_vocab", self.vocab, 2),
                ("n_chunk", self.chunks, 1),
            ):
                if v < low:
                    raise self._bad(f"header field {name} is {v}, expected >= {low}")
            self.rows = self.ctx - 1 - self.ctx // 2
            nv = row_width(self.vocab)
            start = HEAD + 4 * self.ctx * self.chunks
            want = start + 2 * nv * self.rows * self.chunks
            if st.st_size != want:
                raise self._bad(
                    f"{st.st_size:,} bytes where its header makes {want:,} "
                    "(truncated: an interrupted llama-perplexity run?)"
                )
            self.tokens = np.memmap(path, "<i4", "r", offset=HEAD, shape=(self.chunks * self.ctx,))
            self._q = np.memmap(path, "<u2", "r", offset=start, shape=(self.chunks * self.rows, nv))
        except OSError as e:
            raise read_error(e, path, "read logits file") from None

    def _bad(self, why: str) -> BadInput:
        return BadInput(f"{self.path}: not a readable llama.cpp --kl-divergence-base file ({why})")

    def logprobs(self, chunk: int) -> np.ndarray:
        q = np.asarray(self._q[chunk * self.rows : (chunk + 1) * self.rows])
        d = np.ascontiguousarray(q[:, :4]).view("<f4")  # [rows, 2]: scale, min_log_prob
        from minfer.tools.perplexity.windows import check_finite

        check_finite(self.path, d, chunk)  # a NaN scale makes every log-prob of its row NaN
        return (d[:, :1] * q[:, 4 : 4 + self.vocab].astype(np.float32) + d[:, 1:2]).astype(
            np.float32
        )

    def check(self, model_vocab: int, model_ctx: int, ids_cap: int) -> None:
        if self.vocab != model_vocab:
            raise BadInput(
                f"{self.path}: base log-probs over a vocabulary of {self.vocab:,}, "
                f"the model's is {model_vocab:,}"
            )
        if self.ctx > model_ctx:
            raise BadInput(
                f"{self.path}: base made with -c {self.ctx}, more than the model's "
                f"context of {model_ctx}"
            )
        bad = (self.tokens < 0) | (self.tokens >= ids_cap)
        if bad.any():
            raise self._bad(f"token id {int(self.tokens[bad][0])} out of the vocabulary")


def quantize_rows(logits: np.ndarray) -> np.ndarray:
    """uint16 [rows, nv] of logits [rows, vocab], as llama.cpp's log_softmax writes them."""
    x = np.asarray(logits, np.float32)
    n, vocab = x.shape
    mx = x.max(axis=1, keepdims=True)
    lo = np.maximum(x.min(axis=1, keepdims=True), mx - np.float32(CLAMP))
    lse = np.log(np.exp((x - mx).astype(np.float64)).sum(axis=1, keepdims=True)).astype(np.float32)
    min_lp = (lo - mx - lse).astype(np.float32)
    scale = ((mx - lo) / np.float32(65535)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.where(x > lo, np.rint(inv * (x - lo)), 0).astype(np.uint16)
    out = np.zeros((n, row_width(vocab)), np.uint16)
    out[:, :4] = np.concatenate([scale, min_lp], axis=1).astype("<f4").view("<u2")
    out[:, 4 : 4 + vocab] = q
    return out


@contextlib.contextmanager
def write(path: str, ctx: int, vocab: int, tokens: np.ndarray):
    """`with write(path, ctx, vocab, tokens) as append: append(logits)` per window (tokens:
    int32 [chunks * ctx], the ids before BOS replacement); the file appears (renamed from a
    temporary) only when every chunk was appended."""
    from minfer.host.fileio import open_output

    chunks = len(tokens) // ctx
    with open_output(path, "wb") as f:
        f.write(MAGIC + struct.pack("<3i", ctx, vocab, chunks))
        f.write(np.ascontiguousarray(tokens, "<i4").tobytes())
        n = [0]

        def append(logits: np.ndarray) -> None:
            f.write(quantize_rows(logits).tobytes())
            n[0] += 1

        yield append
        if n[0] != chunks:
            raise BadInput(f"{path}: {n[0]} of {chunks} chunks written")
