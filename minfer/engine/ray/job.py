"""The driver of `minfer prefill --prompts FILE --ray [ADDRESS]`: the file checked here first
(every line, as without Ray), its prompts sent as rows of a Ray Data dataset to MinferPredictor
actors (one Engine each: a GPU, or a CPU with the cpu backend), the records written in input
order (reordered by index here), so the output is the single-process file.

Faults: Ray Data restarts an actor that dies and runs its batch again on a live one (a batch's
records come back once, from the run that finished); an index seen twice or never is refused
here all the same. An error raised in an actor (a GPU fault, a NaN) is re-raised as its own
one-line MinferError. SIGINT ends the iteration; the writer leaves no partial file.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import time
from dataclasses import dataclass

import numpy as np

from minfer.engine.api import kv_plan
from minfer.engine.ray.predictor import MinferPredictor, need_ray
from minfer.errors import GPUError, MinferError


class RayJobError(MinferError):
    """The job's records came back wrong (one missing or twice): exit 3."""

    exit_code = 3


@dataclass
class JobTotals:
    prompts: int = 0
    prompt_tokens: int = 0
    actors: int = 0
    batches: int = 0
    started: bool = False  # a local Ray instance started (and shut down) by this job
    wall_s: float = 0.0
    start_s: float = 0.0  # Ray's start (or join)
    first_s: float = 0.0  # until the first batch's records came (actors made, model loaded)
    after_tokens: int = 0  # prompt tokens of the batches that came after the first
    prefill_s: float = 0.0  # the actors' prefill seconds, summed (their engines' own clocks)
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tok/s an actor (a GPU) over the actors' summed prefill seconds, as the single
        process's `prefill` line counts its own (nan when the actors reported none)."""
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def after_tok_s(self) -> float:
        """Prompt tok/s once the first batch was back: the actors' rate without Ray's start
        and their model loads (nan with a single batch)."""
        dt = self.wall_s - self.first_s
        return self.after_tokens / dt if self.after_tokens and dt > 0 else float("nan")


def connect(ray, address: str | None) -> bool:
    """Ray initialized: an instance already up in this process is used as it is; "auto" (or
    None) starts a local one with this host's CPUs and GPUs; an address joins that cluster.
    True when this call started it (so the job shuts it down)."""
    if ray.is_initialized():
        return False
    kw = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    if address in (None, "auto"):
        ray.init(**kw)
    else:
        ray.init(address=address, **kw)
    return True


def actor_count(ray, kind: str, actors: int | None) -> int:
    """One actor a GPU of the cluster (cuda), or a CPU (cpu), unless `actors` says."""
    res = ray.cluster_resources()
    have = int(res.get("GPU" if kind == "cuda" else "CPU", 0))
    if actors is None:
        actors = have
    if actors < 1:
        raise GPUError(
            "the Ray cluster has no GPU for a cuda actor (--backend cpu runs CPU actors)"
            if kind == "cuda"
            else "the Ray cluster has no CPU"
        )
    return actors


def _minfer_error(e: BaseException) -> MinferError | None:
    """The MinferError an actor raised, found in Ray's wrapping exceptions, as a plain one."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        cause = getattr(e, "cause", None)
        if isinstance(cause, MinferError):
            e = cause
            continue
        if isinstance(e, MinferError):
            base = next(c for c in type(e).__mro__ if c.__module__.startswith("minfer."))
            # Ray Data appends its own lines ("Failed to apply UDF ...") to the message
            return base((str(e.args[0]) if e.args else str(e)).split("\n")[0])
        e = e.__cause__ or e.__context__
    return None


def rows(src, lengths) -> list[dict]:
    """One row a prompt: index, id (JSON), line, ids (int32 bytes), n_context (-1: none)."""
    return [
        {
            "index": p.index,
            "id": json.dumps(p.id),
            "line": p.line,
            "ids": p.ids.tobytes(),
            "n_context": -1 if p.n_context is None else p.n_context,
        }
        for p in src
    ]


def groups_of(items: list[dict], n: int) -> list[dict]:
    """The rows of each n consecutive prompts as one dataset row {"group": pickled columns}: a
    Ray batch is then exactly a group of the single-process run (`--group`), whatever blocks
    Ray Data would cut."""
    out = []
    for i in range(0, len(items), n):
        part = items[i : i + n]
        out.append({"group": pickle.dumps({k: [r[k] for r in part] for k in part[0]})})
    return out


def grouped(cls):
    """cls (MinferPredictor or a subclass) over group rows (groups_of): each group's prompts
    run as one batch, its records out a row a prompt."""

    class Grouped(cls):
        def __call__(self, batch: dict) -> dict:
            outs = [super(Grouped, self).__call__(pickle.loads(g)) for g in batch["group"]]
            return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}

    Grouped.__name__ = Grouped.__qualname__ = cls.__name__
    return Grouped


def run_file(
    src,
    lengths,
    write_line,
    *,
    kind: str,
    address: str | None,
    actors: int | None,
    batch: int,
    predictor_kwargs: dict,
    progress: bool = True,
    predictor=None,
) -> JobTotals:
    """Every prompt of the scanned PromptSource `src` (lengths: scan()'s) through Ray actors;
    write_line(line) per record, in input order. predictor: the actor class (None: this
    module's MinferPredictor, looked up at the call: a test swaps in a subclass)."""
    ray = need_ray("--ray")
    from minfer.host.progress import bar

    tot = JobTotals(prompts=len(lengths), prompt_tokens=int(sum(int(n) for n in lengths)))
    t0 = time.perf_counter()
    for name in ("ray", "ray.data"):  # Ray's lines would bury minfer's: its error is ours
        logging.getLogger(name).setLevel(logging.CRITICAL)
    tot.started = connect(ray, address)
    tot.start_s = time.perf_counter() - t0
    try:
        tot.actors = min(actor_count(ray, kind, actors), math.ceil(len(lengths) / batch))
        items = rows(src, lengths)
        groups = groups_of(items, batch)
        tot.batches = len(groups)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # minfer's bar over the whole job instead
        ctx.raise_original_map_exception = True  # an actor's MinferError, not a wrapper
        res = {"num_gpus": 1} if kind == "cuda" else {"num_cpus": 1}
        # each actor's KV cache planned for the whole job, as the single process plans its own:
        # sized by one group's prompts, a later, larger group would run in two waves there
        kv = kv_plan(lengths, int(predictor_kwargs.get("n_predict", 32)))
        ds = ray.data.from_items(groups, override_num_blocks=len(groups)).map_batches(
            grouped(predictor or MinferPredictor),
            fn_constructor_kwargs={**predictor_kwargs, "kv_for": kv},
            batch_size=1,  # a row is a group: the batch the single-process run cuts too
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=tot.actors),
            **res,
        )
        pb = bar(progress, total=len(items), desc="prompts", unit="prompt")
        try:
            _ordered(ds, len(items), write_line, pb, tot, lengths, t0)
        except Exception as e:
            err = _minfer_error(e)
            if err is None:
                raise
            raise err from None
        finally:
            if pb is not None:
                pb.close()
    finally:
        if tot.started:
            ray.shutdown()
    tot.wall_s = time.perf_counter() - t0
    return tot


def _ordered(ds, n: int, write_line, pb, tot: JobTotals, lengths, t0: float) -> None:
    """The dataset's records written in index order: each held until those before it came
    (tot: when the first came, the prompt tokens of those after)."""
    pending: dict[int, str] = {}
    nxt = 0
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        idx = b["index"].tolist()
        if "prefill_s" in b:
            tot.prefill_s += float(np.sum(b["prefill_s"]))
            tot.decode_s += float(np.sum(b["decode_s"]))
        if not tot.first_s:
            tot.first_s = time.perf_counter() - t0
        else:
            tot.after_tokens += sum(int(lengths[i]) for i in idx if 0 <= i < n)
        for i, line in zip(idx, b["record"].tolist()):
            if i < nxt or i in pending or not 0 <= i < n:
                raise RayJobError(
                    f"the Ray job returned prompt {i}'s record twice (or an unknown index)"
                )
            pending[i] = line
        while nxt in pending:
            write_line(pending.pop(nxt))
            nxt += 1
            if pb is not None:
                pb.update(1)
    if nxt != n:
        raise RayJobError(
            f"the Ray job returned {nxt} of {n} records in order (prompt {nxt}'s is missing)"
        )
