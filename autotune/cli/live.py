"""A live status for `autotune search` on a terminal: trial k of N, elapsed and estimated time, the current trial's
stage, the best so far per objective. The log lines still scroll above it, so nothing is hidden; off a terminal
(CI, a log file) nothing changes: plain lines.

Plain ANSI escapes, no dependency: the status is redrawn below the last line whenever a line is written to stderr
(the child's stage lines arrive there, forwarded by the isolated backend) and once a second for the clock."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from autotune.progress import subscribe, unsubscribe
from autotune.study.loop import best_so_far

__all__ = ["LiveDisplay", "live_progress", "stage_of"]

_PREFIX = re.compile(r"^\[\s*[\d.]+s\]\s*")
_STAGES = (("build", "build"), ("gate", "gate"), ("benchmark", "benchmark"), ("same configuration", "reused"),
           ("->", "recorded"), ("reference", "reference"), ("speed baseline", "speed baseline"))


def stage_of(line: str) -> str | None:
    """The stage a progress line announces ("[  3.0s]   gate: ..." -> "gate"), or None."""
    text = _PREFIX.sub("", line).strip()
    for start, stage in _STAGES:
        if text.startswith(start):
            return stage
    return None


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60:02d}:{seconds % 60:02d}"


class LiveDisplay:
    """Stands in for sys.stderr: writes each line through, then redraws a status block under it."""

    def __init__(self, stream: TextIO, width: int | None = None) -> None:
        self.stream = stream
        self.width = width
        self.lock = threading.RLock()
        self.pending = ""
        self.drawn = 0  # lines of status on screen now
        self.started = time.monotonic()
        self.trial_started: float | None = None
        self.k = self.done = 0
        self.total: int | None = 0
        self.deadline: float | None = None
        self.number: int | None = None
        self.label = ""
        self.stage = "starting"
        self.best = "no feasible trial yet"

    # --- the stream interface that print() and logging use
    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                stage = stage_of(line)
                if stage is not None and self.k:
                    self.stage = stage
                self.write_line(self.stream, line)
            self.stream.flush()
        return len(text)

    def write_line(self, target: TextIO, line: str) -> None:
        """One line above the status, on this stream or another on the same terminal (stdout)."""
        with self.lock:
            self._erase()
            self.stream.flush()
            target.write(line + "\n")
            target.flush()
            self._draw()

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name: str):  # fileno, encoding, ...: the real stream's
        return getattr(self.stream, name)

    # --- events from the search (autotune.progress.notify)
    def on_event(self, event: str, **data) -> None:
        with self.lock:
            if event == "trial":
                self.k, self.total, self.number, self.label = data["k"], data["total"], data["number"], data["label"]
                self.deadline = data.get("deadline")
                self.stage, self.trial_started = "build", time.monotonic()
            elif event == "told":
                self.done += 1
                self.stage = "recorded"
                self.best = self._best(data["study"])
            self._erase()
            self._draw()
            self.stream.flush()

    @staticmethod
    def _best(study) -> str:
        return best_so_far(study, sep=" | ")

    def status(self) -> list[str]:
        now = time.monotonic()
        elapsed = now - self.started
        if not self.k:
            return [f"autotune search: preparing ({_clock(elapsed)} elapsed)"]
        eta = ""
        if self.deadline is not None:
            eta = f", {_clock(max(self.deadline - time.time(), 0.0))} of the time budget left"
        elif self.done and self.total:
            left = elapsed / self.done * (self.total - self.done)
            eta = f", about {_clock(left)} left"
        in_trial = _clock(now - self.trial_started) if self.trial_started else "-"
        of = f" of {self.total}" if self.total else ""
        head = (f"trial {self.k}{of} (#{self.number}) | {_clock(elapsed)} elapsed{eta} | "
                f"stage: {self.stage} ({in_trial}) | {self.label}")
        return [head, self.best]

    def tick(self) -> None:
        with self.lock:
            self._erase()
            self._draw()
            self.stream.flush()

    def _erase(self) -> None:
        if self.drawn:
            # To the start of the first status line, then clear to the end of the screen.
            self.stream.write("\r" + (f"\x1b[{self.drawn - 1}A" if self.drawn > 1 else "") + "\x1b[J")
            self.drawn = 0

    def _draw(self) -> None:
        width = self.width or shutil.get_terminal_size((100, 20)).columns
        # Never wider than the terminal: a wrapped line would break the cursor arithmetic of _erase.
        lines = [line[: max(width - 1, 10)] for line in self.status()]
        self.stream.write("\x1b[7m" + lines[0] + "\x1b[0m" + "".join("\n" + line for line in lines[1:]))
        self.drawn = len(lines)

    def close(self) -> None:
        with self.lock:
            self._erase()
            if self.pending:
                self.stream.write(self.pending + "\n")
                self.pending = ""
            self.stream.flush()


class _Above:
    """stdout on the same terminal: its lines go above the status too, or the status would be drawn over them."""

    def __init__(self, display: LiveDisplay, stream: TextIO) -> None:
        self.display, self.stream, self.pending = display, stream, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.display.write_line(self.stream, line)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def live_progress(stream: TextIO | None = None) -> Iterator[LiveDisplay | None]:
    """A live display while the block runs, when stderr is a terminal (AUTOTUNE_PLAIN=1 or TERM=dumb: plain)."""
    real = stream or sys.stderr
    plain = (not real.isatty() or os.environ.get("TERM") == "dumb" or os.environ.get("AUTOTUNE_PLAIN")
             or os.environ.get("CI"))
    if plain:
        yield None
        return
    display = LiveDisplay(real)
    stop = threading.Event()

    def ticker() -> None:
        while not stop.wait(1.0):
            display.tick()

    thread = threading.Thread(target=ticker, name="autotune-live", daemon=True)
    subscribe(display.on_event)
    previous, sys.stderr = sys.stderr, display  # type: ignore[assignment]
    previous_out = sys.stdout
    above = _Above(display, previous_out) if stream is None and previous_out.isatty() else None
    if above is not None:
        sys.stdout = above  # type: ignore[assignment]
    thread.start()
    try:
        yield display
    finally:
        stop.set()
        thread.join(timeout=2)
        unsubscribe(display.on_event)
        display.close()
        sys.stderr, sys.stdout = previous, previous_out
        if above is not None and above.pending:
            previous_out.write(above.pending)
