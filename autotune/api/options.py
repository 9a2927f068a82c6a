"""What a search is asked to do, as the caller said it: every option of `autotune.search` (and of `autotune
search`), checked on construction so that a wrong value fails before any storage is opened or model loaded."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config.runtimes import RUNTIMES
from autotune.config.slo import Slo, parse_slo
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.study.settings import SAMPLERS

__all__ = ["SearchOptions"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """The validated arguments of one `autotune.search` call. Their defaults live in that function's signature
    (the one place; the CLI reads them from there), so this has none."""

    model: str
    backend: str
    hardware: str | None
    space: str | Path | tuple[str, ...] | None
    runtimes: tuple[str, ...] | None
    trials: int | None
    minutes: float | None
    patience: int | None
    study: str | None
    storage: str | None
    storage_password_file: str | Path | None
    min_agreement: float
    tie_epsilon: float
    accept_marginal: bool
    memory_budget_mb: float | None
    tpot_slo_ms: float | None
    slo: str | None
    attainment: float
    sampler: str
    guided: bool
    seed: int | None
    out: str | Path
    warm_start: bool
    requests: int
    prompt_tokens: int | tuple[int, int]
    output_tokens: int
    repeats: int
    repeat_time_s: float
    trial_timeout_s: float | None
    trial_memory_mb: float | None
    isolate: bool
    workers: int

    def __post_init__(self) -> None:
        for name in ("model", "backend"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise UserInputError(f"{name} must be a non-empty string, not {getattr(self, name)!r}")
        for name in ("hardware", "study", "storage"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UserInputError(f"{name} must be a non-empty string or None, not {value!r}")
        if self.runtimes is not None and (isinstance(self.runtimes, str) or not self.runtimes or not all(
                isinstance(r, str) and r in RUNTIMES for r in self.runtimes)):
            raise UserInputError(f"runtimes must be None (every runtime this machine can run) or names among "
                                 f"{', '.join(RUNTIMES)}, not {self.runtimes!r}")
        if self.runtimes is not None and self.space is not None:
            raise UserInputError("give runtimes or a space file, not both: a space file names its runtime")
        for name in ("trials", "patience"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise UserInputError(f"{name} must be a positive whole number or None (no count), not {value!r}")
        for name in ("requests", "output_tokens", "repeats", "workers"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise UserInputError(f"{name} must be a positive whole number, not {value!r}")
        for name in ("min_agreement", "tie_epsilon"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise UserInputError(f"{name} must be a fraction between 0 and 1, not {value!r}")
        if not _is_number(self.repeat_time_s) or self.repeat_time_s <= 0:
            raise UserInputError(f"repeat_time_s must be a positive number of seconds, not {self.repeat_time_s!r}")
        for name in ("memory_budget_mb", "tpot_slo_ms", "trial_timeout_s", "trial_memory_mb"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                raise UserInputError(f"{name} must be a positive number or None (no limit), not {value!r}")
        if self.minutes is not None and (not _is_number(self.minutes) or self.minutes < 0):
            raise UserInputError(f"minutes must be 0 or more (0 or None: no time limit), not {self.minutes!r}")
        if self.sampler not in SAMPLERS:
            raise UserInputError(f"unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}")
        if self.seed is not None and not _is_int(self.seed):
            raise UserInputError(f"seed must be a whole number or None, not {self.seed!r}")
        for name in ("guided", "warm_start", "isolate"):
            if not isinstance(getattr(self, name), bool):
                raise UserInputError(f"{name} must be True or False, not {getattr(self, name)!r}")
        self.workload()  # a bad prompt length or count fails here, with the rest
        self.slo_spec()

    @property
    def time_limit_s(self) -> float | None:
        """Seconds of trials, None for no limit (minutes 0 or None)."""
        return self.minutes * 60 if self.minutes else None

    def slo_spec(self) -> Slo | None:
        if self.slo is None:
            return None
        if not isinstance(self.slo, str):
            raise UserInputError(f"slo must be a string such as 'ttft=1s,tpot=100ms' or None, not {self.slo!r}")
        if not _is_number(self.attainment):
            raise UserInputError(f"attainment must be a share of requests in (0, 1], not {self.attainment!r}")
        try:
            return parse_slo(self.slo, float(self.attainment))
        except ValueError as exc:
            raise UserInputError(str(exc)) from None

    def workload(self) -> Workload:
        prompt = self.prompt_tokens
        pair: list[Any] = [prompt, prompt] if _is_int(prompt) else list(prompt) if isinstance(prompt, (tuple, list)) \
            else []
        if len(pair) != 2 or not all(_is_int(p) for p in pair):
            raise UserInputError(f"prompt_tokens must be a token count or a (min, max) pair, not {prompt!r}")
        try:
            return Workload(num_requests=self.requests, prompt_min=int(pair[0]), prompt_max=int(pair[1]),
                            output_tokens=self.output_tokens)
        except ValueError as exc:
            raise UserInputError(f"bad workload: {exc}") from None
