"""The request bodies the server accepts, checked field by field: every mistake becomes a 4xx with its reason."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ApiError", "GenerationParams", "Limits", "parse_json", "parse_generate", "parse_completions"]

_MISSING = object()
_MAX_STOPS = 4


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and a reason the client can act on."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


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


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _get(body: dict, name: str, kinds: tuple[type, ...], default: object = _MISSING) -> object:
    if name not in body or (body[name] is None and default is not _MISSING):
        if default is _MISSING:
            raise ApiError(400, f"missing field {name!r}")
        return default
    value = body[name]
    # bool is an int in Python, never in JSON's sense of a number
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join("number" if k is float else k.__name__ for k in kinds)
        raise ApiError(400, f"field {name!r} must be {expected}, not {type(value).__name__}: {value!r}"[:300])
    return value


def _stop(body: dict) -> tuple[str, ...]:
    value = _get(body, "stop", (str, list), None)
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > _MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"field 'stop' must be a non-empty string or a list of at most {_MAX_STOPS} of them")
    return tuple(stops)


def _common(body: dict, prompt: str, max_new_tokens: object, default_temperature: float, limits: Limits,
            encode: Callable[[str], list[int]]) -> dict:
    temperature = float(_get(body, "temperature", (int, float), default_temperature))  # type: ignore[arg-type]
    if not 0.0 <= temperature <= 10.0:
        raise ApiError(400, f"temperature must be between 0 and 10, not {temperature}")
    top_p = float(_get(body, "top_p", (int, float), 1.0))  # type: ignore[arg-type]
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], not {top_p}")
    seed = _get(body, "seed", (int,), None)
    ids = encode(prompt)
    if not ids:
        raise ApiError(400, "the prompt is empty")
    room = limits.max_seq_len - len(ids)
    if room < 1:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this recipe serves at most {limits.max_seq_len} "
                            "tokens in all (prompt + new tokens)")
    assert isinstance(max_new_tokens, int)
    if not 1 <= max_new_tokens <= room:
        raise ApiError(400, f"max_new_tokens must be between 1 and {room} for this {len(ids)}-token prompt "
                            f"(at most {limits.max_seq_len} tokens in all), not {max_new_tokens}")
    return dict(prompt_ids=ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                seed=seed, stop=_stop(body))


_GENERATE_FIELDS = {"prompt", "max_new_tokens", "temperature", "top_p", "seed", "stop"}


def parse_generate(body: dict, limits: Limits, encode: Callable[[str], list[int]]) -> GenerationParams:
    """POST /generate: strict, so that a misspelt field is an error rather than a silent default. Greedy unless
    a temperature is given."""
    unknown = sorted(set(body) - _GENERATE_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown field(s) {unknown}; known: {sorted(_GENERATE_FIELDS)}")
    prompt = _get(body, "prompt", (str,))
    max_new_tokens = _get(body, "max_new_tokens", (int,), 64)
    return GenerationParams(**_common(body, str(prompt), max_new_tokens, 0.0, limits, encode))


def parse_completions(body: dict, limits: Limits, encode: Callable[[str], list[int]]) -> GenerationParams:
    """POST /v1/completions, as OpenAI defines it (max_tokens 16 and temperature 1 by default); fields this
    server does not implement are refused when they would change the answer, ignored otherwise."""
    prompt = _get(body, "prompt", (str, list))
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise ApiError(400, "prompt must be a string (or a list of exactly one string)")
        prompt = prompt[0]
    for name, neutral in (("n", 1), ("best_of", 1), ("echo", False), ("logprobs", None), ("suffix", None)):
        if body.get(name, neutral) not in (neutral, None):
            raise ApiError(400, f"field {name!r} is not supported by this server (only {neutral!r})")
    max_new_tokens = _get(body, "max_tokens", (int,), 16)
    # vLLM's extensions, which load generators use to fix output lengths
    min_tokens = _get(body, "min_tokens", (int,), 0)
    if _get(body, "ignore_eos", (bool,), False):
        min_tokens = max_new_tokens
    assert isinstance(min_tokens, int) and isinstance(max_new_tokens, int)
    if not 0 <= min_tokens <= max_new_tokens:
        raise ApiError(400, f"min_tokens must be between 0 and max_tokens ({max_new_tokens}), not {min_tokens}")
    stream = bool(_get(body, "stream", (bool,), False))
    options = _get(body, "stream_options", (dict,), {})
    include_usage = bool(options.get("include_usage", False)) if isinstance(options, dict) else False
    return GenerationParams(**_common(body, str(prompt), max_new_tokens, 1.0, limits, encode), stream=stream,
                            include_usage=include_usage, min_new_tokens=min_tokens)
