"""The request bodies the server accepts, as pydantic models checked strictly (no "4" for 4, no true for 1), and
what the engine is asked for: every mistake becomes a 4xx with its reason."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ApiError", "GenerationParams", "Limits", "prompt_bytes_for", "GenerateRequest", "CompletionRequest",
           "ChatRequest", "parse_body", "generate_params", "completion_params", "chat_params", "check_prompt_bytes"]

_Body = TypeVar("_Body", bound=BaseModel)


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and a reason the client can act on."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers
        self.reason = reason  # the refusal's label in /metrics (autotune:requests_refused), where it has one


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask. `max_prompt_bytes` bounds the prompt before it is tokenized: a prompt that fits
    `max_seq_len` tokens is at most that many times the longest token's bytes (`prompt_bytes_for`). Stop strings
    are bounded in number and length: holding back a tail that may begin one costs the square of its length per
    token (serve/text.py)."""

    max_seq_len: int
    max_body_bytes: int = 1 << 20
    max_prompt_bytes: int = 1 << 20
    max_stops: int = 4
    max_stop_chars: int = 64


def prompt_bytes_for(tokenizer: object, max_seq_len: int) -> int:
    """The most bytes a prompt of `max_seq_len` tokens can have: tokens times the longest token's UTF-8 bytes (a
    byte-level token's characters, a sentencepiece piece's, or an added token's text, are never fewer bytes than
    the text the token stands for), times 4, the most bytes of a character, which a normalizer may fold into one."""
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    longest = max((len(token.encode()) for token in vocab), default=1)
    return max_seq_len * max(longest, 1) * 4


@dataclass(frozen=True, slots=True)
class GenerationParams:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool = False
    include_usage: bool = False
    min_new_tokens: int = 0


class GenerateRequest(BaseModel):
    """POST /generate: strict, so that a misspelt field is an error rather than a silent default. Greedy unless a
    temperature is given. A null field takes its default."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str
    max_new_tokens: int | None = None  # 64
    temperature: float | None = None  # 0: greedy
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool | None = None


class _OpenAIRequest(BaseModel):
    """What OpenAI's completion and chat completion bodies share (max_tokens 16 and temperature 1 by default), with
    vLLM's min_tokens and ignore_eos, which load generators use to fix output lengths. Fields this server does not
    implement are refused when they would change the answer, ignored otherwise (user, presence_penalty, ...)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = None  # 16
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None  # 1
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Any = None
    logprobs: Any = None


class CompletionRequest(_OpenAIRequest):
    """POST /v1/completions, as OpenAI defines it; refused where they would change the answer: n, best_of, echo,
    logprobs, suffix."""

    prompt: str | list[str]
    best_of: Any = None
    echo: Any = None
    suffix: Any = None


class ChatMessage(BaseModel):
    """One message; its content a string or OpenAI's list of parts, of which only text parts are taken."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
            raise ApiError(400, "message content parts must be of type 'text' with a string 'text' (this server "
                                "serves a text model)")
        return "".join(part["text"] for part in self.content)


class ChatRequest(_OpenAIRequest):
    """POST /v1/chat/completions, as OpenAI defines it: the messages are rendered with the tokenizer's chat template
    (the assistant's turn opened), max_completion_tokens (or the older max_tokens) bounds the answer. Refused where
    they would change the answer: n, logprobs, top_logprobs, tools, tool_choice, a non-text response_format."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None


def parse_body(model: type[_Body], raw: bytes) -> _Body:
    """`raw` as `model`, or the ApiError (400) that says what is wrong with it."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ApiError(400, _explain(exc, model)[:300]) from None


def _explain(exc: ValidationError, model: type[BaseModel]) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind, loc = first["type"], first["loc"]
    if kind == "json_invalid":
        return f"malformed JSON body: {first['msg'].removeprefix('Invalid JSON: ')}"
    if kind == "model_type" and not loc:
        return "the body must be a JSON object"
    if kind == "extra_forbidden":
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        return f"unknown field(s) {unknown}; known: {sorted(model.model_fields)}"
    name = str(loc[0]) if loc else "body"
    if kind == "missing":
        return f"missing field {name!r}"
    if name == "stop":
        return _STOP_RULE.format(max_stops=Limits.max_stops, max_stop_chars=Limits.max_stop_chars)
    value = first.get("input")
    if name == "messages" and len(loc) > 2:  # a field of one message: say which
        name = f"messages[{loc[1]}].{loc[2]}"
    return f"field {name!r}: {first['msg'].lower()}, not {type(value).__name__} {value!r}"


_STOP_RULE = ("field 'stop' must be a non-empty string or a list of at most {max_stops} of them, each of at most "
              "{max_stop_chars} characters")


def _stops(value: str | list[str] | None, limits: Limits) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > limits.max_stops or not all(stops) or any(len(s) > limits.max_stop_chars for s in stops):
        raise ApiError(400, _STOP_RULE.format(max_stops=limits.max_stops, max_stop_chars=limits.max_stop_chars),
                       reason="stop_strings")
    return tuple(stops)


def check_prompt_bytes(prompt: str, limits: Limits) -> None:
    """Refuse a prompt too long to fit before it is tokenized (tokenizing a megabyte takes the CPU for long)."""
    size = len(prompt.encode("utf-8", "surrogatepass"))
    if size > limits.max_prompt_bytes:
        raise ApiError(400, f"the prompt has {size} bytes; no prompt over {limits.max_prompt_bytes} bytes fits the "
                            f"{limits.max_seq_len} tokens this recipe serves", reason="prompt_bytes")


def _common(body: GenerateRequest | CompletionRequest | ChatRequest, prompt: str, max_new_tokens: int,
            default_temperature: float, limits: Limits, encode: Callable[[str], list[int]]) -> dict:
    temperature = default_temperature if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= 10.0:
        raise ApiError(400, f"temperature must be between 0 and 10, not {temperature}")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], not {top_p}")
    stop = _stops(body.stop, limits)
    check_prompt_bytes(prompt, limits)
    ids = encode(prompt)
    if not ids:
        raise ApiError(400, "the prompt is empty")
    room = limits.max_seq_len - len(ids)
    if room < 1:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this recipe serves at most {limits.max_seq_len} "
                            "tokens in all (prompt + new tokens)")
    if not 1 <= max_new_tokens <= room:
        raise ApiError(400, f"max_new_tokens must be between 1 and {room} for this {len(ids)}-token prompt "
                            f"(at most {limits.max_seq_len} tokens in all), not {max_new_tokens}")
    return dict(prompt_ids=ids, max_new_tokens=max_new_tokens, temperature=float(temperature), top_p=float(top_p),
                seed=body.seed, stop=stop)


def generate_params(body: GenerateRequest, limits: Limits, encode: Callable[[str], list[int]]) -> GenerationParams:
    max_new_tokens = 64 if body.max_new_tokens is None else body.max_new_tokens
    return GenerationParams(**_common(body, body.prompt, max_new_tokens, 0.0, limits, encode))


def completion_params(body: CompletionRequest, limits: Limits,
                      encode: Callable[[str], list[int]]) -> GenerationParams:
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(400, "prompt must be a string (or a list of exactly one string)")
        prompt = prompt[0]
    for name, neutral in (("n", 1), ("best_of", 1), ("echo", False), ("logprobs", None), ("suffix", None)):
        if getattr(body, name) not in (neutral, None):
            raise ApiError(400, f"field {name!r} is not supported by this server (only {neutral!r})")
    max_new_tokens = 16 if body.max_tokens is None else body.max_tokens
    return _openai(body, prompt, max_new_tokens, limits, encode)


def _openai(body: CompletionRequest | ChatRequest, prompt: str, max_new_tokens: int, limits: Limits,
            encode: Callable[[str], list[int]]) -> GenerationParams:
    min_tokens = max_new_tokens if body.ignore_eos else body.min_tokens or 0
    if not 0 <= min_tokens <= max_new_tokens:
        raise ApiError(400, f"min_tokens must be between 0 and max_tokens ({max_new_tokens}), not {min_tokens}")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return GenerationParams(**_common(body, prompt, max_new_tokens, 1.0, limits, encode), stream=bool(body.stream),
                            include_usage=include_usage, min_new_tokens=min_tokens)


def chat_params(body: ChatRequest, limits: Limits, encode: Callable[[str], list[int]],
                render: Callable[[list[dict[str, str]]], str]) -> GenerationParams:
    """`render`: the messages as the model's prompt (its chat template, the assistant's turn opened)."""
    if not body.messages:
        raise ApiError(400, "messages must hold at least one message")
    for name in ("n", "logprobs", "top_logprobs", "tools", "tool_choice"):
        if getattr(body, name) not in (None, 1, False, []):
            raise ApiError(400, f"field {name!r} is not supported by this server")
    if body.response_format not in (None, {"type": "text"}):
        raise ApiError(400, "only response_format {'type': 'text'} is supported by this server")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    # The template only adds to the messages: too many bytes in them is too many in the prompt, refused unrendered.
    check_prompt_bytes("".join(m["content"] for m in messages), limits)
    chosen = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _openai(body, render(messages), 16 if chosen is None else chosen, limits, encode)
