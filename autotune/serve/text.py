"""Token ids to text while they stream: each token decoded once (tokenizers' DecodeStream), text emitted only when
it can no longer change, and cut at stop strings."""
from __future__ import annotations

from collections.abc import Callable

from tokenizers.decoders import DecodeStream

__all__ = ["TextStream"]


class _WindowDecoder:
    """DecodeStream's contract for a tokenizer without a Rust backend: decode a window of the last few ids (from
    the token before the last emitted text), so each step costs the window, not the whole stream."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix, self._read = 0, 0  # ids[prefix:read] were decoded already: the context of the next piece

    def step(self, id: int) -> str | None:
        self._ids.append(id)
        decode = self._tokenizer.decode  # type: ignore[attr-defined]
        before = decode(self._ids[self._prefix:self._read], skip_special_tokens=True)
        after = decode(self._ids[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None  # half a UTF-8 sequence, or nothing visible yet
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]


class TextStream:
    """The text of a growing list of output ids. Each id is decoded once (a whole-list decode per token would make
    a stream quadratic in its length); half a UTF-8 sequence waits in the decoder for the ids that complete it, and
    a tail that could still become a stop string is held back until the next tokens decide it."""

    def __init__(self, tokenizer: object, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer behind a fast one
        if backend is not None:
            decoder = DecodeStream(skip_special_tokens=True)
            self._step: Callable[[int], str | None] = lambda id: decoder.step(backend, id)
        else:
            self._step = _WindowDecoder(tokenizer).step
        self._stop = stop
        self._ids: list[int] = []
        self._undecoded = 0  # ids the decoder holds (no text from them yet)
        self._decoded_chars = 0
        self._parts: list[str] = []  # emitted
        self._pending = ""  # decoded, not emitted: it may still be (the start of) a stop string
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything emitted so far (after finish(): the whole text, cut before a stop string)."""
        return "".join(self._parts)

    def add(self, ids: list[int]) -> str:
        """Append new ids; returns the newly final text (empty when nothing is final yet)."""
        if self.stopped:
            return ""
        self._ids.extend(ids)
        for id in ids:
            piece = self._step(id)
            if piece is None:
                self._undecoded += 1
            else:
                self._undecoded = 0
                self._take(piece)
                if self.stopped:
                    break
        return self._emit(final=False)

    def finish(self) -> str:
        """Everything not emitted yet (the request ended): ids the decoder still held (an unfinished UTF-8
        sequence) come out as the tokenizer decodes them, replacement characters included."""
        if self._undecoded and not self.stopped:
            whole = self._tokenizer.decode(self._ids, skip_special_tokens=True)  # type: ignore[attr-defined]
            self._take(whole[self._decoded_chars:])
            self._undecoded = 0
        return self._emit(final=True)

    def _take(self, piece: str) -> None:
        self._decoded_chars += len(piece)
        self._pending += piece
        # Only the pending text can hold a stop string: an emitted character never began one (_hold()).
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self._pending, self.stopped = self._pending[:cut], True

    def _emit(self, final: bool) -> str:
        end = len(self._pending) if final or self.stopped else len(self._pending) - self._hold()
        if end <= 0:
            return ""
        out, self._pending = self._pending[:end], self._pending[end:]
        self._parts.append(out)
        return out

    def _hold(self) -> int:
        """Length of the longest tail of the pending text that is the start of a stop string."""
        tail = self._pending
        return max((k for s in self._stop for k in range(min(len(s) - 1, len(tail)), 0, -1)
                    if tail.endswith(s[:k])), default=0)
