"""O2's packages are kept by what was built (autotune/devices/kept_packages.py): the packages a trial's build
compiles are the ones `autotune serve` of the recipe made from that trial loads; another configuration's build
keeps its own folder; beyond KEPT_BUILDS the least recently used folders go; a nearly full disk keeps none; a
build that makes no packages has no folder."""
from __future__ import annotations

import os
from collections import namedtuple

import pytest
from recipe_factory import tiny_recipe

from autotune.config.deploy import DeployConfig
from autotune.devices import kept_packages as kept_module
from autotune.devices.cpu import CpuDevice
from autotune.devices.kept_packages import KEPT_BUILDS, kept_packages
from autotune.engine import Request
from autotune.engine.startup_cache import META
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer
from autotune.recipes.recipe import load_recipe
from autotune.serve.startup_key import startup_cache
from autotune.trial.job import Job
from autotune.trial.run import _EngineStages

O2 = dict(fusion_level="O2", layers_per_subgraph=0, batch_size=2, page_size=16, dtype="fp32")


def _greedy(engine) -> list[int]:
    completion, = engine.runner(max_seq_len=64).run([Request([5, 6, 7], 4, min_new_tokens=4)])
    return completion.output_ids


@pytest.mark.slow
def test_the_packages_a_trial_compiled_are_the_ones_its_recipe_is_served_from(tmp_path, tiny_model_folder,
                                                                            own_cache):
    recipe = load_recipe(tiny_recipe(tmp_path, tiny_model_folder, **O2))
    spec = resolve_model(recipe.model)
    job = Job(kind="trial", model=recipe.model, workload=recipe.data["workload"], config=recipe.config.to_dict())
    stages = _EngineStages(job, spec, load_tokenizer(spec), CpuDevice(), base_rss=0)
    assert stages.build().status.value == "ok"
    tokens = _greedy(stages.engine)
    trial = stages.engine.packaged
    assert trial.num_compiled >= 3 and trial.folder.parent == own_cache / "o2"
    stages.close()

    startup = startup_cache(recipe, "cpu")
    assert startup.packages() == trial.folder
    served = CpuDevice().build(load_hf_model(spec, "float32"), recipe.config, packages=startup.packages())
    assert _greedy(served) == tokens
    assert served.packaged.num_compiled == 0 and served.packaged.num_loaded == trial.num_compiled


def test_each_build_keeps_its_own_folder_and_the_least_recently_used_go(tiny_model_folder, own_cache,
                                                                         capsys):
    spec = resolve_model(str(tiny_model_folder))
    folders = [kept_packages(spec, DeployConfig(**{**O2, "batch_size": b}), (), "cpu")
               for b in range(1, KEPT_BUILDS + 2)]
    assert len(set(folders)) == KEPT_BUILDS + 1 and all(f is not None for f in folders)
    assert not folders[0].exists() and all(f.exists() for f in folders[1:])
    assert capsys.readouterr().err.count("O2 packages of another build removed") == 1
    # Used again, a folder counts as the most recent: the next new build removes another one.
    os.utime(folders[1] / META, (1, 1))
    assert kept_packages(spec, DeployConfig(**{**O2, "batch_size": 2}), (), "cpu") == folders[1]
    kept_packages(spec, DeployConfig(**{**O2, "batch_size": 9}), (), "cpu")
    assert folders[1].exists() and not folders[2].exists()
    # Other layers kept unquantized: another build.
    assert kept_packages(spec, DeployConfig(**O2), ("layers.0.down_proj",), "cpu") not in folders


def test_no_folder_where_nothing_is_packaged_or_the_disk_is_nearly_full(tiny_model_folder, own_cache,
                                                                         monkeypatch, capsys):
    spec = resolve_model(str(tiny_model_folder))
    assert kept_packages(spec, DeployConfig(**{**O2, "fusion_level": "O1"}), (), "cpu") is None
    assert kept_packages(spec, DeployConfig(**O2), (), "cuda") is None
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(kept_module.shutil, "disk_usage", lambda path: usage(10 << 30, 9 << 30, 1 << 30))
    assert kept_packages(spec, DeployConfig(**O2), (), "cpu") is None
    assert "O2 packages not kept: 1.0 GiB free" in capsys.readouterr().err
