"""Prompt files past one GPU: Ray Data (the `ray` extra, `pip install "minfer[ray]"`).

    import ray, minfer.engine.ray
    ds = ray.data.from_items([{"prompt": "The capital of France is"}, ...])
    out = ds.map_batches(minfer.engine.ray.MinferPredictor,   # or minfer.MinferPredictor
                         fn_constructor_kwargs={"model": path},
                         compute=ray.data.ActorPoolStrategy(size=n_gpus), num_gpus=1,
                         batch_size=256)   # rows of "record": a JSONL line each

predictor.py: the actor (one minfer.Engine a GPU); job.py: the driver `minfer prefill --prompts
FILE --ray [ADDRESS]` runs (records reordered into input order, as the single-process file).
Nothing here imports ray at module level: `import minfer.engine.ray` works without the extra.
"""

from minfer.engine.ray.predictor import MinferPredictor, need_ray

__all__ = ["MinferPredictor", "need_ray"]
