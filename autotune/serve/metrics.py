"""The server's Prometheus metrics, under vLLM's names (its `vllm:` prefix as `autotune:`) where vLLM has one, in a
registry of the server's own (two servers in one process, as in tests, never share a series)."""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from autotune.engine import Completion
from autotune.serve.engine_loop import EngineLoop

__all__ = ["ServerMetrics", "ENDPOINTS", "OTHER"]

# Label values of the request counter: any other path is counted as OTHER, so that a scanner requesting random
# paths adds no series (and no path, quotes and all, ever reaches the exposition text).
ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
             "/openapi.json")
OTHER = "other"

# vLLM's buckets, with finer ones at the low end: a CPU decode step of a small model takes a few milliseconds.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                10.0, 20.0, 80.0)
_E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0)


class _EngineCollector:
    """Gauges and engine counters read at scrape time from the engine loop's published snapshot: nothing to do
    on the engine thread per step."""

    def __init__(self, loop: EngineLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        loop, gauges = self._loop, self._loop.gauges
        total = max(gauges["kv_pages_total"], 1)
        for name, value, text in (
            ("num_requests_running", gauges["running"], "Requests in the running batch."),
            ("num_requests_waiting", gauges["queue_depth"], "Requests waiting for a batch row (queue depth)."),
            ("batch_size", loop.batch_size, "The recipe's maximum batch size."),
            ("kv_pages_in_use", gauges["kv_pages_in_use"], "KV cache pages held by sequences."),
            ("kv_pages_total", gauges["kv_pages_total"], "KV cache pages allocated."),
            ("kv_cache_usage_perc", gauges["kv_pages_in_use"] / total, "KV cache usage (1 means 100 percent)."),
        ):
            yield GaugeMetricFamily(f"autotune:{name}", text, value=value)
        yield CounterMetricFamily("autotune:engine_steps", "Engine steps (prefill and/or decode) run.",
                                  value=loop.steps)
        yield CounterMetricFamily("autotune:engine_busy_seconds",
                                  "Wall time spent inside engine steps (the rest the engine waited for requests).",
                                  value=loop.busy_s)


class ServerMetrics:
    """Counters and histograms are bumped on the HTTP event loop (prometheus_client locks them); gauges are the
    engine loop's snapshot."""

    def __init__(self, loop: EngineLoop) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("autotune:requests", "HTTP requests by endpoint and status code (a stream that "
                                "failed or was left by its client after its 200 counts its error, or 499).",
                                ["endpoint", "code"], registry=registry)
        self.refused = Counter("autotune:requests_refused", "Requests refused before generation, by reason (host, "
                               "auth, content_type, length, body_timeout, header_timeout, connections, "
                               "prompt_bytes, stop_strings, overloaded).", ["reason"], registry=registry)
        self.success = Counter("autotune:request_success", "Requests answered, by why generation ended.",
                               ["finished_reason"], registry=registry)
        self.prompt_tokens = Counter("autotune:prompt_tokens", "Prompt tokens of answered requests.",
                                     registry=registry)
        self.generation_tokens = Counter("autotune:generation_tokens", "Tokens generated for answered requests.",
                                         registry=registry)
        self.ttft = Histogram("autotune:time_to_first_token_seconds", "From arrival to the first token.",
                              registry=registry, buckets=_TTFT_BUCKETS)
        self.itl = Histogram("autotune:inter_token_latency_seconds", "Between consecutive tokens of a request.",
                             registry=registry, buckets=_ITL_BUCKETS)
        self.e2e = Histogram("autotune:e2e_request_latency_seconds", "From arrival to the last token.",
                             registry=registry, buckets=_E2E_BUCKETS)
        registry.register(_EngineCollector(loop))

    def count(self, path: str, status: int) -> None:
        self.requests.labels(path if path in ENDPOINTS else OTHER, str(status)).inc()

    def refuse(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def answered(self, completion: Completion, finish_reason: str) -> None:
        """A request answered in full: its tokens and latencies."""
        times = completion.token_times
        self.success.labels(finish_reason).inc()
        self.prompt_tokens.inc(len(completion.request.prompt_ids))
        self.generation_tokens.inc(len(completion.output_ids))
        if times:
            self.ttft.observe(times[0] - completion.arrival)
            self.e2e.observe(times[-1] - completion.arrival)
            for before, after in zip(times, times[1:]):
                self.itl.observe(after - before)

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format the scraper asks for (Prometheus text, or OpenMetrics), and its type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
