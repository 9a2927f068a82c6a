"""Token ids to text while they stream: emit only what can no longer change, and cut at stop strings."""
from __future__ import annotations

from collections.abc import Callable

__all__ = ["TextStream"]


class TextStream:
    """Decodes the growing list of output ids. A trailing replacement character (half a UTF-8 sequence) and a
    tail that could still become a stop string are held back until the next token decides them."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]) -> None:
        self._decode, self._stop = decode, stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False
        self.text = ""

    def add(self, ids: list[int]) -> str:
        """Append new ids; returns the newly final text (empty when nothing is final yet)."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        self.text = self._decode(self.ids)
        cut = min((i for i in (self.text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._emit(len(self.text))
        end = len(self.text) - self._hold
        while end > self.emitted and self.text[end - 1] == "\ufffd":
            end -= 1
        return self._emit(end)

    def finish(self) -> str:
        """Everything not emitted yet (the request ended)."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        out, self.emitted = self.text[self.emitted:end], end
        return out
