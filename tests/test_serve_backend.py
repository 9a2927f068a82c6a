"""`autotune serve` builds on the backend the recipe names: a recipe for a backend this machine lacks is refused in
one line; a simulated recipe only with --draft, which says where it runs and that its figures do not apply; a
device_power that is not a thread count there never becomes one."""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from recipe_factory import Served, bench, config, make_study, tiny_recipe

import autotune.recipes.target
from autotune.backends.sim import GATE_NOT_MEASURED
from autotune.cli import main
from autotune.errors import UserInputError
from autotune.recipes.recipe import load_recipe, recipe_checksum
from autotune.recipes.target import backend_missing
from autotune.results.export import write_recipes
from autotune.serve import build_server


def _with_backend(path, backend: str):
    data = yaml.safe_load(path.read_text())
    data["backend"] = backend
    data["checksum"] = recipe_checksum(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_recipe_for_an_absent_backend_is_refused_in_one_line(tmp_path, decided_model_folder, capsys):
    if backend_missing("npu") is None:
        pytest.skip("this machine has an NPU")
    path = _with_backend(tiny_recipe(tmp_path, decided_model_folder, batch_size=2), "npu")
    with pytest.raises(UserInputError) as err:
        build_server(load_recipe(path), "127.0.0.1", 0)
    message = str(err.value)
    assert "\n" not in message and "npu" in message and "lacks" in message
    capsys.readouterr()
    assert main(["serve", str(path), "--port", "0"]) == 2  # the CLI's exit code for a user error
    assert len([line for line in capsys.readouterr().err.splitlines() if line.strip()]) == 1


def _simulated_recipe(tmp_path, model, device_power: int):
    study, url = make_study(tmp_path, model, tmp_path, name="tiny-h100", measured=False, sim_hardware="h100",
                            points=[(config(batch_size=2, device_power=device_power), bench(5000.0, 0.1, 10.0),
                                     GATE_NOT_MEASURED, {})])
    return next(p for p in write_recipes(study, tmp_path / "recipes", url) if p.name == "best-throughput.yaml")


def test_simulated_recipe_is_refused_without_draft_and_served_as_a_draft(tmp_path, decided_model_folder,
                                                                          monkeypatch, capsys):
    # h100's device_power levels are clock levels (1, 2, 4, 8): pick one that is not the thread count already set,
    # so that applying it as threads would show.
    threads = torch.get_num_threads()
    level = next(v for v in (8, 4, 2, 1) if v != threads)
    path = _simulated_recipe(tmp_path, decided_model_folder, level)
    monkeypatch.setattr(autotune.recipes.target, "backend_missing",
                        lambda name: None if name == "cpu" else f"no {name} on this machine")
    with pytest.raises(UserInputError) as err:
        build_server(load_recipe(path), "127.0.0.1", 0)
    assert "\n" not in str(err.value) and "--draft" in str(err.value) and "simulated" in str(err.value)
    capsys.readouterr()
    server = Served(path, draft=True)
    try:
        logged = capsys.readouterr().err
        assert torch.get_num_threads() == threads
        assert "DRAFT" in logged and "served on cpu instead of cuda" in logged and "do not apply" in logged
        assert f"device_power={level}" in logged and "not applied" in logged
        health = json.loads(server.get("/health")[1])
        assert health["backend"] == "cpu" and health["draft"] is True and health["metrics_source"] == "simulated"
        status, answer = server.post("/generate", {"prompt": "Hello there", "max_new_tokens": 4})
        assert status == 200 and answer["completion_tokens"] == 4
    finally:
        server.close()
        torch.set_num_threads(threads)


def test_cpu_recipe_still_sets_its_thread_count(tmp_path, decided_model_folder):
    threads = torch.get_num_threads()
    level = 1 if threads != 1 else 2
    path = tiny_recipe(tmp_path, decided_model_folder, batch_size=2, device_power=level)
    server = Served(path)
    try:
        assert torch.get_num_threads() == level
        assert json.loads(server.get("/health")[1])["backend"] == "cpu"
    finally:
        server.close()
        torch.set_num_threads(threads)
