"""A benchmark workload as data: how many requests, their prompt and output lengths, how they arrive."""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Workload", "ARRIVALS"]

ARRIVALS = ("offline", "poisson")


@dataclass(frozen=True, slots=True)
class Workload:
    """Offline arrival (the default, the throughput case): every request is there at the start. Poisson arrival:
    requests come at `rate` per second, the gaps between them drawn from a gamma distribution of shape
    `burstiness` and mean 1/rate (1: a Poisson process; below 1 burstier, above 1 more regular; vLLM's
    `--burstiness`), seeded by `seed` (config/arrival.py).

    Prompts are real text of a length drawn uniformly from [prompt_min, prompt_max]. Every request produces
    exactly its output length (end-of-sequence is ignored, as SmolLM2's greedy output would otherwise end or loop at
    random lengths): `output_tokens`, or, with `output_min`, a length drawn uniformly from [output_min,
    output_tokens]."""

    num_requests: int = 16
    prompt_min: int = 112
    prompt_max: int = 144
    output_tokens: int = 64
    arrival: str = "offline"
    seed: int = 0
    rate: float | None = None
    burstiness: float = 1.0
    output_min: int | None = None

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.output_tokens < 1:
            raise ValueError("a workload needs at least one request and one output token")
        if not 1 <= self.prompt_min <= self.prompt_max:
            raise ValueError(f"prompt lengths need 1 <= prompt_min <= prompt_max, not "
                             f"{self.prompt_min}..{self.prompt_max}")
        if self.output_min is not None and not 1 <= self.output_min <= self.output_tokens:
            raise ValueError(f"output lengths need 1 <= output_min <= output_tokens, not "
                             f"{self.output_min}..{self.output_tokens}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival {self.arrival!r}: one of {', '.join(ARRIVALS)}")
        if self.arrival == "poisson" and not (self.rate and self.rate > 0):
            raise ValueError("poisson arrival needs a rate in requests per second above 0")
        if self.arrival == "offline" and self.rate is not None:
            raise ValueError("offline arrival has no rate: every request is there at the start")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness is a gamma shape above 0 (1: Poisson), not {self.burstiness}")

    @property
    def max_seq_len(self) -> int:
        return self.prompt_max + self.output_tokens

    @property
    def mean_output_tokens(self) -> float:
        return self.output_tokens if self.output_min is None else (self.output_min + self.output_tokens) / 2

    def to_dict(self) -> dict:
        """Its fields; those of arrival at their defaults left out, so that an offline workload's dict (what every
        stored trial and recipe holds) is what it was before workloads could arrive."""
        out = asdict(self)
        for key, default in (("rate", None), ("burstiness", 1.0), ("output_min", None)):
            if out[key] == default:
                del out[key]
        return out
