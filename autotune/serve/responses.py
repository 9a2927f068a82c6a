"""What the endpoints answer, as pydantic models (they are also the OpenAPI schema at /openapi.json)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = ["ErrorResponse", "GenerateResponse", "Timings", "CompletionResponse", "CompletionChunk", "Choice",
           "Usage", "ModelList", "ModelCard", "HealthResponse", "ChatCompletionResponse", "ChatCompletionChunk",
           "ChatChoice", "ChatChunkChoice", "AssistantMessage", "ChatDelta"]


class ErrorInfo(BaseModel):
    message: str
    type: str
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo

    @classmethod
    def of(cls, status: int, message: str, kind: str) -> ErrorResponse:
        return cls(error=ErrorInfo(message=message, type=kind, code=status))


class Timings(BaseModel):
    ttft_ms: float
    tpot_ms: float | None  # None with one token
    total_ms: float


class GenerateResponse(BaseModel):
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    timings: Timings


class Choice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: str | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed completion: one token's text (possibly empty, held back), or with no
    choice and the usage as the last event when stream_options.include_usage asks for it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class CompletionResponse(CompletionChunk):
    usage: Usage | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """The first event's delta names the role; each later one carries the new text."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "autotune"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthResponse(BaseModel):
    """The served recipe, and the engine loop's gauges when asked."""

    status: Literal["ok"] = "ok"
    model: str
    recipe: str | None
    configuration: dict
    batch_size: int
    max_seq_len: int
    recipe_verified: bool
    metrics_source: str
    backend: str
    draft: bool
    goodput: dict | None = None  # the recipe's, where its study ran under latency objectives (`slo`, req/s, tok/s)
    queue_depth: int
    running: int
    kv_pages_in_use: int
    kv_pages_total: int
