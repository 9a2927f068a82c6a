"""Signed recipes: `autotune export --sign KEY` signs with an HMAC; `serve`/`verify --require-signature KEY` refuse
a recipe that is unsigned, signed with another key, or edited after signing, even one whose checksum an editor
recomputed (a checksum shows corruption, not who made the file); unsigned recipes keep working without the flag."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from recipe_factory import tiny_recipe

from autotune.cli.main import main
from autotune.errors import UserInputError
from autotune.recipes.recipe import RecipeInvalid, load_recipe, recipe_checksum
from autotune.recipes.signature import read_key

KEY = "a-signing-key-0123456789"


@pytest.fixture
def exported(tmp_path, monkeypatch, tiny_model_folder):
    """One study exported twice: unsigned, and signed through the CLI with the key from a variable."""
    monkeypatch.setenv("RECIPE_KEY", KEY)
    unsigned = tiny_recipe(tmp_path, tiny_model_folder, batch_size=2, page_size=16)
    url = f"sqlite:///{tmp_path / 'tiny-0.db'}"
    assert main(["export", "--study", "tiny-0", "--storage", url, "--out", str(tmp_path / "signed"),
                 "--sign", "env:RECIPE_KEY"]) == 0
    signed = next((tmp_path / "signed").rglob("best-throughput.yaml"))
    return unsigned, signed


def _edit(path, change) -> None:
    """Edit a recipe as someone who knows how its checksum is made would: the checksum recomputed."""
    data = yaml.safe_load(path.read_text())
    change(data)
    data["checksum"] = recipe_checksum(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_signed_recipe_loads_with_its_key_and_without_one(exported):
    unsigned, signed = exported
    data = load_recipe(signed, key=KEY.encode()).data
    assert data["signature"]["algorithm"] == "hmac-sha256" and len(data["signature"]["value"]) == 64
    assert load_recipe(signed).verified and load_recipe(unsigned).verified  # no key asked: both as before
    # The signature is no part of the content the checksum covers: signing leaves the checksum as it was.
    assert recipe_checksum({k: v for k, v in data.items() if k != "signature"}) == data["checksum"]


def test_an_edit_with_a_recomputed_checksum_passes_the_checksum_but_not_the_signature(exported):
    _, signed = exported
    _edit(signed, lambda d: d["metrics"].update(throughput_tok_s=9999.0))
    assert load_recipe(signed).verified  # the checksum alone cannot tell
    with pytest.raises(RecipeInvalid, match="signature does not match"):
        load_recipe(signed, key=KEY.encode())
    with pytest.raises(RecipeInvalid, match="signature does not match"):
        load_recipe(signed, key=KEY.encode(), force=True)  # --force does not accept who made it


def test_unsigned_and_wrongly_signed_recipes_are_refused_when_a_signature_is_required(exported):
    unsigned, signed = exported
    with pytest.raises(RecipeInvalid, match=r"it is not signed \(export it with `autotune export --sign KEY`\)"):
        load_recipe(unsigned, key=KEY.encode())
    with pytest.raises(RecipeInvalid, match="signed with another key"):
        load_recipe(signed, key=b"another-key-0123456789")


@pytest.mark.slow
def test_serve_and_verify_require_the_signature_before_building_anything(exported):
    unsigned, signed = exported
    for command in ("serve", "verify"):
        ran = subprocess.run([sys.executable, "-m", "autotune.cli", command, str(unsigned), "--require-signature",
                              "env:RECIPE_KEY"], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "RECIPE_KEY": KEY})
        assert ran.returncode == 2, ran.stderr
        (line,) = [line for line in ran.stderr.splitlines() if "error" in line]
        assert "a signature is required and it is not signed" in line


def test_keys_come_from_a_variable_a_file_or_the_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("K", KEY)
    (tmp_path / "key").write_text(KEY + "\n")
    assert read_key("env:K") == read_key(f"@{tmp_path / 'key'}") == read_key(KEY) == KEY.encode()
    with pytest.raises(UserInputError, match="at least 16"):
        read_key("short")
    with pytest.raises(UserInputError, match="the environment variable MISSING is empty"):
        read_key("env:MISSING")


def test_a_signature_with_characters_outside_ascii_is_refused_not_a_crash():
    """An edited file may hold any text where the signature's value was: refused in one line, never TypeError."""
    from autotune.recipes.signature import sign, signature_problem

    data = sign({"model": {"name": "m"}}, KEY.encode())
    data["signature"]["value"] = "é" * 64
    assert signature_problem(data, KEY.encode()).startswith("its signature does not match")
    assert signature_problem(sign({"model": {"name": "m"}}, KEY.encode()), KEY.encode()) is None
