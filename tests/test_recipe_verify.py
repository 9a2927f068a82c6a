"""`autotune verify` on the tiny model, through the CPU backend's isolated jobs: a simulated recipe becomes a
measured one, which then verifies; the same recipe with unreachable figures fails."""
from __future__ import annotations

import pytest
import yaml
from recipe_factory import bench, config, make_study

from autotune.backends.sim import GATE_NOT_MEASURED
from autotune.cli import main
from autotune.recipes.recipe import load_recipe, recipe_checksum
from autotune.results.export import write_recipes


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_model_folder):
    """A simulated recipe of the tiny model, verified into a measured one (one verify run)."""
    import os

    tmp = tmp_path_factory.mktemp("verify")
    old = os.environ.get("AUTOTUNE_CACHE")
    os.environ["AUTOTUNE_CACHE"] = str(tmp / "cache")  # reference and gate caches of this test only
    study, url = make_study(tmp, tiny_model_folder, tmp, name="tiny-sim", measured=False,
                            points=[(config(batch_size=2, page_size=16), bench(5000.0, 0.1, 10.0),
                                     GATE_NOT_MEASURED, {})])
    sim = next(p for p in write_recipes(study, tmp / "recipes", url) if p.name == "best-throughput.yaml")
    code = main(["verify", str(sim), "--repeats", "1"])
    yield code, sim, sim.with_name("best-throughput.measured.yaml")
    if old is None:
        os.environ.pop("AUTOTUNE_CACHE", None)
    else:
        os.environ["AUTOTUNE_CACHE"] = old


def test_simulated_recipe_is_verified_into_a_measured_one(measured, capsys):
    code, sim, out = measured
    assert code == 0 and out.is_file()
    recipe = load_recipe(out)
    assert recipe.verified and not recipe.simulated and recipe.data["backend"] == "cpu"
    assert recipe.data["provenance"]["verified_from"] == str(sim)
    assert recipe.data["metrics"]["throughput_tok_s"] > 0 and recipe.data["gate"]["passed"]


def test_fresh_recipe_verifies_and_unreachable_figures_fail(measured, capsys):
    _, _, out = measured
    capsys.readouterr()
    # A wide tolerance: on a shared 2-core machine a tiny model's figures swing several-fold with the load of
    # other processes; what is tested is the comparison, not this machine's noise.
    assert main(["verify", str(out), "--repeats", "1", "--tolerance", "50"]) == 0
    shown = capsys.readouterr().out
    assert "fingerprint: same hardware and software" in shown and "recorded" in shown and "verify: OK" in shown
    data = yaml.safe_load(out.read_text())
    metrics = data["metrics"]
    metrics["throughput_tok_s"] *= 1e6
    metrics["tpot_p99_ms"] /= 1e6
    data["checksum"] = recipe_checksum(data)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["verify", str(out), "--repeats", "1", "--tolerance", "50"]) == 1
    shown = capsys.readouterr().out
    assert "OUT OF TOLERANCE" in shown and "throughput_tok_s" in shown.split("FAILED:")[1]
