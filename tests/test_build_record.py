"""Trials, `verify` and `serve` build one artifact on the CPU, and say which: O2 is AOTInductor packages wherever it
is built (a scratch folder, removed with the engine, where nobody keeps them), and the engine's build record names
the artifact, the prepacking and the spilling that its recipe then carries and that `serve` and `verify` check."""
from __future__ import annotations

import gc
import os

import pytest
import torch

from autotune.config.deploy import DeployConfig
from autotune.devices.cpu import CpuDevice
from autotune.engine import Request
from autotune.engine.prepacked import prepack_available
from autotune.recipes.recipe import Recipe


def _greedy(engine) -> list[list[int]]:
    runner = engine.runner(max_seq_len=64)
    return [c.output_ids for c in runner.run([Request([5, 9, 31, 7, 2, 11], 6, min_new_tokens=6),
                                              Request([40, 3, 12], 6, min_new_tokens=6)])]


@pytest.mark.slow
def test_an_o2_build_on_the_cpu_is_packages_in_a_scratch_folder_removed_with_it(tiny_llama, own_cache):
    # fp32: AOTInductor's bf16 kernels need oneDNN's bf16, which not every CPU here has
    device = CpuDevice()
    eager = device.build(tiny_llama, DeployConfig(dtype="fp32", fusion_level="O0", batch_size=2))
    assert eager.build_record == {"artifact": "eager", "prepacked": prepack_available(), "spilled": False}
    expected = _greedy(eager)
    engine = device.build(tiny_llama, DeployConfig(dtype="fp32", fusion_level="O2", layers_per_subgraph=0,
                                                   batch_size=2))
    assert engine.build_record == {"artifact": "aoti-package", "prepacked": False, "spilled": True}
    folder = engine.packaged.folder
    assert folder.parent == own_cache / "scratch"
    assert _greedy(engine) == expected
    assert engine.packaged.num_compiled > 0 and list(folder.glob("*.pt2"))
    del engine
    gc.collect()
    assert not folder.exists()


def test_a_dead_processs_scratch_folder_is_removed_by_the_next_build(own_cache):
    import subprocess
    import sys

    from autotune.devices.cpu import scratch_packages

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = own_cache / "scratch" / f"o2-{int(dead.stdout)}-abc"  # what a trial killed at its limit leaves
    left.mkdir(parents=True)
    (left / "segment0.pt2").write_bytes(b"kernels")
    mine = scratch_packages()
    assert not left.exists() and mine.is_dir() and mine.name.startswith(f"o2-{os.getpid()}-")
    assert scratch_packages().is_dir() and mine.is_dir()  # a live process's folder stays


def test_the_recipe_says_where_it_was_measured_otherwise():
    built = {"artifact": "aoti-package", "prepacked": False, "spilled": True}
    deploy = {"command": "autotune serve RECIPE", "max_seq_len": 512}
    same = Recipe({"deploy": {**deploy, "build": dict(built)}})
    assert same.build_difference(built) is None
    older = Recipe({"deploy": deploy})
    assert "made before builds were recorded" in older.build_difference(built)
    other = Recipe({"deploy": {**deploy, "build": {**built, "artifact": "torch.compile:inductor"}}})
    assert other.build_difference(built) == ("built otherwise than it was measured: artifact "
                                             "'torch.compile:inductor' there, 'aoti-package' here")


def test_an_o1_build_is_a_torch_compile(tiny_llama):
    config = DeployConfig(dtype="fp32", fusion_level="O1", layers_per_subgraph=0, batch_size=2)
    engine = CpuDevice().build(tiny_llama, config)
    assert engine.build_record["artifact"] == "torch.compile:inductor" and engine.packaged is None
    torch._dynamo.reset()
