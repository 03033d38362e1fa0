"""What `minfer perplexity` prints (minfer/commands/perplexity.py runs it). Not a command module.

llama-perplexity's lines: `[1]x,[2]y,...` as each window ends (flushed, so a pipe or a log sees
each window then, not at the end), then the statistics and `Final estimate: PPL = X +/- Y`,
the line scripts grep for. Ctrl-C / SIGTERM print what was measured as a `Partial estimate`
(never the final line's words) before the interruption's own line. --json: one object at the
end (`interrupted` and `chunks_done` added after a signal).
"""

from __future__ import annotations

import json
import sys

import click

from minfer.host.words import plural


class Report:
    """out: the run's fields (model, backend, text, ctx, chunks, ...), printed as head() and
    window() come, then result(stats) at the end or at an interruption."""

    def __init__(self, out: dict, as_json: bool):
        self.out, self.json = out, as_json

    def head(self, describe: str) -> None:
        if self.json:
            return
        o = self.out
        click.echo(f"model    {describe}")
        click.echo(f"backend  {o['backend']} ({o['backend_choice']})")
        if o["emulate"] is not None:
            click.echo(
                f"emulate  {o['emulate']['grid']}: {o['emulate']['weights']} linear "
                "weights on its grid, the rest exact"
            )
        click.echo(
            f"text     {o['text']}: {plural(o['n_tokens'], 'token')}; "
            f"{plural(o['chunks'], 'window')} of {o['ctx']} ({o['rows_per_chunk']} "
            f"scored each, {o['chunks'] * o['rows_per_chunk']:,} in all)"
        )
        sys.stdout.flush()

    def bar(self, n: int):
        from minfer.host.progress import bar as progress_bar

        return progress_bar(
            self.json or not sys.stdout.isatty(), total=n, desc="perplexity", unit="window"
        )

    def window(self, i: int, ppl: float) -> None:
        if not self.json:
            click.echo(f"[{i + 1}]{ppl:.4f},", nl=False)
            sys.stdout.flush()

    def result(self, stats: dict, interrupted: bool = False) -> None:
        out = {**self.out, **stats}
        done = len(out["running_ppl"])
        if interrupted:
            out.update(interrupted=True, chunks_done=done)
        from minfer.tools.perplexity.windows import json_safe, nonfinite

        bad = nonfinite(out)
        if bad:  # never `mean KLD nan` (exit 0) nor a bare NaN in the JSON
            from minfer.errors import NumericError

            err = NumericError(
                f"non-finite results ({', '.join(bad)}): NaN or inf in this "
                "run's logits or the base's"
            )
            if self.json:
                click.echo(json.dumps({**json_safe(out), "error": str(err)}))
            raise err
        if self.json:
            click.echo(json.dumps(out))
            return
        click.echo("")
        run_s = out["run_s"]
        click.echo(
            f"time     {run_s:.2f} s ({run_s / done:.2f} s per window; load {out['load_s']:.2f} s)"
        )
        if out["saved_logits"] is not None and not interrupted:
            what = (
                "llama.cpp log-probs (uint16)"
                if out["saved_format"] == "llama.cpp"
                else "f32 logits"
            )
            click.echo(f"saved    {out['saved_logits']} ({out['n_scored']:,} rows of {what})")
        k = out["kld"]
        if k is not None:
            click.echo(
                f"base     {out['kld_base']} ({out['kld_base_format']}): PPL = "
                f"{k['base_ppl']:.4f} +/- {k['base_ppl_err']:.5f}"
            )
            click.echo(
                f"mean Δlog-prob   {k['mean_dlogprob']:+.6f} +/- "
                f"{k['mean_dlogprob_err']:.6f}  (correct token, this - base)"
            )
            click.echo(f"mean KLD         {k['mean']:.6f} +/- {k['mean_err']:.6f}")
            click.echo(f"99.0% KLD        {k['p99']:.6f}")
            click.echo(
                f"same top-1       {100 * k['same_top1']:.2f} +/- {100 * k['same_top1_err']:.2f} %"
            )
            if k["max_abs_dlogit"] is not None:
                click.echo(f"max |dlogit|     {k['max_abs_dlogit']:.4f}")
        if interrupted:  # not "Final estimate": a script grepping for it must not take this
            click.echo(
                f"Partial estimate ({done} of {plural(out['chunks'], 'window')}, "
                f"interrupted): PPL = {out['ppl']:.4f} +/- {out['ppl_err']:.5f}"
            )
        else:
            click.echo(f"Final estimate: PPL = {out['ppl']:.4f} +/- {out['ppl_err']:.5f}")
        sys.stdout.flush()
