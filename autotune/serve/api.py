"""The HTTP endpoints (FastAPI) over the engine loop: /generate, /v1/completions and /v1/chat/completions (with
SSE streaming), /v1/models, /health, /metrics; behind the guard (serve/guard.py: Host, key, Content-Type, body).

Handlers run on the server's event loop and never block it: a body is parsed and its prompt tokenized on a
thread of their own (one: tokenizing takes the CPU the engine steps on), and a request's tokens come from the
engine thread through `loop.call_soon_threadsafe` onto an asyncio queue of the request's own."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autotune.engine import Request as EngineRequest
from autotune.engine import Sampling
from autotune.serve.engine_loop import EngineLoop, Event, Handle, Overloaded, ServingStopped
from autotune.serve.guard import OUTCOME, Access, Guard, allowed_hosts
from autotune.serve.metrics import ServerMetrics
from autotune.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    GenerateRequest,
    GenerationParams,
    Limits,
    chat_params,
    completion_params,
    generate_params,
    parse_body,
)
from autotune.serve.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    Choice,
    CompletionChunk,
    CompletionResponse,
    ErrorResponse,
    GenerateResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    Timings,
    Usage,
)
from autotune.serve.text import TextStream

__all__ = ["ServingApp", "create_app"]

# A request that has produced nothing for this long is failed (the engine is stuck or far overloaded).
_TOKEN_TIMEOUT_S = 300.0
# Where a handler leaves the status a finished stream really had (its 200 was sent before it failed).
_OUTCOME = OUTCOME
# What a response is shaped as: /generate's own, OpenAI's completion, OpenAI's chat completion.
Shape = Literal["generate", "completion", "chat"]


@dataclass(slots=True)
class ServingApp:
    """What the handlers need: the engine loop, the tokenizer, limits, metrics and a description for /health."""

    engine_loop: EngineLoop
    tokenizer: object
    limits: Limits
    model_name: str
    info: dict
    metrics: ServerMetrics
    parser: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="autotune-parse"))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The messages as the prompt of the model's chat template, the assistant's turn opened (as
        transformers' apply_chat_template renders them; its special tokens are text, which encode() maps)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, f"the tokenizer of {self.model_name} has no chat template: use /v1/completions "
                                "with a prompt of your own")
        try:
            return self.tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001  jinja's errors, raise_exception() of the template itself
            raise ApiError(400, f"the chat template refused these messages: {str(exc)[:200]}") from None

    def request(self, params: GenerationParams) -> EngineRequest:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return EngineRequest(params.prompt_ids, params.max_new_tokens, params.min_new_tokens, eos_token_id=eos,
                             sampling=Sampling(params.temperature, params.top_p, params.seed))


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(ErrorResponse.of(exc.status, exc.message, exc.kind).model_dump(), exc.status, exc.headers)


class _Accounting:
    """Counts every request by endpoint and final status (ASGI middleware: it sees 404s and 405s too)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome = scope[_OUTCOME] = {"code": 500}
        counted = False

        async def sending(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start":
                outcome["code"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Before the last bytes go out: a client that reads /metrics next sees its request counted.
                counted = True
                self.metrics.count(scope["path"], outcome["code"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not counted:  # no complete response: the client left, or the app failed
                self.metrics.count(scope["path"], outcome["code"])


class _EventStream(StreamingResponse):
    """Closes its events when the response ends however it ends, so that a client that left has its request
    cancelled (and counted) at once, not when the generator is collected."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def _schema(model: type[BaseModel]) -> dict:
    # The handlers read and check their bodies themselves (limits first, then the model): say so in the OpenAPI.
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def create_app(serving: ServingApp, access: Access | None = None, hosts: frozenset[str] | None = None) -> FastAPI:
    """The FastAPI application of one served recipe, answering under `hosts` (default: the local names)."""
    # No /docs: its page loads scripts from a CDN. A trailing slash is another path (404), not a redirect.
    app = FastAPI(title="autotune serve", docs_url=None, redoc_url=None, redirect_slashes=False)
    access = access or Access()
    # The last added runs first: accounting sees every answer, the guard's refusals included.
    app.add_middleware(Guard, hosts=hosts or allowed_hosts("127.0.0.1", access.allowed_hosts), access=access,
                       max_body_bytes=serving.limits.max_body_bytes, refused=serving.metrics.refuse,
                       body_paths=("/generate", "/v1/completions", "/v1/chat/completions"))
    app.add_middleware(_Accounting, metrics=serving.metrics)
    engine_loop = serving.engine_loop

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            message = f"no such endpoint {request.method} {request.url.path}"[:300]
            kind = "not_found" if exc.status_code == 404 else "method_not_allowed"
        else:
            message, kind = str(exc.detail), "invalid_request_error"
        return _error(ApiError(exc.status_code, message, kind, dict(exc.headers or {})))

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        return HealthResponse.model_validate({**serving.info, **engine_loop.gauges})

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=serving.model_name)])

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        body, content_type = serving.metrics.render(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    @app.post("/generate", response_model=GenerateResponse, responses={400: {"model": ErrorResponse}},
              openapi_extra=_schema(GenerateRequest))
    async def generate(request: Request) -> Response | BaseModel:
        return await _serve(request, "generate", lambda raw: generate_params(parse_body(GenerateRequest, raw),
                                                                             serving.limits, serving.encode))

    @app.post("/v1/completions", response_model=CompletionResponse, responses={400: {"model": ErrorResponse}},
              openapi_extra=_schema(CompletionRequest))
    async def completions(request: Request) -> Response | BaseModel:
        return await _serve(request, "completion", lambda raw: completion_params(
            parse_body(CompletionRequest, raw), serving.limits, serving.encode))

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses={400: {"model": ErrorResponse}}, openapi_extra=_schema(ChatRequest))
    async def chat_completions(request: Request) -> Response | BaseModel:
        return await _serve(request, "chat", lambda raw: chat_params(
            parse_body(ChatRequest, raw), serving.limits, serving.encode, serving.render_chat))

    async def _serve(request: Request, shape: Shape, parse: Callable[[bytes], GenerationParams]
                     ) -> Response | BaseModel:
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        try:
            # The guard has read the body whole; parsing and tokenizing it would hold the event loop.
            params = await loop.run_in_executor(serving.parser, parse, await request.body())
            # Events are put on the queue on this loop's thread, all of an engine step's in one wake-up.
            handle = engine_loop.submit(serving.request(params), events.put_nowait, post=loop.call_soon_threadsafe)
        except ApiError as exc:
            if exc.reason:
                serving.metrics.refuse(exc.reason)
            return _error(exc)
        except Overloaded as exc:
            serving.metrics.refuse("overloaded")
            return _error(ApiError(503, str(exc), "overloaded", {"Retry-After": "1"}))
        except ServingStopped as exc:
            return _error(ApiError(503, str(exc), "unavailable"))
        run = _Run(serving, params, handle, events, shape)
        if params.stream:
            return _EventStream(run.sse(request.scope[_OUTCOME]),
                                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            return await run.complete()
        except ApiError as exc:
            return _error(exc)

    return app


class _Run:
    """One admitted request: its events turned into text, then into a response or a stream of events."""

    def __init__(self, serving: ServingApp, params: GenerationParams, handle: Handle,
                 events: asyncio.Queue[Event], shape: Shape = "completion") -> None:
        self.serving, self.params, self.handle, self.events, self.shape = serving, params, handle, events, shape
        self.text = TextStream(serving.tokenizer, params.stop)
        prefix = "chatcmpl" if shape == "chat" else "cmpl"
        self.ident, self.created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())

    async def _next(self) -> Event:
        if not self.events.empty():  # the common case under load: no wait, no timer
            return self.events.get_nowait()
        try:
            return await asyncio.wait_for(self.events.get(), _TOKEN_TIMEOUT_S)
        except TimeoutError:
            self.handle.cancel("timeout")
            raise ApiError(504, f"no token for {_TOKEN_TIMEOUT_S:.0f} s", "timeout") from None

    async def deltas(self) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish_reason or None) until the request ends; raises ApiError on engine errors."""
        while True:
            kind, value = await self._next()
            if kind == "tokens":
                delta = self.text.add(value)  # type: ignore[arg-type]
                if self.text.stopped and self.handle.cancel_reason is None:
                    self.handle.cancel("stop")
                yield delta, None
            elif kind == "done":
                yield self.text.finish(), "stop" if self.text.stopped else str(value)
                return
            else:
                raise ApiError(500, str(value), "server_error")

    async def complete(self) -> GenerateResponse | CompletionResponse | ChatCompletionResponse:
        finish = "length"
        try:
            async for _, reason in self.deltas():
                finish = reason or finish
        finally:
            if self.handle.completion is None or not self.handle.completion.finish_reason:
                self.handle.cancel("cancelled")  # the handler was cancelled (shutdown): free the batch row
        c = self.handle.completion
        assert c is not None
        self.serving.metrics.answered(c, finish)
        n_in, n_out = len(self.params.prompt_ids), len(c.output_ids)
        usage = Usage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)
        if self.shape == "chat":
            return ChatCompletionResponse(id=self.ident, created=self.created, model=self.serving.model_name,
                                          choices=[ChatChoice(message=AssistantMessage(content=self.text.text),
                                                              finish_reason=finish)], usage=usage)
        if self.shape == "generate":
            tpot = c.tpot
            return GenerateResponse(text=self.text.text, token_ids=list(c.output_ids), prompt_tokens=n_in,
                                    completion_tokens=n_out, finish_reason=finish,
                                    timings=Timings(ttft_ms=c.ttft * 1e3, tpot_ms=None if tpot is None else tpot * 1e3,
                                                    total_ms=(time.perf_counter() - c.arrival) * 1e3))
        return CompletionResponse(id=self.ident, created=self.created, model=self.serving.model_name,
                                  choices=[Choice(text=self.text.text, finish_reason=finish)], usage=usage)

    def _event(self, chunk: BaseModel) -> bytes:
        return b"data: " + chunk.model_dump_json().encode() + b"\n\n"

    def _chunk(self, delta: str | None, finish: str | None, first: bool = False,
               usage: Usage | None = None) -> BaseModel:
        """One event of the stream in the request's shape; `delta` None: the usage event, with no choice."""
        head = dict(id=self.ident, created=self.created, model=self.serving.model_name, usage=usage)
        if self.shape == "chat":
            choices = [] if delta is None else [ChatChunkChoice(
                delta=ChatDelta(role="assistant" if first else None, content=delta), finish_reason=finish)]
            return ChatCompletionChunk(**head, choices=choices)
        return CompletionChunk(**head, choices=[] if delta is None else [Choice(text=delta, finish_reason=finish)])

    async def sse(self, outcome: dict) -> AsyncIterator[bytes]:
        """Server-sent events, one per token (even an empty delta, so that clients can time every token), then the
        usage if asked, then [DONE]. An error after the 200 is an event of its own, and the status counted."""
        ended, first = False, True
        try:
            async for delta, finish in self.deltas():
                yield self._event(self._chunk(delta, finish, first))
                first = False
            c = self.handle.completion
            assert c is not None
            n_in, n_out = len(self.params.prompt_ids), len(c.output_ids)
            if self.params.include_usage:
                yield self._event(self._chunk(None, None, usage=Usage(prompt_tokens=n_in, completion_tokens=n_out,
                                                                      total_tokens=n_in + n_out)))
            yield b"data: [DONE]\n\n"
            ended = True
            self.serving.metrics.answered(c, finish or "length")
        except ApiError as exc:
            ended = True
            outcome["code"] = exc.status
            yield self._event(ErrorResponse.of(exc.status, exc.message, exc.kind))
        finally:
            if not ended:  # the client left (or the server stops): free its batch row
                self.handle.cancel("cancelled")
                outcome["code"] = 499
