"""Bad input: one clear line, exit code 2, no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def _one_clear_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("autotune:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.slow
def test_unknown_model_lists_known_ones():
    line = _one_clear_line(_run("search", "--model", "llama-70b-typo"))
    assert "llama-70b-typo" in line and "smollm2-135m" in line and "llama-7b" in line


@pytest.mark.slow
def test_malformed_space_names_file_and_line(tmp_path):
    space = tmp_path / "bad.yaml"
    space.write_text("dimensions:\n  quant:\n    values: [none, int3]\n")
    line = _one_clear_line(_run("search", "--space", str(space), cwd=tmp_path))
    assert f"{space}:3:" in line and "int3" in line
    assert not (tmp_path / "studies").exists()  # refused before a study was made for it


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--trials", "0"], "must be positive"),
    (["--trials", "many"], "not a number"),
    (["--min-agreement", "1.5"], "between 0 and 1"),
    (["--sampler", "magic"], "invalid choice"),
    (["--prompt-tokens", "90:10"], "MIN <= MAX"),
    (["--slo", "ttft=1s"], "expected ttft=DURATION,tpot=DURATION"),
    (["--slo", "ttft=1,tpot=100ms"], "expected ttft=DURATION,tpot=DURATION"),
    (["--slo", "ttft=1s,tpot=100ms", "--attainment", "2"], "between 0 and 1"),
])
def test_invalid_flag_values(args, words):
    assert words in _one_clear_line(_run("search", *args))


@pytest.mark.slow
def test_unreachable_storage(tmp_path):
    line = _one_clear_line(_run("show", "--study", "x", "--storage", "sqlite:////proc/no/such/dir/x.db"))
    assert "cannot open study storage" in line


@pytest.mark.slow
def test_password_never_printed():
    line = _one_clear_line(_run("show", "--study", "x", "--storage", "postgresql://user:s3cret@127.0.0.1:1/db"))
    assert "s3cret" not in line and "***" in line


@pytest.mark.slow
def test_unknown_study_lists_the_ones_there(tmp_path):
    line = _one_clear_line(_run("show", "--study", "nope", "--storage", f"sqlite:///{tmp_path}/s.db"))
    assert "no study 'nope'" in line


@pytest.mark.slow
def test_unknown_backend_says_what_exists():
    line = _one_clear_line(_run("search", "--backend", "tpu"))
    assert "unknown backend 'tpu'" in line and "cpu" in line


@pytest.mark.slow
def test_models_lists_the_registry():
    proc = _run("models")
    assert proc.returncode == 0
    for name in ("smollm2-135m", "llama-7b", "llama-13b", "llama-3-8b", "qwen2-7b"):
        assert name in proc.stdout
