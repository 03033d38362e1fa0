"""Many prompts in one run (`minfer prefill --prompts FILE`): the prompt file read, validated
and tokenized in two streamed passes (prompts, reader), and the results written as JSONL
(output). docs/batch.md describes the formats. scheduler.py (with slots.py) is the continuous
form the server and the pooled jobs use: requests join the next packed forward, a prefix cache
in the KV cache."""
