"""Open-loop load over HTTP: each request is its own task, sent at its arrival time however many are in flight,
and timed from that due time, not from when it was sent (a server that falls behind delays the client's sends too,
and timing from the send would hide that wait: coordinated omission). A request that fails (refused, HTTP error,
timed out, no token) counts as a miss of the SLO, never as absent from it. With an SLO, goodput over HTTP is found
by the same rate search as a trial's (benchmark/goodput.py), so that a served recipe, `llama-server` or any other
OpenAI-compatible server is measured alike.

GuideLLM (0.8.1) measures the same against OpenAI-compatible servers, but it requires datasets>=5, sanic, uvloop,
pydantic-settings, click 8.4 and an unpinned torch and transformers beside ours; this client is the standard
library's asyncio streams, which autotune's loadtest already used."""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from autotune.benchmark.bench import percentile
from autotune.benchmark.goodput import find_goodput
from autotune.benchmark.open_loop import WARMUP_SHARE, OpenLoopRun, wilson_interval
from autotune.config.slo import Slo

__all__ = ["send_at_arrivals", "judge", "find_http_goodput"]

# One streaming request: (host, port, body, timeout_s, started=due time) -> an outcome with ok, tokens, ttft_s,
# tpot_s, latency_s, error (serve/loadtest.py's client).
Request = Callable[..., Awaitable]


def send_at_arrivals(request: Request, host: str, port: int, bodies: list[dict], due: list[float],
                     timeout_s: float = 300.0):
    """Every body sent with `request` (serve/loadtest's streaming client) at its `due` second from now, on its own
    task; returns (outcomes, seconds). Outcome times are from the due time."""
    async def run() -> list:
        start = time.perf_counter()

        async def one(i: int):
            wait = start + due[i] - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            return await request(host, port, bodies[i], timeout_s, started=start + due[i])

        return await asyncio.gather(*(one(i) for i in range(len(bodies))))

    t0 = time.perf_counter()
    outcomes = asyncio.run(run())
    return outcomes, time.perf_counter() - t0


def judge(outcomes: list, slo: Slo, rate: float, seconds: float, warmup: int | None = None) -> OpenLoopRun:
    """The outcomes against the SLO, the first `warmup` (WARMUP_SHARE of them) not counted; a failure misses."""
    warmup = math.ceil(WARMUP_SHARE * len(outcomes)) if warmup is None else warmup
    counted = outcomes[warmup:]
    met = sum(o.ok and slo.met(o.ttft_s * 1e3 if o.ttft_s is not None else None,
                               o.tpot_s * 1e3 if o.tpot_s is not None else None) for o in counted)
    ok = [o for o in counted if o.ok]
    ttft = [o.ttft_s * 1e3 for o in ok if o.ttft_s is not None]
    tpot = [o.tpot_s * 1e3 for o in ok if o.tpot_s is not None]

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    n = len(counted)
    return OpenLoopRun(rate=rate, counted=n, met=met, missed=n - met, attained=n > 0 and met >= slo.attainment * n,
                       attainment=met / n if n else 0.0, interval=wilson_interval(met, n), stopped_early=False,
                       seconds=seconds, ttft_p50_ms=pct(ttft, 0.5), ttft_p99_ms=pct(ttft, 0.99),
                       tpot_p50_ms=pct(tpot, 0.5), tpot_p99_ms=pct(tpot, 0.99),
                       output_tok_s=sum(o.tokens for o in ok) / seconds if seconds > 0 else 0.0, queue_growth=0)


def find_http_goodput(request: Request, host: str, port: int, bodies_for: Callable[[int], list[dict]],
                      due_for: Callable[[float, int], list[float]], slo: Slo, start_rate: float, requests: int,
                      budget_s: float) -> dict:
    """Goodput of a server: open-loop runs of `requests` requests (`bodies_for(n)`, sent at `due_for(rate, n)`) at the
    rates the search picks, from `start_rate`."""
    def measure(rate: float) -> OpenLoopRun:
        outcomes, seconds = send_at_arrivals(request, host, port, bodies_for(requests), due_for(rate, requests))
        return judge(outcomes, slo, rate, seconds)

    return find_goodput(measure, start_rate, slo, budget_s=budget_s)
