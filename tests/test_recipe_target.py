"""Where a recipe runs: its own backend when this machine has it; a simulated recipe else on the CPU (not
comparable); a measured one else refused in one line. device_power is a thread count only on the CPU."""
from __future__ import annotations

import pytest

from autotune.config.deploy import DeployConfig
from autotune.devices.registry import DEVICES
from autotune.errors import BackendUnavailable
from autotune.recipes.recipe import Recipe
from autotune.recipes.target import place, recipe_target
from autotune.sim.hardware import list_profiles, read_profile_data


def _recipe(backend: str, hardware: str, simulated: bool, device_power: int = 0) -> Recipe:
    return Recipe({"backend": backend, "hardware": {"hardware": hardware, **({"simulated": True} if simulated else {})},
                   "metrics": {"source": "simulated" if simulated else "measured"},
                   "configuration": DeployConfig(device_power=device_power).to_dict()})


def _only(*present: str):
    return lambda name: None if name in present else f"no {name} here"


@pytest.mark.parametrize("name", list_profiles())
def test_every_hardware_profile_names_a_device_kind(name):
    assert read_profile_data(name).get("device") in DEVICES


def test_measured_recipe_runs_on_its_backend_or_is_refused_in_one_line():
    cpu = place(_recipe("cpu", "cpu-amd-epyc-2c", False, device_power=2), _only("cpu"))
    assert (cpu.backend, cpu.threads, cpu.comparable) == ("cpu", 2, True)
    cuda = place(_recipe("cuda", "cuda-h200", False), _only("cpu", "cuda"))
    assert (cuda.backend, cuda.threads, cuda.comparable) == ("cuda", None, True)
    with pytest.raises(BackendUnavailable) as err:
        place(_recipe("npu", "npu-ascend910b2", False), _only("cpu"))
    assert "\n" not in str(err.value) and "npu" in str(err.value) and "no npu here" in str(err.value)


def test_simulated_recipe_runs_on_its_device_kind_or_falls_back_to_the_cpu():
    recipe = _recipe("sim", "h100", True, device_power=8)  # h100's level 8: a clock, not 8 threads
    assert recipe_target(recipe).backend == "cuda" and recipe_target(recipe).power_kind == "clock"
    here = place(recipe, _only("cpu", "cuda"))
    assert (here.backend, here.threads, here.comparable) == ("cuda", None, True)
    away = place(recipe, _only("cpu"))
    assert (away.backend, away.threads, away.comparable, away.why) == ("cpu", None, False, "no cuda here")
    npu = place(_recipe("sim", "ascend910", True), _only("cpu"))
    assert (npu.backend, npu.target.backend, npu.comparable) == ("cpu", "npu", False)


def test_simulated_cpu_recipe_keeps_its_thread_count():
    local = place(_recipe("sim", "cpu-local", True, device_power=1), _only("cpu"))
    assert (local.backend, local.threads, local.comparable) == ("cpu", 1, True)


def test_unknown_profile_is_served_nowhere_comparable():
    unknown = place(_recipe("sim", "made-elsewhere", True, device_power=4), _only("cpu"))
    assert (unknown.backend, unknown.threads, unknown.comparable) == ("cpu", None, False)
    assert "made-elsewhere" in unknown.why
