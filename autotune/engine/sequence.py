"""What a request is, what it produces, and the state of one admitted request (a sequence) while it runs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Sampling", "Request", "Completion", "Sequence"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Greedy when temperature is 0. With a seed, the tokens depend on the request alone, not on what else runs."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    min_new_tokens: int = 0
    eos_token_id: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: tuple[int, ...] = ()
    # Teacher forcing through the decode path (the accuracy gate): the emitted tokens are these, and the model's
    # own greedy choice at each step is recorded in Completion.greedy_ids.
    forced_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Completion:
    request: Request
    output_ids: list[int] = field(default_factory=list)
    arrival: float = 0.0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str = ""
    greedy_ids: list[int] = field(default_factory=list)  # with forced_ids only

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


@dataclass(slots=True, eq=False)
class Sequence:
    """An admitted request: its pages in the cache are `seq_id`'s; `length` positions of it are in the cache (the
    prompt's, then one more per decode step); `generator` draws its sampling noise when it has a seed."""

    seq_id: int
    completion: Completion
    length: int = 0
    generator: torch.Generator | None = None

    @property
    def request(self) -> Request:
        return self.completion.request

    @property
    def prompt_len(self) -> int:
        return len(self.completion.request.prompt_ids)

    @property
    def finished(self) -> bool:
        return bool(self.completion.finish_reason)

    def append(self, choice: int, now: float) -> None:
        """Record the token the sampler chose, or with forced_ids the forced one (the choice logged beside it); sets
        the finish reason once the request is done."""
        c, req = self.completion, self.completion.request
        token = choice
        if req.forced_ids:
            c.greedy_ids.append(choice)
            token = req.forced_ids[len(c.output_ids)]
        c.output_ids.append(token)
        c.token_times.append(now)
        produced = len(c.output_ids)
        if produced >= req.max_new_tokens:
            c.finish_reason = "length"
        elif produced >= req.min_new_tokens and (token == req.eos_token_id or token in req.stop_ids):
            c.finish_reason = "stop"
