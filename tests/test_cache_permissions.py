"""The cache holds native code the server loads: its folders are made 0700 whatever the umask, native code is
refused from a folder that is group- or other-writable or owned by someone else (a real O2 server start, refused
before anything is compiled), and a package is loaded only when its digest is in the record beside its folder, not
by a metadata file dropped into the folder with it."""
from __future__ import annotations

import json
import os
import stat

import pytest
from recipe_factory import tiny_recipe

from autotune.engine.packaged import PackagedGraphs, digests_path
from autotune.errors import UserInputError
from autotune.paths import private_dir, untrusted


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folders_are_made_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        made = private_dir(tmp_path / "cache" / "startup" / "abc")
    finally:
        os.umask(old)
    assert [_mode(p) for p in (made, made.parent, made.parent.parent)] == [0o700] * 3
    assert untrusted(made) is None


@pytest.mark.parametrize("mode, words", [(0o770, "writable by group"), (0o707, "writable by others")])
def test_a_writable_folder_on_the_way_is_refused(tmp_path, mode, words):
    folder = private_dir(tmp_path / "cache" / "startup" / "o2")
    os.chmod(tmp_path / "cache", mode)
    why = untrusted(folder)
    assert why is not None and words in why and f"chmod go-w {tmp_path / 'cache'}" in why
    with pytest.raises(UserInputError, match=words):
        PackagedGraphs(folder)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = private_dir(tmp_path / "theirs")
    os.chown(folder, 12345, -1)
    assert "owned by uid 12345" in (untrusted(folder) or "")


def test_a_package_not_in_the_record_is_not_loaded(tmp_path, capsys):
    folder = private_dir(tmp_path / "startup" / "o2")
    # A package and its metadata, dropped into the folder by someone who can write there (not by a start).
    (folder / "head-0123-abc.pt2").write_bytes(b"not a package")
    (folder / "head-0123-abc.json").write_text(json.dumps({"pattern": [[None, 4]], "sha256": "ignored"}))
    graphs = PackagedGraphs(folder)
    # Found by its metadata, loaded only when a step fits it: then refused.
    assert graphs._load_all("head-0123") == [[[[None, 4]], None, "head-0123-abc"]]
    assert graphs._load("head-0123-abc") is None and graphs.num_loaded == 0
    assert "is not in the start-up record" in capsys.readouterr().err
    # In the record, but the bytes are not the ones recorded.
    digests_path(folder).write_text(json.dumps({"head-0123-abc.pt2": "0" * 64}))
    assert PackagedGraphs(folder)._load("head-0123-abc") is None
    assert "does not match the checksum in the start-up record" in capsys.readouterr().err


@pytest.mark.slow
def test_an_o2_server_under_a_group_writable_cache_refuses_to_start(tmp_path, monkeypatch, context_model_folder):
    from autotune.recipes.recipe import load_recipe
    from autotune.serve import build_server

    recipe = tiny_recipe(tmp_path, context_model_folder, batch_size=1, page_size=16, dtype="fp32",
                         fusion_level="O2", layers_per_subgraph=0)
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    os.chmod(cache, 0o775)  # a cache a group shares: any member could drop a .so into it
    monkeypatch.setenv("AUTOTUNE_CACHE", str(cache))
    with pytest.raises(UserInputError, match=f"refusing to load native code .* {cache} is writable by group"):
        build_server(load_recipe(recipe), "127.0.0.1", 0)
    assert not list(cache.rglob("*.pt2"))  # refused before anything was compiled


def test_trials_refuse_a_writable_kernel_cache(tmp_path, monkeypatch):
    from autotune.engine.compiler_cache import compiler_cache_env

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    env = compiler_cache_env()
    assert _mode(tmp_path / "cache" / "inductor") == 0o700 and env["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")
    os.chmod(tmp_path / "cache", 0o777)
    with pytest.raises(UserInputError, match="writable by group"):
        compiler_cache_env()
