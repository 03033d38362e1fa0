"""minfer's command line: a thin click layer. Each command lives in minfer/commands/<name>.py.

Exit codes (README, "Errors"): 0 ok, 1 usage error, 2 bad input (file, prompt, option value),
3 GPU or resource failure, 130 interrupted. A MinferError prints one line `error: ...`.
"""

from __future__ import annotations

import importlib
import sys

import click

from minfer import __version__
from minfer.errors import MinferError

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 130

# (module, click command attribute); a command module that is absent is not offered.
_COMMANDS = [
    ("minfer.commands.prefill", "prefill"),
    ("minfer.commands.inspect", "inspect"),
    ("minfer.commands.quantize", "quantize"),
    ("minfer.commands.synth", "synth"),
    ("minfer.commands.bench", "bench"),
    ("minfer.commands.check", "check"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="minfer")
def cli() -> None:
    """minfer: prefill inference for llama-style GGUF models on NVIDIA GPUs.

    Runs a prompt through the model, reports prefill tok/s and greedily decoded tokens that
    must be identical on every kernel path (GPU f16, GPU MMQ, CPU numpy reference).
    """


for _mod, _attr in _COMMANDS:
    try:
        cli.add_command(getattr(importlib.import_module(_mod), _attr))
    except ModuleNotFoundError as e:
        if e.name != _mod:
            raise


def main(argv: list[str] | None = None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="minfer", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:  # usage errors, bad option values click itself checks
        e.show()
        sys.exit(EXIT_USAGE)
    except MinferError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)
