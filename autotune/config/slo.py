"""Latency objectives: a request meets its SLO when its time to first token and its time per output token are both
within their limits; a rate is served when at least `attainment` of its requests meet it (DistServe, OSDI'24:
goodput is the highest such rate; vLLM's `bench serve --goodput` counts a request the same way)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["Slo", "parse_slo", "SLO_FORM"]

SLO_FORM = "ttft=DURATION,tpot=DURATION (e.g. ttft=1s,tpot=100ms; units s or ms)"
_PART = re.compile(r"^\s*(ttft|tpot)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*$", re.I)


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float
    tpot_ms: float
    attainment: float = 0.9

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.tpot_ms > 0):
            raise ValueError(f"SLO limits must be above 0, not TTFT {self.ttft_ms} ms, TPOT {self.tpot_ms} ms")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment is a share of requests in (0, 1], not {self.attainment}")

    def met(self, ttft_ms: float | None, tpot_ms: float | None) -> bool:
        """Both within their limits. A request with one output token has no TPOT: its TTFT decides; a request
        that failed or never produced a token (None) misses."""
        return ttft_ms is not None and ttft_ms <= self.ttft_ms and (tpot_ms is None or tpot_ms <= self.tpot_ms)

    def label(self) -> str:
        return f"TTFT <= {self.ttft_ms:g} ms, TPOT <= {self.tpot_ms:g} ms, {self.attainment:.0%} of requests"

    def to_dict(self) -> dict:
        return asdict(self)


def parse_slo(text: str, attainment: float = 0.9) -> Slo:
    """`ttft=1s,tpot=100ms` (either order, both needed). Raises ValueError naming the expected form."""
    limits: dict[str, float] = {}
    for part in text.split(","):
        m = _PART.match(part)
        if not m:
            raise ValueError(f"cannot read SLO {text!r}: expected {SLO_FORM}")
        name, value, unit = m.group(1).lower(), float(m.group(2)), m.group(3).lower()
        if name in limits:
            raise ValueError(f"SLO {text!r} gives {name} twice: expected {SLO_FORM}")
        limits[name] = value * (1000.0 if unit == "s" else 1.0)
    if set(limits) != {"ttft", "tpot"}:
        raise ValueError(f"SLO {text!r} needs both ttft and tpot: expected {SLO_FORM}")
    return Slo(limits["ttft"], limits["tpot"], attainment)
