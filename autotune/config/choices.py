"""The check every runtime's knob class runs on its knobs with a fixed set of values (its CHOICES)."""
from __future__ import annotations

__all__ = ["check_choices"]


def check_choices(knobs) -> None:
    """ValueError naming the first knob of `knobs` whose value is not one of its CHOICES."""
    for name, allowed in knobs.CHOICES.items():
        if getattr(knobs, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, not {getattr(knobs, name)!r}")
