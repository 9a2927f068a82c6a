"""A served recipe starts from its start-up cache: the first start compiles and saves torch's cache artifacts, the
second loads them and compiles nothing, with the same greedy tokens. A bundle made under another key, or a corrupt
one, is ignored with the reason in the log, never a crash. O2's frozen graphs are not cacheable by torch: the
log says why."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from recipe_factory import tiny_recipe

from autotune.engine.startup_cache import ARTIFACTS, META, StartupCache
from autotune.gate import cache as gate_cache
from autotune.recipes.recipe import load_recipe
from autotune.serve import startup_key as key_module
from autotune.serve.startup_key import startup_cache as recipe_startup_cache
from autotune.serve.startup_key import startup_key

TESTS = Path(__file__).resolve().parent

# One start of `autotune serve` as a test can run it: build and warm up (build_server), one greedy request, then the
# tokens, inductor's cache counts and the seconds spent compiling on stdout.
START = """
import json, sys
from pathlib import Path
from recipe_factory import Served
from autotune.engine.compiler_cache import compile_seconds, compiler_cache_counts
served = Served(Path(sys.argv[1]))
status, body = served.post("/generate", {"prompt": "The quick brown fox", "max_new_tokens": 8, "temperature": 0})
print(json.dumps({"status": status, "tokens": body.get("token_ids"), "counts": compiler_cache_counts(),
                  "compile_s": compile_seconds()}))
served.close()
"""


def _start(recipe: Path, cache: Path) -> tuple[dict, str]:
    # No TORCHINDUCTOR_CACHE_DIR given: `autotune serve` sets its own, the private folder under the cache root.
    env = {**{k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}, "AUTOTUNE_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", START, str(recipe)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def o1_recipe(tmp_path_factory, decided_model_folder) -> Path:
    # One segment and a batch of 1: few graphs (one decode bucket, the prefill paths, the head).
    return tiny_recipe(tmp_path_factory.mktemp("startup"), decided_model_folder, fusion_level="O1",
                       layers_per_subgraph=0, batch_size=1, page_size=16, dtype="fp32")


@pytest.mark.slow
def test_second_start_loads_what_the_first_saved_with_the_same_tokens(o1_recipe, tmp_path):
    inductor = tmp_path / "inductor"  # where serve keeps inductor's kernels: autotune's private folder
    cold, cold_log = _start(o1_recipe, tmp_path)
    assert "start-up cache not used: none yet" in cold_log and "start-up cache saved in" in cold_log, cold_log
    assert cold["status"] == 200 and cold["counts"]["misses"] > 0 and cold["counts"]["hits"] == 0
    # inductor's own entries gone (its kernels kept, as on this machine they stay): what the second start finds
    # compiled can only come from the start-up cache.
    assert (inductor / "fxgraph").is_dir() and oct(inductor.stat().st_mode & 0o777) == "0o700"
    for entries in ("fxgraph", "aotautograd"):
        shutil.rmtree(inductor / entries)
    warm, warm_log = _start(o1_recipe, tmp_path)
    figures = f"cold {cold}, warm {warm}"
    assert "start-up cache loaded from" in warm_log, warm_log
    assert warm["counts"]["misses"] == 0 and warm["counts"]["hits"] >= cold["counts"]["misses"], figures
    assert "start-up cache saved" not in warm_log  # it held everything: nothing to write
    assert warm["tokens"] == cold["tokens"] and len(cold["tokens"]) == 8, figures
    assert warm["compile_s"] < cold["compile_s"], figures
    print(figures)


def _bundle(folder: Path, key: dict[str, str], data: bytes = b"not torch's format", digest: str | None = None) -> None:
    import hashlib

    folder.mkdir(parents=True, exist_ok=True)
    (folder / ARTIFACTS).write_bytes(data)
    (folder / META).write_text(json.dumps({"key": key, "sha256": digest or hashlib.sha256(data).hexdigest()}))


@pytest.fixture
def cache(o1_recipe, tmp_path, monkeypatch) -> StartupCache:
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    return recipe_startup_cache(load_recipe(o1_recipe), "cpu")


@pytest.mark.parametrize("field, value", [("torch", "2.0.0"), ("recipe", "sha256:0123")])
def test_a_bundle_made_under_another_key_is_ignored_with_the_reason(cache, capsys, field, value):
    _bundle(cache.folder, {**cache.key, field: value})
    assert cache.load() is False
    err = capsys.readouterr().err
    assert f"made under another key ({field} {value!r} there, {cache.key[field]!r} here)" in err, err


_CHANGES = {
    "weights": lambda m: m.setattr(key_module, "model_checksum", lambda spec: "sha256:other weights"),
    "versions": lambda m: m.setattr(key_module, "numerics_versions",
                                    lambda: {**gate_cache.numerics_versions(), "transformers": "0.0"}),
    "torchao": lambda m: m.setattr(key_module, "numerics_versions",
                                   lambda: {**gate_cache.numerics_versions(), "torchao": "0.0"}),
    "host": lambda m: m.setenv("ONEDNN_MAX_CPU_ISA", "SSE41"),
    "cpu model": lambda m: m.setattr(gate_cache, "cpu_model", lambda: "another CPU"),
    "engine": lambda m: m.setattr(key_module, "code_hash", lambda: "another build code"),
}
_FIELD = {"torchao": "versions", "cpu model": "host"}


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_each_input_of_the_start_up_key_misses_a_bundle_made_without_it(o1_recipe, tmp_path, monkeypatch, capsys,
                                                                         change):
    """The weights (frozen into O2's packages), the libraries, the CPU's rounding facts and the build code: a
    bundle saved before any of them changed is not loaded after, and the log names what changed."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    before = recipe_startup_cache(load_recipe(o1_recipe), "cpu")
    _bundle(before.folder, before.key)
    _CHANGES[change](monkeypatch)
    after = recipe_startup_cache(load_recipe(o1_recipe), "cpu")
    field = _FIELD.get(change, change)
    assert after.folder == before.folder and after.key[field] != before.key[field]
    assert after.load() is False
    err = capsys.readouterr().err
    assert "made under another key (" in err and f"{field} {before.key[field]!r} there" in err, err


def test_a_corrupt_bundle_is_ignored_with_the_reason(cache, capsys):
    _bundle(cache.folder, cache.key, digest="0" * 64)
    assert cache.load() is False
    assert "does not match the checksum in its metadata (corrupt)" in capsys.readouterr().err
    _bundle(cache.folder, cache.key)  # checksum right, content not torch's: torch refuses it
    assert cache.load() is False
    assert "start-up cache not used: torch could not" in capsys.readouterr().err
    (cache.folder / META).write_text("{not json")
    assert cache.load() is False
    err = capsys.readouterr().err
    assert "its metadata" in err and "is unreadable (JSONDecodeError" in err, err


def test_the_key_is_the_recipe_torch_and_this_machine(o1_recipe):
    from autotune.host import cpu_fingerprint

    key = startup_key(load_recipe(o1_recipe), "cpu")
    assert key["torch"] == torch.__version__ and key["machine"] == cpu_fingerprint()["hardware"]
    assert key["recipe"].startswith("sha256:") and key["backend"] == "cpu"


@pytest.mark.slow
def test_o2_graphs_are_said_not_cacheable_with_inductors_reason(tmp_path, monkeypatch, capsys):
    from conftest import make_tiny_llama

    from autotune.config.deploy import DeployConfig
    from autotune.engine import Request, build_engine

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no oneDNN bf16 here: freezing may not prepack")
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    startup = StartupCache(tmp_path / "startup", {"recipe": "sha256:test"})
    startup.load()
    engine = build_engine(make_tiny_llama(num_hidden_layers=1),
                          DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=1, page_size=16))
    engine.runner(max_seq_len=64).run([Request([5, 6, 7], 2, min_new_tokens=2)])
    startup.save()
    err = capsys.readouterr().err
    assert "not cacheable by torch (mkldnn tensors unpickleable)" in err, err


def test_a_bundle_in_a_folder_others_can_write_is_never_loaded(cache, capsys):
    """Its artifacts are compiled kernels loaded into the server: from a folder others could have written them to,
    refused with the reason and the fix, as O2's packages are."""
    import os

    _bundle(cache.folder, cache.key)
    os.chmod(cache.folder, 0o777)
    try:
        assert cache.load() is False
        err = capsys.readouterr().err
        assert "start-up cache not used: refusing to load native code from" in err and "writable by" in err, err
    finally:
        os.chmod(cache.folder, 0o700)
