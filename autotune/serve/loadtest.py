"""`autotune loadtest`: a client-side benchmark of any server speaking OpenAI's streaming /v1/completions.

One thread drives every request in flight (asyncio streams), so that a run at concurrency 16 wakes one thread per
server step, not sixteen: on a machine whose cores the server's workers use, each woken client thread takes one
of those cores from them.

Times are taken where a user feels them, on the client: time to first token (request sent to first token
received), time per output token (between the first and the last token), output tokens per second of wall time."""
from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from autotune.config.arrival import gamma_arrivals
from autotune.config.slo import Slo
from autotune.errors import UserInputError
from autotune.serve.guard import API_KEY_ENV
from autotune.serve.open_loop_http import find_http_goodput, judge, send_at_arrivals

__all__ = ["Outcome", "check_loopback", "one_request", "stream_request", "run_level", "run_loadtest", "format_table"]


@dataclass(slots=True)
class Outcome:
    ok: bool
    tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0
    error: str = ""


def check_loopback(url: str) -> tuple[str, int]:
    """Host and port of `url`, refused unless it is this machine: a load test must never hit anyone else."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise UserInputError(f"{url!r} is not an http://HOST:PORT URL")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or 80)}
    except socket.gaierror as exc:
        raise UserInputError(f"cannot resolve {parts.hostname!r}: {exc}") from None
    if not all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses):
        raise UserInputError(f"{parts.hostname} is not a loopback address: loadtest only targets this machine")
    return parts.hostname, parts.port or 80


def _model_id(host: str, port: int) -> str | None:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        key = os.environ.get(API_KEY_ENV)
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        data = json.loads(resp.read()) if resp.status == 200 else {}
        conn.close()
        return data["data"][0]["id"] if data.get("data") else None
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        return None


def one_request(host: str, port: int, body: dict, timeout: float = 300.0) -> Outcome:
    """One streaming completion; every SSE event that carries a choice counts as the arrival of a token."""
    return asyncio.run(_request(host, port, body, timeout))


async def stream_request(host: str, port: int, body: dict, timeout: float, started: float | None = None) -> Outcome:
    """One streaming completion on the running event loop (one_request's, for a caller with a loop of its own)."""
    return await _request(host, port, body, timeout, started)


async def _request(host: str, port: int, body: dict, timeout: float, started: float | None = None) -> Outcome:
    """`started`: the time the request is timed from (an open-loop request's due time); now by default."""
    started = time.perf_counter() if started is None else started
    try:
        return await asyncio.wait_for(_stream(host, port, body, started), timeout)
    except (OSError, ValueError, EOFError, TimeoutError) as exc:
        return Outcome(False, latency_s=time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}"[:200])


async def _stream(host: str, port: int, body: dict, started: float) -> Outcome:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        payload = json.dumps(body).encode()
        # A server started with an API key (serve/guard.py) is sent the same key, from the same variable.
        key = os.environ.get(API_KEY_ENV)
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"{auth}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()
        status, headers = await _head(reader)
        chunks = _body(reader, headers)
        if status != 200:
            text = b""
            async for chunk in chunks:
                text += chunk
                if len(text) >= 2000:
                    break
            return Outcome(False, latency_s=time.perf_counter() - started,
                           error=f"HTTP {status}: {text[:2000].decode(errors='replace')[:200]}")
        times: list[float] = []
        usage_tokens = None
        pending = b""
        async for chunk in chunks:
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = event.strip()
                if not data.startswith(b"data:"):
                    continue
                data = data[5:].strip()
                if data == b"[DONE]":
                    return _outcome(started, times, usage_tokens)
                parsed = json.loads(data)
                if "error" in parsed:
                    return Outcome(False, latency_s=time.perf_counter() - started, error=str(parsed["error"])[:200])
                if parsed.get("usage"):
                    usage_tokens = parsed["usage"].get("completion_tokens")
                choices = parsed.get("choices") or []
                # A closing event with only a finish_reason and no text carries no token.
                if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
                    times.append(time.perf_counter())
        return _outcome(started, times, usage_tokens)
    finally:
        writer.close()


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status code and the headers (names lower-cased) of an HTTP/1.1 response."""
    line = await reader.readline()
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response: {line[:80]!r}")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives: chunked (a stream), of a Content-Length, or up to the connection's end."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while chunk := await reader.read(65536):
            yield chunk


def _outcome(started: float, times: list[float], usage_tokens: int | None) -> Outcome:
    tokens = usage_tokens if usage_tokens is not None else len(times)
    if not times:
        return Outcome(False, tokens, latency_s=time.perf_counter() - started, error="no token received")
    tpot = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 else None
    return Outcome(True, tokens, times[0] - started, tpot, time.perf_counter() - started)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass(slots=True)
class LevelResult:
    concurrency: int
    requests: int
    ok: int
    errors: int
    duration_s: float
    throughput_tok_s: float
    requests_per_s: float
    ttft_ms: dict = field(default_factory=dict)
    tpot_ms: dict = field(default_factory=dict)
    latency_ms: dict = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    attainment: dict | None = None  # with an SLO: open_loop.OpenLoopRun's figures (judged by open_loop_http.judge)


def _ms(values: list[float]) -> dict:
    return {f"p{int(q * 100)}": None if (v := _pct(values, q)) is None else v * 1e3 for q in (0.5, 0.9, 0.99)}


def run_level(host: str, port: int, bodies: list[dict], concurrency: int, rate: float | None = None,
              seed: int = 0, burstiness: float = 1.0, slo: Slo | None = None) -> LevelResult:
    """Send `bodies` with at most `concurrency` in flight (closed loop: a request is sent when one ends); with `rate`,
    open loop instead: each request is sent at its arrival (gamma gaps of shape `burstiness`, Poisson at 1) however
    many are in flight, and timed from that due time (serve/open_loop_http.py); `concurrency` is then the most that
    may be due at once, unbounded. With `slo`: its attainment, a failed request counted as a miss."""
    started = time.perf_counter()
    if rate:
        outcomes, _ = send_at_arrivals(_request, host, port, bodies, gamma_arrivals(len(bodies), rate, burstiness,
                                                                                    seed))
    else:
        outcomes = [None] * len(bodies)

        async def level() -> None:
            cursor = iter(range(len(bodies)))

            async def worker() -> None:
                for i in cursor:  # one iterator shared by the workers: each request is taken once
                    outcomes[i] = await _request(host, port, bodies[i], 300.0)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        asyncio.run(level())
    duration = time.perf_counter() - started
    done = [o for o in outcomes if o is not None]
    good = [o for o in done if o.ok]
    return LevelResult(
        concurrency=concurrency, requests=len(bodies), ok=len(good), errors=len(bodies) - len(good),
        duration_s=duration, throughput_tok_s=sum(o.tokens for o in good) / duration,
        requests_per_s=len(good) / duration,
        ttft_ms=_ms([o.ttft_s for o in good if o.ttft_s is not None]),
        tpot_ms=_ms([o.tpot_s for o in good if o.tpot_s is not None]),
        latency_ms=_ms([o.latency_s for o in good]),
        error_samples=sorted({o.error for o in done if not o.ok})[:5],
        attainment=judge(done, slo, rate or 0.0, duration).to_dict() if slo is not None else None)


def run_loadtest(url: str, prompts: list[str], concurrencies: list[int], num_requests: int | None, max_tokens: int,
                 *, model: str | None = None, rate: float | None = None, fixed_length: bool = True,
                 burstiness: float = 1.0, slo: Slo | None = None, find_goodput: bool = False,
                 budget_s: float = 600.0) -> dict:
    """Concurrency levels (closed loop), or with `rate` one open-loop level at that rate; with `slo` each level's
    attainment; with `find_goodput` (needs `slo`) the goodput rate search from `rate` (default: the rate a burst
    of requests is served at), open-loop runs of `num_requests` (default 40) each, in about `budget_s`."""
    host, port = check_loopback(url)
    model = model or _model_id(host, port)
    if model is None:
        raise UserInputError(f"{url} answered no model on GET /v1/models: pass --model-id")
    if find_goodput and slo is None:
        raise UserInputError("--find-goodput needs --slo (the latency objectives goodput is measured under)")

    def body(prompt: str) -> dict:
        out = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}}
        if fixed_length:  # vLLM's and our extension: every request produces exactly max_tokens
            out.update(min_tokens=max_tokens, ignore_eos=True)
        return out

    def bodies(n: int) -> list[dict]:
        return [body(prompts[i % len(prompts)]) for i in range(n)]

    warm = one_request(host, port, body(prompts[0]))
    if not warm.ok:
        raise UserInputError(f"{url} did not answer a first request: {warm.error}")
    out = {"url": url, "model": model, "max_tokens": max_tokens, "rate": rate, "fixed_length": fixed_length,
           "arrival": "poisson" if rate or find_goodput else "offline", "burstiness": burstiness,
           "slo": slo.to_dict() if slo else None, "levels": []}
    if find_goodput:
        n = num_requests or 40
        start = rate
        if start is None:  # a burst of n requests: the rate the server keeps up with when it is never idle
            burst = run_level(host, port, bodies(n), n)
            start = burst.requests_per_s
            out["levels"].append(asdict(burst))
        out["goodput"] = find_http_goodput(_request, host, port, bodies,
                                           lambda r, k: gamma_arrivals(k, r, burstiness), slo, start, n, budget_s)
        return out
    for c in ([0] if rate else concurrencies):
        n = num_requests or max(16, 2 * c)
        level = asdict(run_level(host, port, bodies(n), c, rate, burstiness=burstiness, slo=slo))
        if rate:
            level["concurrency"] = None  # open loop: as many in flight as are due
        out["levels"].append(level)
    return out


def format_table(result: dict) -> str:
    def f(v: float | None, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v, fmt)

    slo = result.get("slo")
    head = ("| concurrency | requests | tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms "
            "| errors |" + (" within SLO (95% interval) |" if slo else "")
            + "\n|---|---|---|---|---|---|---|---|---|" + ("---|" if slo else ""))
    rows = []
    for lv in result["levels"]:
        row = (f"| {lv['concurrency'] if lv['concurrency'] is not None else 'open loop'} | {lv['requests']} "
               f"| {f(lv['throughput_tok_s'])} | {f(lv['requests_per_s'], '.2f')} "
               f"| {f(lv['ttft_ms']['p50'], '.0f')} | {f(lv['ttft_ms']['p99'], '.0f')} | {f(lv['tpot_ms']['p50'])} "
               f"| {f(lv['tpot_ms']['p99'])} | {lv['errors']} |")
        if slo:
            a = lv.get("attainment") or {}
            row += (f" {a['attainment']:.0%} ({a['interval'][0]:.0%}-{a['interval'][1]:.0%}) |" if a else " - |")
        rows.append(row)
    lines = [head, *rows]
    goodput = result.get("goodput")
    if goodput:
        lines.append("")
        lines.append("| rate req/s | counted | within SLO | 95% interval | TTFT p99 ms | TPOT p99 ms |")
        lines.append("|---|---|---|---|---|---|")
        lines += [f"| {r['rate']:.3g} | {r['counted']} | {r['attainment']:.0%} | {r['interval'][0]:.0%}-"
                  f"{r['interval'][1]:.0%} | {f(r['ttft_p99_ms'], '.0f')} | {f(r['tpot_p99_ms'])} |"
                  for r in goodput["rates"]]
        lines.append(f"goodput: {goodput['goodput_req_s']:.3g} req/s" if goodput["met"] else f"goodput: none: "
                     f"{goodput['note']}")
    return "\n".join(lines)
