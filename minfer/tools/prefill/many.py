"""`minfer prefill --prompts FILE`: every prompt of a file through one loaded model, packed.

Pass 1 reads, validates and tokenizes every line before any GPU work (minfer.batch.prompts);
then minfer.engine.api.Engine runs them (packed prefill chunks, batched greedy decode, shared
prefixes once, waves as the KV memory allows) and each result is one JSONL record, in input
order, on stdout or in -o FILE (written atomically). A summary goes to stderr.
"""

from __future__ import annotations

import sys
import time

from minfer.batch.output import record
from minfer.batch.run import GROUP
from minfer.errors import BadInput
from minfer.host.log import log
from minfer.host.words import plural


def run_prompts(
    *,
    path: str,
    fmt: str,
    out: str | None,
    model,
    kind: str,
    why: str,
    choice,
    chat,
    system,
    special: bool,
    n_predict: int,
    stop_at_eos,
    n_ctx: int,
    ubatch: int | None,
    logprobs: bool,
    share: bool,
    dtype: str | None = None,
    top: int = 0,
    prompt_ids: bool = False,
    group: int = GROUP,
    ray: dict | None = None,
) -> None:
    """group: waves cut at every `group` prompts (`--group`); ray: {"address", "actors",
    "model_path"} (`--ray`): the groups through Ray actors, a group a batch
    (minfer.engine.ray.job), the same records in the same order."""
    from minfer.batch.output import ResultWriter
    from minfer.batch.prompts import make_encoder, open_prompts
    from minfer.engine.api import Engine
    from minfer.text.tokenizer import Tokenizer

    if n_predict < 0:
        raise BadInput(
            "-n -1 (until the end of generation) runs one prompt; with --prompts "
            "give a number of tokens (0: log-probs only)"
        )
    tok = Tokenizer.from_metadata(model.metadata)
    encode = make_encoder(model.metadata, tok, chat, system, special)
    use_chat = chat is True or (chat is None and system is not None)
    stop_ids = tok.eog_ids if (use_chat if stop_at_eos is None else stop_at_eos) else ()
    with (
        open_prompts(path, fmt, encode, model.config.vocab_size) as src,
        ResultWriter(out) as writer,
    ):
        t0 = time.perf_counter()
        lengths = src.scan(n_ctx, n_predict)  # every line checked before any GPU work
        scan_s = time.perf_counter() - t0
        if ray is not None:
            return _run_ray(
                src,
                lengths,
                writer,
                ray,
                group,
                out=out,
                kind=kind,
                choice=choice,
                ubatch=ubatch,
                dtype=dtype,
                n_ctx=n_ctx,
                n_predict=n_predict,
                logprobs=logprobs,
                share=share,
                stop_ids=stop_ids,
                top=top,
                prompt_ids=prompt_ids,
                scan_s=scan_s,
            )
        engine = Engine(model, kind, choice, ubatch, progress=True, dtype=dtype)
        pids: dict[int, tuple[object, int]] = {}  # key -> (id, line): the prompts in flight

        def keyed():
            for p in src:
                pids[p.index] = (p.id, p.line)
                yield p.index, p.ids, p.n_context

        def emit(r) -> None:
            writer.write(record(pids.pop(r.key)[0], r, tok, logprobs, top, prompt_ids))

        def describe(key: int) -> str:
            pid, line = pids.get(key, (key, None))
            return f"{path} line {line} (id {pid!r})" if line else f"prompt {key}"

        t1 = time.perf_counter()
        tot = engine.run(
            keyed(),
            lengths,
            n_predict,
            emit,
            logprobs=logprobs,
            share=share,
            stop_ids=stop_ids,
            describe=describe,
            top=top,
            group=group,
        )
        wall = time.perf_counter() - t1
        writer.commit()
    be = engine.backend
    lines = [
        f"prompts  {plural(tot.prompts, 'prompt')}, {plural(tot.prompt_tokens, 'token')}"
        f" ({tot.computed_tokens:,} computed"
        + (", shared prefixes once" if tot.computed_tokens < tot.prompt_tokens else "")
        + f"), read and checked in {scan_s:.2f} s",
        f"backend  {be.name} ({why}), KV {engine.kv_slots:,} slots, "
        f"{plural(tot.waves, 'wave')}, {plural(tot.chunks, 'chunk')} of <= {engine.ubatch}",
        f"prefill  {tot.prefill_tok_s:,.1f} tok/s aggregate ({tot.prefill_s:.2f} s)",
    ]
    if tot.decode_steps:
        lines.append(
            f"decode   {tot.decode_tok_s:,.1f} tok/s ({tot.decode_tokens:,} tokens in "
            f"{plural(tot.decode_steps, 'batched step')}, {tot.decode_s:.2f} s)"
        )
    lines.append(
        f"total    {wall:.2f} s, results " + ("on stdout" if out in (None, "-") else f"in {out}")
    )
    for ln in lines:
        log.info(ln)
    sys.stderr.flush()


def _run_ray(
    src,
    lengths,
    writer,
    ray: dict,
    group: int,
    *,
    out,
    kind,
    choice,
    ubatch,
    dtype,
    n_ctx,
    n_predict,
    logprobs,
    share,
    stop_ids,
    top,
    prompt_ids,
    scan_s,
) -> None:
    from minfer.engine.ray.job import run_file

    kw = dict(
        model=ray["model_path"],
        backend=kind,
        gemm=choice,
        ubatch=ubatch,
        dtype=dtype,
        threads=1 if kind == "cpu" else None,
        n_ctx=n_ctx,
        n_predict=n_predict,
        logprobs=logprobs,
        share_prefix=share,
        stop_ids=list(stop_ids),
        top=top,
        prompt_ids=prompt_ids,
        source=src.name,
    )
    tot = run_file(
        src,
        lengths,
        writer.write_line,
        kind=kind,
        address=ray["address"],
        actors=ray["actors"],
        batch=group,
        predictor_kwargs=kw,
    )
    writer.commit()
    where = "a local Ray instance" if ray["address"] in (None, "auto") else ray["address"]
    for ln in (
        f"prompts  {plural(tot.prompts, 'prompt')}, {plural(tot.prompt_tokens, 'token')},"
        f" read and checked in {scan_s:.2f} s",
        f"ray      {plural(tot.actors, kind + ' actor')} on {where}, "
        f"{plural(tot.batches, 'batch', 'batches')} of <= {group} prompts; Ray's start "
        f"{tot.start_s:.2f} s, the first batch back after {tot.first_s:.2f} s, then "
        f"{tot.after_tok_s:,.1f} prompt tok/s",
        f"prefill  {tot.prefill_tok_s:,.1f} tok/s an actor (the actors' prefill {tot.prefill_s:.2f}"
        f" s, decode {tot.decode_s:.2f} s, on their engines' clocks)",
        f"total    {tot.wall_s:.2f} s ({tot.prompt_tokens / max(tot.wall_s, 1e-9):,.1f} "
        "prompt tok/s, Ray's start included), results "
        + ("on stdout" if out in (None, "-") else f"in {out}"),
    ):
        log.info(ln)
    sys.stderr.flush()
