"""Many prompts in one run (`minfer prefill --prompts FILE`): the prompt file read, validated
and tokenized in two streamed passes (prompts, reader), and the results written as JSONL
(output). docs/batch.md describes the formats."""
