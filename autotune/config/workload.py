"""A benchmark workload as data: how many requests, their prompt and output lengths, how they arrive."""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Workload"]


@dataclass(frozen=True, slots=True)
class Workload:
    """Offline arrival: every request is there at the start (the throughput case). Prompts are real text
    of a length drawn uniformly from [prompt_min, prompt_max]; every request produces exactly output_tokens
    (end-of-sequence is ignored, as SmolLM2's greedy output would otherwise end or loop at random lengths)."""

    num_requests: int = 16
    prompt_min: int = 112
    prompt_max: int = 144
    output_tokens: int = 64
    arrival: str = "offline"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.output_tokens < 1:
            raise ValueError("a workload needs at least one request and one output token")
        if not 1 <= self.prompt_min <= self.prompt_max:
            raise ValueError(f"prompt lengths need 1 <= prompt_min <= prompt_max, not {self.prompt_min}..{self.prompt_max}")
        if self.arrival != "offline":
            raise ValueError("only offline arrival is implemented so far")

    @property
    def max_seq_len(self) -> int:
        return self.prompt_max + self.output_tokens

    def to_dict(self) -> dict:
        return asdict(self)
