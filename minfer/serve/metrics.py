"""The server's Prometheus collectors (GET /metrics), in a registry of their own so that two
servers in one process (tests) never share counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "minfer_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("minfer_prompt_tokens", "prompt tokens received", registry=r)
        self.generation_tokens = Counter("minfer_generation_tokens", "tokens generated", registry=r)
        self.queue_depth = Gauge("minfer_queue_depth", "prompts waiting for KV slots", registry=r)
        self.running = Gauge(
            "minfer_running", "sequences in the KV cache being computed", registry=r
        )
        self.tokens_per_forward = Histogram(
            "minfer_tokens_per_forward",
            "tokens in one packed forward (padding excluded)",
            buckets=_TOKENS,
            registry=r,
        )
        self.queue_time = Histogram(
            "minfer_queue_seconds", "arrival to admission", buckets=_SECONDS, registry=r
        )
        self.prefill_time = Histogram(
            "minfer_prefill_seconds",
            "admission to the first generated token",
            buckets=_SECONDS,
            registry=r,
        )
        self.decode_time = Histogram(
            "minfer_decode_seconds",
            "first generated token to the last",
            buckets=_SECONDS,
            registry=r,
        )
        self.prefix_hits = Counter(
            "minfer_prefix_cache_hits",
            "prompts whose head was copied from the KV cache",
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "minfer_prefix_cache_hit_tokens", "prompt tokens copied instead of computed", registry=r
        )
        self.prefix_entries = Gauge(
            "minfer_prefix_cache_entries", "finished prompts kept in the KV cache", registry=r
        )
        self.prefix_slots = Gauge(
            "minfer_prefix_cache_slots", "KV slots the prefix entries hold", registry=r
        )
        self.host_time = Histogram(
            "minfer_host_seconds",
            "a completion request's host work: parse, tokenize, "
            "submit, serialize (not the wait for the engine)",
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        self.kv_slots = Gauge("minfer_kv_slots", "KV cache slots in all", registry=r)
        self.engine_time = Counter(
            "minfer_engine_seconds",
            "the engine thread's wall time by phase: schedule (admit, copy, pack), forward "
            "(in the backend: a forward's launch, its uploads and kernels queued, and the wait "
            "for its numbers), hand (results to the requests), idle (waiting for work)",
            ["phase"],
            registry=r,
        )
