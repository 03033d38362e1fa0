"""The driver: prompts through any backend's packed protocol, below the backends (they import
its layout; it imports none of them). layout.py: the packed call's contract both backends check;
schedule.py: waves, packed chunks, shared prefixes; run.py: the runner of many prompts, single.py
its one-prompt case (`minfer prefill`); scheduler.py with slots.py: the continuous form the server
and the pooled jobs use (requests join the next packed forward, a prefix cache in the KV cache);
prompts.py, reader.py, records.py, output.py: the prompt file read, validated and tokenized in
two streamed passes, the results written as JSONL (docs/batch.md). The Python API over a loaded
model is minfer.engine."""
