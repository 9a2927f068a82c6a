"""Server counters and gauges, written out in the Prometheus text format."""
from __future__ import annotations

import threading
from collections import Counter

__all__ = ["ServerMetrics"]


class ServerMetrics:
    """Counters are bumped by HTTP threads (under a lock); gauges are read from the scheduler's snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def count(self, endpoint: str, status: int, prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens

    def render(self, gauges: dict[str, int], batch_size: int, steps: int, busy_s: float) -> str:
        with self._lock:
            requests = sorted(self.requests.items())
            prompt, generated = self.prompt_tokens, self.generation_tokens
        lines = ["# HELP autotune_requests_total HTTP requests by endpoint and status code.",
                 "# TYPE autotune_requests_total counter"]
        lines += [f'autotune_requests_total{{endpoint="{e}",code="{s}"}} {n}' for (e, s), n in requests]
        for name, value, kind, text in (
            ("autotune_prompt_tokens_total", prompt, "counter", "Prompt tokens of answered requests."),
            ("autotune_generation_tokens_total", generated, "counter", "Tokens generated for answered requests."),
            ("autotune_engine_steps_total", steps, "counter", "Engine steps (prefill and/or decode) run."),
            ("autotune_engine_busy_seconds_total", round(busy_s, 6), "counter",
             "Wall time spent inside engine steps (the rest the engine waited for requests)."),
            ("autotune_queue_depth", gauges["queue_depth"], "gauge", "Requests waiting for a batch row."),
            ("autotune_running_requests", gauges["running"], "gauge", "Requests in the running batch."),
            ("autotune_batch_size", batch_size, "gauge", "The recipe's maximum batch size."),
            ("autotune_kv_pages_in_use", gauges["kv_pages_in_use"], "gauge", "KV cache pages held by sequences."),
            ("autotune_kv_pages_total", gauges["kv_pages_total"], "gauge", "KV cache pages allocated."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
