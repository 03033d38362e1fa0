"""`minfer prefill`'s tool (minfer.commands.prefill keeps the flags and their checks): one.py,
a prompt run and reported (and the run's defaults, shared by other commands: UBATCH,
context_size); many.py, a prompt file (--prompts), packed, as JSONL records."""
