"""The terminal progress display: stages from the child's lines, trial k of N, best so far; plain off a terminal."""
from __future__ import annotations

import io
import sys

from autotune.cli.live import LiveDisplay, live_progress, stage_of
from autotune.progress import log, notify


def test_stage_lines_are_recognised():
    assert stage_of("[    3.0s]   build w8a16/O1/bs=4") == "build"
    assert stage_of("[   12.5s]   gate: teacher-forced agreement with the fp32 reference") == "gate"
    assert stage_of("[   20.1s]   benchmark") == "benchmark"
    assert stage_of("some library warning") is None


class _Study:
    best_trials: tuple = ()


def test_display_shows_trial_stage_and_keeps_every_line():
    out = io.StringIO()
    display = LiveDisplay(out, width=200)
    display.on_event("trial", k=2, total=5, number=7, label="w8a16/O1/bs=4")
    display.write("[    3.0s]   gate: teacher-forced agreement\n")
    assert display.stage == "gate"
    assert "trial 2 of 5 (#7)" in display.status()[0] and "stage: gate" in display.status()[0]
    display.on_event("told", study=_Study())
    assert display.done == 1 and "left" in display.status()[0] and display.status()[1] == "no feasible trial yet"
    display.close()
    text = out.getvalue()
    assert "gate: teacher-forced agreement\n" in text and text.endswith("\x1b[J")  # status erased at the end


def test_off_a_terminal_output_stays_plain(capsys):
    with live_progress() as display:
        assert display is None  # pytest's captured stderr is not a terminal
        notify("trial", k=1, total=1, number=0, label="x")
        log("a plain line")
    err = capsys.readouterr().err
    assert "a plain line" in err and "\x1b[" not in err and sys.stderr is not None
