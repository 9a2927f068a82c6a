"""Every input of a cached gate, reference and calibration changes its key, so that none of them can be changed and
served a stale answer: the model, the evaluation text, the numerics, the verdict's settings, the device, the threads,
the versions, the kept layers, every figure of the gate's design and of the calibration, and the texts they read."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import calibration
from autotune.config.deploy import DeployConfig
from autotune.gate import cache, design
from autotune.quant import plan as plan_module

PLAIN = DeployConfig(dtype="bf16")
CALIBRATED = DeployConfig(dtype="bf16", quant="w8a8", quant_method="smoothquant_static")


def _key(checksum: str = "sha256:x", digest: str = "d", config: DeployConfig = PLAIN, **settings) -> str:
    args = {"tie_epsilon": 0.05, "min_agreement": 0.995, "device": "cpu", "threads": 2, **settings}
    return cache.gate_key(cache.gate_inputs(checksum, digest, config, **args))


def _other(value):
    """A different value of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"{value}, changed"


@pytest.mark.parametrize("change", [
    {"checksum": "sha256:y"}, {"digest": "e"}, {"config": replace(PLAIN, dtype="fp32")},
    {"config": replace(PLAIN, quant="w8a16")}, {"config": replace(PLAIN, fusion_level="O1", layers_per_subgraph=0)},
    {"tie_epsilon": 0.1}, {"min_agreement": 0.99}, {"device": "cuda"}, {"threads": 1},
    {"kept_layers": ("model.layers.0.mlp.down_proj",)},
], ids=lambda change: next(iter(change)))
def test_each_input_of_a_gate_changes_its_key(change):
    assert _key(**change) != _key()


def test_settings_that_decide_no_figure_keep_the_key():
    assert _key(config=replace(PLAIN, batch_size=16, page_size=16, kv_policy="pool")) == _key()


@pytest.mark.parametrize("package", ["engine", "torch", "torchao", "transformers"])
def test_a_version_of_the_numerics_software_changes_the_gate_key(monkeypatch, package):
    before = _key()
    versions = {**cache.numerics_versions(), package: "other"}
    monkeypatch.setattr(cache, "numerics_versions", lambda: versions)
    assert _key() != before


@pytest.mark.parametrize("change", [
    lambda m: m.setenv("ONEDNN_MAX_CPU_ISA", "AVX2"), lambda m: m.setenv("ATEN_CPU_CAPABILITY", "avx2"),
    lambda m: m.setattr(cache, "cpu_model", lambda: "another CPU"),
    lambda m: m.setattr(cache, "cpu_signature", lambda: "family 26 model 2"),
    lambda m: m.setattr(cache, "cpu_flags", lambda: frozenset({"avx2", "fma"})),
], ids=["onednn cap", "aten cap", "cpu model", "family/model", "flags"])
def test_the_cpu_and_its_isa_caps_change_the_gate_key(monkeypatch, change):
    """Emulated and native bf16 round differently: a verdict made under an ISA cap, or on another CPU, is not
    reused without it."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(var, raising=False)
    before = _key()
    change(monkeypatch)
    assert _key() != before


def test_the_build_code_hash_follows_every_file_of_the_build(tmp_path, monkeypatch):
    """The engine's version is the digest of the engine, quantizer and model code, not a number to bump."""
    import shutil

    from autotune import code_hash as module

    for package in module.BUILD_CODE:
        shutil.copytree(module._ROOT / package, tmp_path / package)
    monkeypatch.setattr(module, "_ROOT", tmp_path)
    module.code_hash.cache_clear()
    try:
        same = module.code_hash()
        for package in module.BUILD_CODE:
            source = sorted((tmp_path / package).rglob("*.py"))[-1]
            source.write_text(source.read_text() + "\n# changed\n")
            changed = module.code_hash.__wrapped__()
            assert changed != same, package
            same = changed
    finally:
        # The copy's root undone before the cache is cleared: a hash of the edited copy must not stay cached for
        # the rest of the session, where every trial's child computes the real one (the gate keys would differ).
        monkeypatch.undo()
        module.code_hash.cache_clear()
    assert cache.numerics_versions()["engine"] == module.code_hash()


@pytest.mark.parametrize("name", sorted(design.design()))
def test_each_figure_of_the_gate_design_changes_the_gate_and_the_reference_key(monkeypatch, name):
    gate, reference = _key(), cache.reference_path("sha256:x", "d")
    monkeypatch.setattr(design, name, _other(getattr(design, name)))
    assert _key() != gate and cache.reference_path("sha256:x", "d") != reference


def test_the_reference_follows_the_decode_text_and_transformers(monkeypatch):
    reference = cache.reference_path("sha256:x", "d")
    assert cache.reference_path("sha256:x", "e") != reference and cache.reference_path("sha256:y", "d") != reference
    monkeypatch.setattr(cache, "decode_set_digest", lambda: "other text")
    assert cache.reference_path("sha256:x", "d") != reference
    monkeypatch.undo()
    versions = {**cache.numerics_versions(), "transformers": "other"}
    monkeypatch.setattr(cache, "numerics_versions", lambda: versions)
    assert cache.reference_path("sha256:x", "d") != reference


@pytest.fixture
def calibration_folder(monkeypatch):
    """The calibration cache's folder of one model (its checksum fixed: no weights are read)."""
    monkeypatch.setattr(plan_module, "model_checksum", lambda spec: "sha256:0123456789abcdef0123")
    return lambda: plan_module.calibration_dir(None)


@pytest.mark.parametrize("name", sorted(set(calibration.calibration_inputs()) - {"files"}))
def test_each_calibration_figure_changes_a_calibrated_gate_and_the_calibration_folder(monkeypatch, name,
                                                                                     calibration_folder):
    calibrated, plain, folder = _key(config=CALIBRATED), _key(), calibration_folder()
    monkeypatch.setattr(calibration, name, _other(getattr(calibration, name)))
    assert _key(config=CALIBRATED) != calibrated and calibration_folder() != folder
    assert _key() == plain  # a build that reads no calibration keeps its gate


def test_the_calibration_texts_change_the_key(monkeypatch, tmp_path, calibration_folder):
    calibrated, folder = _key(config=CALIBRATED), calibration_folder()
    edited = []
    for path in calibration.CALIB_FILES:
        copy = tmp_path / Path(path).name
        copy.write_text(Path(path).read_text() + "\none more line\n")
        edited.append(copy)
    monkeypatch.setattr(calibration, "CALIB_FILES", tuple(edited))
    assert _key(config=CALIBRATED) != calibrated and calibration_folder() != folder


def test_a_stored_gate_is_found_only_under_its_own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    cache.store_gate(_key(), {"tie_aware_agreement": 1.0})
    assert cache.load_gate(_key()) == {"tie_aware_agreement": 1.0}
    assert cache.load_gate(_key(min_agreement=0.9)) is None
