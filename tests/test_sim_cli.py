"""`autotune predict`, `autotune hardware` and a simulated `autotune search`, as a user runs them."""
from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest

from autotune.sim.hardware import list_profiles

PREDICT = ["predict", "--model", "llama-7b", "--hardware", "ascend910", "--set", "quant=w8a16", "batch_size=1",
           "page_size=256", "fusion_level=O2", "layers_per_subgraph=2"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_predict_json():
    out = _cli(*PREDICT, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["source"] == "simulated" and data["feasible"] and data["throughput_tok_s"] > 0
    assert data["config"]["layers_per_subgraph"] == 2


@pytest.mark.slow
def test_predict_text_says_simulated_and_infeasible_exits_1():
    out = _cli(*PREDICT)
    assert out.returncode == 0 and "SIMULATED" in out.stdout
    out = _cli("predict", "--model", "llama-13b", "--hardware", "ascend910", "--set", "batch_size=16",
               "kv_policy=preallocate", "--prompt-tokens", "1024:1024", "--output-tokens", "1024")
    assert out.returncode == 1 and "INFEASIBLE" in out.stdout


@pytest.mark.slow
def test_predict_bad_input_exits_2():
    assert _cli("predict", "--hardware", "tpu-v9").returncode == 2
    assert _cli("predict", "--hardware", "h100", "--set", "quant=fp3").returncode == 2
    assert _cli("predict", "--hardware", "h100", "--set", "fusion_level=O2").returncode == 2
    assert _cli("predict", "--hardware", "h100", "--set", "batch_size").returncode == 2


@pytest.mark.slow
def test_hardware_lists_every_profile():
    out = _cli("hardware")
    assert out.returncode == 0, out.stderr
    for name in list_profiles():
        assert name in out.stdout


@pytest.mark.slow
def test_simulated_search_is_labelled(tmp_path):
    storage = f"sqlite:///{tmp_path}/sim.db"
    out = _cli("search", "--model", "llama-7b", "--backend", "sim", "--hardware", "ascend910", "--trials", "12",
               "--storage", storage, "--out", str(tmp_path / "recipes"), "--seed", "0")
    assert out.returncode == 0, out.stderr[-2000:]
    study = optuna.load_study(study_name="llama-7b-sim-ascend910", storage=storage)
    assert study.user_attrs["measured"] is False and study.user_attrs["source"] == "simulated"
    assert study.user_attrs["gate"]["measured"] is False
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) == 12 and done
    assert all(t.user_attrs["source"] == "simulated" for t in done if "duplicate_of" not in t.user_attrs)
    assert _cli("search", "--backend", "sim", "--trials", "1", "--storage", storage).returncode == 2
