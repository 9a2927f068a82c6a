"""`autotune dashboard`: serves on the loopback, prints the URL, stops cleanly on SIGTERM; a wrong study exits 2."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from view_factory import scripted_study

from autotune.cli import main


@pytest.fixture()
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    return scripted_study(tmp_path, trials=6)


@pytest.mark.slow
def test_dashboard_serves_then_stops_on_sigterm(study, tmp_path):
    _, url, recipes = study
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "dashboard", "--study", "view", "--storage", url,
                             "--port", "0", "--recipes", str(recipes)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        match = re.search(r"open (http://127\.0\.0\.1:\d+)/dashboard", lines[1])
        assert match, lines
        with urllib.request.urlopen(match.group(1) + "/api/studies", timeout=60) as response:
            assert b'"view"' in response.read()
        proc.send_signal(signal.SIGTERM)
        # communicate drains stderr while waiting: a child blocked on a full pipe would never exit.
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "dashboard stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unknown_study_exits_2(study, capsys):
    _, url, _ = study
    assert main(["dashboard", "--study", "nope", "--storage", url, "--port", "0"]) == 2
    assert "no study 'nope'" in capsys.readouterr().err
