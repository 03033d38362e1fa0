"""llama.cpp's flags that mean nothing here, accepted on every command with one note each.

A llama.cpp user's command line (`minfer prefill -m M -ngl 99 -fa on --mlock -p hi`) runs: each
such flag, with its value, is parsed as the option it is (never `-ngl` read as `-n gl`) and
logged once on stderr (`minfer: -ngl 99 ignored: ...`, silenced by -q), and the command goes
on. minfer.cli adds these hidden options to every command that does not declare one of the
names itself (prefill's -ub is its --ubatch, synth's --seed its own). The flags whose meaning
is the same are options of the commands themselves (prefill -f, perplexity -c, bench -p / -r,
quantize IN OUT TYPE); docs/llamacpp.md has the whole table.

Not a command module (minfer.cli lists those).
"""

from __future__ import annotations

import re

import click

from minfer.errors import BadInput

_GPU = "minfer runs the whole model on the chosen backend (--backend cuda: every layer on one GPU)"
_ONE_GPU = "minfer runs on one GPU (CUDA_VISIBLE_DEVICES picks which)"
_GREEDY = "minfer decodes greedily (argmax), there is no sampling"

# (names, value: None for a plain flag, else a regex the value must match, why); a value
# that does not match is refused (exit 2) rather than taken from the next argument unseen
ONOFF = r"(on|off|auto|enabled|disabled|true|false|[01])(,[01])*"
IGNORED = [
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), r"(-?\d+|auto|all)(,\d+)*", _GPU),
    (
        ("-fa", "--flash-attn"),
        ONOFF,
        "minfer's attention is always its own fused (flash-style) kernel on the GPU",
    ),
    (("--mlock",), None, "minfer does not lock the model in memory"),
    (("--no-mmap",), None, "minfer always memory-maps the GGUF file (read on demand)"),
    (("--mmap",), None, "minfer always memory-maps the GGUF file"),
    (("--numa",), r"\w+", "minfer does no NUMA placement"),
    (("-sm", "--split-mode"), r"\w+", _ONE_GPU),
    (("-ts", "--tensor-split"), r"[\d.,/]+", _ONE_GPU),
    (("-mg", "--main-gpu"), r"\d+", _ONE_GPU),
    (("-dev", "--device"), r"[\w,/-]+", _ONE_GPU),
    (("-nkvo", "--no-kv-offload"), None, "the KV cache lives on the backend's device"),
    (("-ctk", "--cache-type-k"), r"\w+", "minfer's KV cache type is fixed (f16 on the GPU)"),
    (("-ctv", "--cache-type-v"), r"\w+", "minfer's KV cache type is fixed (f16 on the GPU)"),
    (
        ("-b", "--batch-size"),
        r"\d+(,\d+)*",
        "minfer feeds the prompt in --ubatch chunks (prefill's option)",
    ),
    (("-ub", "--ubatch-size"), r"\d+(,\d+)*", "this command has no micro-batch size"),
    (("--temp", "--temperature"), r"[\d.]+", _GREEDY),
    (("--top-k",), r"\d+", _GREEDY),
    (("--top-p",), r"[\d.]+", _GREEDY),
    (("--min-p",), r"[\d.]+", _GREEDY),
    (("--repeat-penalty",), r"[\d.]+", _GREEDY),
    (("-s", "--seed"), r"-?\d+", _GREEDY),
    (("--no-warmup",), None, "minfer's warm-up (kernel builds, graphs) is never timed"),
    (("-co", "--color"), r"(on|off|auto)", "minfer prints plain text"),
    (("--log-disable",), None, "use -q/--quiet"),
    (("-fit", "--fit"), r"(on|off)", "minfer plans GPU memory itself (--gemm auto)"),
    (("-t", "--threads"), r"-?\d+", "this command runs no computation"),
]
_ONE_SHOT = "minfer prefill runs one prompt and exits (no conversation loop)"
IGNORED += [
    (("-no-cnv", "--no-conversation"), None, _ONE_SHOT),
    (("-st", "--single-turn"), None, _ONE_SHOT),
    (("--jinja",), None, "minfer always renders the chat template with jinja2"),
]
# llama-cli's conversation mode: an interactive loop minfer does not have, so refused (exit 2)
# rather than ignored (the user would wait for a prompt that never comes)
REFUSED = [
    (
        ("-cnv", "--conversation"),
        "minfer prefill is one-shot: it runs one prompt (-p, -f, --chat) and exits; there is no "
        "conversation mode (for many prompts: --prompts FILE)",
    ),
]
# llama-bench's: minfer bench times prefill only (its pp rows)
BENCH_IGNORED = [
    (("-n", "--n-gen"), r"\d+(,\d+)*", "minfer bench times prefill only (llama-bench's tg rows)"),
    (("-pg",), r"\d+,\d+", "minfer bench times prefill only"),
]


def _note(why: str, pattern: str | None):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is None or value is False:
            return None
        name = param.opts[0]
        if pattern is not None and not re.fullmatch(pattern, str(value)):
            raise BadInput(
                f"{name} {value!r}: not a value llama.cpp takes for {name} "
                "(ignored here, but a missing value would swallow the next "
                "argument)"
            )
        from minfer.host.log import log

        shown = name if pattern is None else f"{name} {value}"
        log.warning(f"{shown} ignored: {why}")
        return None

    return callback


def _refuse(why: str):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value:
            raise BadInput(f"{param.opts[0]}: {why}")
        return None

    return callback


def options(command: str, taken: set[str]) -> list[click.Option]:
    """Hidden options for `command` (a click command's name) whose names it does not use."""
    out = [
        click.Option(
            list(names),
            hidden=True,
            expose_value=False,
            is_flag=True,
            default=None,
            callback=_refuse(why),
        )
        for names, why in REFUSED
        if not taken & set(names)
    ]
    for names, pattern, why in IGNORED + (BENCH_IGNORED if command == "bench" else []):
        if taken & set(names):
            continue
        kw = dict(is_flag=True, default=None) if pattern is None else dict(default=None, type=str)
        if names[0] == "-fa":  # llama.cpp once took a bare -fa: the value is optional
            kw["is_flag"], kw["flag_value"] = False, "on"
        out.append(
            click.Option(
                list(names), hidden=True, expose_value=False, callback=_note(why, pattern), **kw
            )
        )
    return out
