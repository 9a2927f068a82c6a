"""Recipes written before the dtype knob and the ISA-level classes (a checked-in one of 2026-12-02, kept as it
was): they load, read as quant none in bf16, and say on load what they are; a warm start on a machine whose space
has no bf16 skips them; verify on another class re-gates them without judging their figures."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.config.deploy import DeployConfig
from autotune.probe.capabilities import Capabilities, Precision, restrict_space
from autotune.recipes.recipe import load_recipe
from autotune.recipes.warm_start import enqueue_recipes
from autotune.space.search_space import DEFAULT_SPACE, load_space

LEGACY = Path(__file__).with_name("data") / "legacy-cpu-amd-epyc-2c.yaml"
AVX2 = Capabilities("cpu", "AMD EPYC", (Precision("fp32", True, True, "native"),
                                        Precision("bf16", False, False, "emulated: 4.8x fp32")))


def test_a_recipe_from_before_the_dtype_knob_loads_as_quant_none_in_bf16(capsys):
    recipe = load_recipe(LEGACY)
    assert recipe.verified  # its checksum still holds: nothing was rewritten
    assert recipe.data["configuration"]["quant"] == "bf16" and "dtype" not in recipe.data["configuration"]
    config = recipe.config
    assert (config.quant, config.dtype, config.fusion_level) == ("none", "bf16", "O2")
    assert config.label().startswith("bf16/O2/")
    assert any("named before classes carried the ISA level" in n for n in recipe.notes)
    assert any("before the gate checked the decode path" in n for n in recipe.notes)
    assert "cpu-amd-epyc-2c was named before" in capsys.readouterr().err  # said on load


def test_a_warm_start_on_an_avx2_space_skips_the_legacy_bf16_recipe(tmp_path):
    folder = tmp_path / "smollm2-135m" / "cpu-amd-epyc-2c"
    folder.mkdir(parents=True)
    (folder / LEGACY.name).write_text(LEGACY.read_text())
    space = restrict_space(load_space(DEFAULT_SPACE).restrict("device_power", (1, 2), "2 cores"), AVX2)
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    assert enqueue_recipes(study, space, tmp_path, "smollm2-135m", "cpu-amd-epyc-avx2-2c") == 0
    # On a space that keeps bf16 (an AVX-512-bf16 machine), the same recipe is a warm start.
    bf16_space = load_space(DEFAULT_SPACE).restrict("device_power", (1, 2), "2 cores")
    assert enqueue_recipes(study, bf16_space, tmp_path, "smollm2-135m", "cpu-amd-epyc-avx512bf16-2c") == 1
    params = bf16_space.from_trial_params(study.trials[0].system_attrs["fixed_params"])
    assert DeployConfig.from_params(params) == load_recipe(LEGACY).config
