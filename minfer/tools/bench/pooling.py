"""The pooled jobs' device figures (issue 52), one process, one loaded model:

embed:  N prompts of L random ids (bench --batch's, seed 0) through Engine.embed (pooled
        jobs: the last row's hidden state, no LM head) against the batch prefill of the same
        prompts (Engine.run, n_predict 0: what `bench --batch N --tokens L` times), each
        after an untimed run over the first 512 prompts (kernels, CUDA graphs), interleaved
        `repeats` times; tok/s and the ratio.
rerank: one query of Q random ids before D documents of L' ids (1 x D prompts of Q + L'
        tokens) as pooled jobs with the query's prefix shared (the prefix cache: computed
        once, copied) against each document computing its own prefix; documents/s.

  python3 -m minfer.tools.bench.pooling -m MODEL [--batch 4096 --tokens 256]
                                        [--docs 1000 --doc-tokens 200 --query-tokens 64]
                                        [--no-overlap]

--no-overlap: the pooled jobs' scheduler waits for each forward before the next is launched
(the A/B of its overlap, minfer/batch/scheduler.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def run(
    model_path: str,
    n: int,
    length: int,
    docs: int,
    doc_len: int,
    q_len: int,
    repeats: int,
    backend: str | None,
    echo=print,
    overlap: bool = True,
) -> dict:
    from minfer.batch.jobs import run_pooled
    from minfer.engine.api import Engine
    from minfer.gguf.loader import load_model
    from minfer.tools.bench.batch import batch_prompts

    model = load_model(model_path)
    eng = Engine(model, backend)
    prompts = batch_prompts(model, n, length)
    lengths = [len(p) for p in prompts]
    warm = prompts[:512]
    eng.run(enumerate(warm), [len(p) for p in warm], 0, lambda r: None)
    run_pooled(eng, warm, "last", keep=False, overlap=overlap)
    emb, pre = [], []
    for _ in range(repeats):
        pre.append(_timed(lambda: eng.run(enumerate(prompts), lengths, 0, lambda r: None)))
        emb.append(_timed(lambda: run_pooled(eng, prompts, "last", keep=False, overlap=overlap)))
    tok = sum(lengths)
    e, p = tok / statistics.median(emb), tok / statistics.median(pre)
    echo(
        f"{model.describe()}; backend {eng.backend.name}, KV {eng.kv_slots:,} slots; "
        f"overlap {'on' if overlap else 'off'}"
    )
    echo(
        f"embed   {n:,} x {length}: {e:,.0f} tok/s (median of {repeats}: "
        f"{', '.join(f'{tok / t:,.0f}' for t in emb)}); batch prefill of the same prompts "
        f"{p:,.0f} tok/s ({', '.join(f'{tok / t:,.0f}' for t in pre)}); {e / p:.3f}x"
    )
    out = {"embed_tok_s": e, "prefill_tok_s": p, "embed_ratio": e / p}
    if docs:
        rng = np.random.default_rng(1)
        V = model.config.vocab_size
        q = rng.integers(0, V, q_len, dtype=np.int32)
        rr = [np.concatenate([q, rng.integers(0, V, doc_len, dtype=np.int32)]) for _ in range(docs)]
        run_pooled(eng, rr[:64], "last", share=False, overlap=overlap)  # warm-up
        sh, al = [], []
        for _ in range(repeats):
            sh.append(_timed(lambda: run_pooled(eng, rr, "last", share=True, overlap=overlap)))
            al.append(_timed(lambda: run_pooled(eng, rr, "last", share=False, overlap=overlap)))
        s, a = docs / statistics.median(sh), docs / statistics.median(al)
        echo(
            f"rerank  1 query x {docs:,} documents of {doc_len} tokens after a {q_len}-token "
            f"query: {s:,.1f} documents/s with the query's prefix shared, {a:,.1f} "
            f"documents/s each computing its own ({s / a:.2f}x; tokens computed "
            f"{q_len + docs * doc_len:,} against {docs * (q_len + doc_len):,})"
        )
        out.update(rerank_docs_s=s, rerank_alone_docs_s=a)
    return out


def main(argv=None) -> int:
    from minfer.errors import MinferError

    ap = argparse.ArgumentParser(
        prog="python3 -m minfer.tools.bench.pooling", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--doc-tokens", type=int, default=200)
    ap.add_argument("--query-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--no-overlap", action="store_true")
    a = ap.parse_args(argv)
    if min(a.batch, a.tokens, a.doc_tokens, a.query_tokens, a.repeats) < 1 or a.docs < 0:
        print(
            "error: --batch, --tokens, --doc-tokens, --query-tokens, --repeats must be >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        run(
            a.model,
            a.batch,
            a.tokens,
            a.docs,
            a.doc_tokens,
            a.query_tokens,
            a.repeats,
            a.backend,
            overlap=not a.no_overlap,
        )
    except MinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
