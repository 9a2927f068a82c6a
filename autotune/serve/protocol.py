"""The request bodies the server accepts, as pydantic models checked strictly (no "4" for 4, no true for 1), and
what the engine is asked for: every mistake becomes a 4xx with its reason."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ApiError", "GenerationParams", "Limits", "GenerateRequest", "CompletionRequest", "parse_body",
           "generate_params", "completion_params"]

_MAX_STOPS = 4
_Body = TypeVar("_Body", bound=BaseModel)


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and a reason the client can act on."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


@dataclass(frozen=True, slots=True)
class Limits:
    max_seq_len: int
    max_body_bytes: int = 1 << 20


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


class CompletionRequest(BaseModel):
    """POST /v1/completions, as OpenAI defines it (max_tokens 16 and temperature 1 by default), with vLLM's
    min_tokens and ignore_eos, which load generators use to fix output lengths. Fields this server does not
    implement are refused when they would change the answer (n, best_of, echo, logprobs, suffix), ignored
    otherwise (user, presence_penalty, ...)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    prompt: str | list[str]
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
    best_of: Any = None
    echo: Any = None
    logprobs: Any = None
    suffix: Any = None


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
        return _STOP_RULE
    value = first.get("input")
    return f"field {name!r}: {first['msg'].lower()}, not {type(value).__name__} {value!r}"


_STOP_RULE = f"field 'stop' must be a non-empty string or a list of at most {_MAX_STOPS} of them"


def _stops(value: str | list[str] | None) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > _MAX_STOPS or not all(stops):
        raise ApiError(400, _STOP_RULE)
    return tuple(stops)


def _common(body: GenerateRequest | CompletionRequest, prompt: str, max_new_tokens: int, default_temperature: float,
            limits: Limits, encode: Callable[[str], list[int]]) -> dict:
    temperature = default_temperature if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= 10.0:
        raise ApiError(400, f"temperature must be between 0 and 10, not {temperature}")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], not {top_p}")
    stop = _stops(body.stop)
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
    min_tokens = max_new_tokens if body.ignore_eos else body.min_tokens or 0
    if not 0 <= min_tokens <= max_new_tokens:
        raise ApiError(400, f"min_tokens must be between 0 and max_tokens ({max_new_tokens}), not {min_tokens}")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return GenerationParams(**_common(body, prompt, max_new_tokens, 1.0, limits, encode), stream=bool(body.stream),
                            include_usage=include_usage, min_new_tokens=min_tokens)
