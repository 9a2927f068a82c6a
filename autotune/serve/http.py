"""HTTP endpoints over the scheduler: /generate, /v1/completions (with SSE streaming), /health, /metrics."""
from __future__ import annotations

import json
import queue
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from autotune.engine import Request, Sampling
from autotune.serve.metrics import ServerMetrics
from autotune.serve.protocol import ApiError, GenerationParams, Limits, parse_completions, parse_generate, parse_json
from autotune.serve.scheduler import Handle, Overloaded, Scheduler, ServingStopped
from autotune.serve.text import TextStream

__all__ = ["ServingApp", "ServingServer"]

# A request that has produced nothing for this long is failed (the engine is stuck or far overloaded).
_TOKEN_TIMEOUT_S = 300.0


@dataclass(slots=True)
class ServingApp:
    """What the handlers need: the scheduler, the tokenizer, limits, counters and a description for /health."""

    scheduler: Scheduler
    tokenizer: object
    limits: Limits
    model_name: str
    info: dict
    metrics: ServerMetrics

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]

    def request(self, params: GenerationParams) -> Request:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return Request(params.prompt_ids, params.max_new_tokens, params.min_new_tokens, eos_token_id=eos,
                       sampling=Sampling(params.temperature, params.top_p, params.seed))


class ServingServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many clients connect at once; the scheduler, not the backlog, bounds the work

    def __init__(self, address: tuple[str, int], app: ServingApp) -> None:
        super().__init__(address, _Handler)
        self.app = app


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "autotune"
    timeout = 60  # seconds a client may take to send its request
    server: ServingServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _error(self, endpoint: str, exc: ApiError, headers: dict[str, str] | None = None) -> None:
        self.server.app.metrics.count(endpoint, exc.status)
        self._json(exc.status, {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}, headers)

    def _body(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "chunked bodies are not accepted: send Content-Length")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.close_connection = True
            raise ApiError(411, "Content-Length is required")
        try:
            length = int(length_text)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, f"bad Content-Length {length_text!r}") from None
        limit = self.server.app.limits.max_body_bytes
        if length > limit or length < 0:
            self.close_connection = True  # the body is not read: this connection cannot be reused
            raise ApiError(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
        return parse_json(self.rfile.read(length))

    # -- endpoints --------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        app = self.server.app
        path = self.path.split("?")[0]
        if path == "/health":
            app.metrics.count(path, 200)
            self._json(200, {"status": "ok", **app.info, **app.scheduler.gauges})
        elif path == "/metrics":
            app.metrics.count(path, 200)
            text = app.metrics.render(app.scheduler.gauges, app.scheduler.batch_size, app.scheduler.steps,
                                      app.scheduler.busy_s)
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            app.metrics.count(path, 200)
            self._json(200, {"object": "list", "data": [{"id": app.model_name, "object": "model",
                                                           "owned_by": "autotune"}]})
        else:
            self._error(path, ApiError(404, f"no such endpoint GET {path}", "not_found"))

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        if path not in ("/generate", "/v1/completions"):
            self.close_connection = True
            self._error(path, ApiError(404, f"no such endpoint POST {path}", "not_found"))
            return
        app = self.server.app
        try:
            body = self._body()
            parse = parse_generate if path == "/generate" else parse_completions
            params = parse(body, app.limits, app.encode)
            handle = app.scheduler.submit(app.request(params))
        except ApiError as exc:
            self._error(path, exc)
            return
        except Overloaded as exc:
            self._error(path, ApiError(503, str(exc), "overloaded"), {"Retry-After": "1"})
            return
        except ServingStopped as exc:
            self._error(path, ApiError(503, str(exc), "unavailable"))
            return
        if params.stream:
            self._stream(path, params, handle)
        else:
            self._complete(path, params, handle)

    def _events(self, handle: Handle, stream: TextStream):
        """Yields (new text, finish_reason or None) until the request ends; raises ApiError on engine errors."""
        while True:
            try:
                kind, value = handle.events.get(timeout=_TOKEN_TIMEOUT_S)
            except queue.Empty:
                handle.cancel("timeout")
                raise ApiError(504, f"no token for {_TOKEN_TIMEOUT_S:.0f} s", "timeout") from None
            if kind == "tokens":
                text = stream.add(value)
                if stream.stopped and handle.cancel_reason is None:
                    handle.cancel("stop")
                yield text, None
            elif kind == "done":
                yield stream.finish(), "stop" if stream.stopped else value
                return
            else:
                raise ApiError(500, str(value), "server_error")

    def _complete(self, path: str, params: GenerationParams, handle: Handle) -> None:
        app = self.server.app
        stream = TextStream(app.decode, params.stop)
        try:
            finish = "length"
            for _, reason in self._events(handle, stream):
                finish = reason or finish
        except ApiError as exc:
            self._error(path, exc)
            return
        c = handle.completion
        assert c is not None
        n_out, n_in = len(c.output_ids), len(params.prompt_ids)
        app.metrics.count(path, 200, n_in, n_out)
        if path == "/generate":
            tpot = c.tpot
            self._json(200, {
                "text": stream.text, "token_ids": list(c.output_ids), "prompt_tokens": n_in,
                "completion_tokens": n_out, "finish_reason": finish,
                "timings": {"ttft_ms": c.ttft * 1e3, "tpot_ms": None if tpot is None else tpot * 1e3,
                            "total_ms": (time.perf_counter() - c.arrival) * 1e3}})
            return
        self._json(200, {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": app.model_name,
            "choices": [{"text": stream.text, "index": 0, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})

    def _stream(self, path: str, params: GenerationParams, handle: Handle) -> None:
        app = self.server.app
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        stream = TextStream(app.decode, params.stop)

        def chunk(text: str, finish: str | None) -> bytes:
            payload = {"id": ident, "object": "text_completion", "created": created, "model": app.model_name,
                       "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
            return f"data: {json.dumps(payload)}\n\n".encode()

        # SSE without a length: the end of the stream is the end of the connection.
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for text, finish in self._events(handle, stream):
                # One event per token (even an empty delta), so that clients can time every token.
                self.wfile.write(chunk(text, finish))
                self.wfile.flush()
            c = handle.completion
            assert c is not None
            n_out, n_in = len(c.output_ids), len(params.prompt_ids)
            if params.include_usage:
                usage = {"id": ident, "object": "text_completion", "created": created, "model": app.model_name,
                         "choices": [], "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                                  "total_tokens": n_in + n_out}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            app.metrics.count(path, 200, n_in, n_out)
        except ApiError as exc:
            app.metrics.count(path, exc.status)
            error = {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}
            self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            handle.cancel("cancelled")  # the client left: free its batch row
            app.metrics.count(path, 499)
