"""Progress lines on stderr, so stdout stays for results; and events for a live display (autotune/cli/live.py)."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["log", "notify", "subscribe", "unsubscribe"]

_START = time.perf_counter()
_LISTENERS: list[Callable[..., None]] = []


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


def subscribe(listener: Callable[..., None]) -> None:
    _LISTENERS.append(listener)


def unsubscribe(listener: Callable[..., None]) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def notify(event: str, **data) -> None:
    """Tell listeners what the search is doing ("trial": one starts; "told": one finished). A listener's error
    never stops a search: a display is not worth a trial."""
    for listener in _LISTENERS:
        try:
            listener(event, **data)
        except Exception:  # noqa: BLE001
            unsubscribe(listener)
