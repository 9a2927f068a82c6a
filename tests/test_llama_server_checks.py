"""A llama.cpp recipe records the sha256 of its GGUF and the version and sha256 of the llama-server that serves it;
`autotune serve` checks both before it execs, and refuses a tampered -m or a swapped binary in one line that says
how to rebuild. Real execve of a stand-in llama-server (a script that records how it was started) in a real
subprocess; llama-cpp-python itself is not needed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_factory import GATE, bench, make_study

from autotune.config.deploy import DeployConfig
from autotune.errors import UserInputError
from autotune.llamacpp.build_info import server_identity, tools_dir
from autotune.llamacpp.config import server_command
from autotune.paths import file_sha256
from autotune.recipes.recipe import build_recipe, load_recipe, write_recipe

_SERVER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 4242 (abcdef0)"; echo "built with cc for x86_64"; exit 0; fi
printf '%s\\n' "$@" > {marker}
printf '%s' "$LLAMA_API_KEY" > {marker}.key
"""
# Run as `autotune serve` runs a llama.cpp recipe once placement has accepted it (placement itself refuses where
# llama-cpp-python is missing, as here): the checks, then execve.
_SERVE = ("import sys; from autotune.errors import UserInputError; from autotune.recipes.recipe import load_recipe; "
          "from autotune.serve.llama_server import serve_with_llama_server\n"
          "try:\n    serve_with_llama_server(load_recipe(sys.argv[1]), '127.0.0.1', 8123, sys.argv[2] == 'force', "
          "api_key='key-0123456789abcdef')\n"
          "except UserInputError as exc:\n    print(f'autotune: error: {exc}', file=sys.stderr); sys.exit(2)")


@pytest.fixture
def setup(tmp_path, monkeypatch, context_model_folder):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    binary = tools_dir() / "llama-server"  # where scripts/build_llamacpp.sh puts it
    binary.parent.mkdir(parents=True)
    marker = tmp_path / "exec.txt"
    binary.write_text(_SERVER.format(marker=marker))
    binary.chmod(0o755)
    gguf = tmp_path / "model-Q8_0.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    config = DeployConfig.from_dict({"runtime": "llamacpp", "gguf_type": "Q8_0"})
    study, url = make_study(tmp_path, context_model_folder, tmp_path,
                            points=[(config.to_dict(), bench(50.0, 20.0, 300.0), GATE, {})])
    trial = study.trials[0]
    # What a llama.cpp trial records (autotune/llamacpp/trial.py): its command and the identities of what it ran.
    trial.user_attrs["what"] = server_command(config, str(gguf), 2)
    trial.user_attrs["versions"] = {"python": "3.11", "llama_cpp_python": "0.3.36", **server_identity(gguf)}
    path = tmp_path / "recipes" / "llama.yaml"
    write_recipe(path, build_recipe(study, trial, url, []))
    return path, binary, gguf, marker


def _serve(path: Path, force: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SERVE, str(path), "force" if force else "check"],
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_the_recipe_records_the_gguf_and_the_server(setup):
    path, binary, gguf, _ = setup
    recipe = load_recipe(path)
    deploy = recipe.data["deploy"]
    assert deploy["gguf_sha256"] == file_sha256(gguf) and deploy["llama_server_sha256"] == file_sha256(binary)
    assert deploy["llama_server_version"] == "version: 4242 (abcdef0)"
    assert not {"gguf_sha256", "llama_server_sha256"} & set(recipe.data["software"])  # not software to compare


@pytest.mark.slow
def test_the_recorded_gguf_and_server_are_execed(setup):
    path, binary, gguf, marker = setup
    ran = _serve(path)
    assert ran.returncode == 0, ran.stderr
    argv = marker.read_text().split("\n")
    assert argv[argv.index("-m") + 1] == str(gguf) and argv[argv.index("--port") + 1] == "8123"
    # The key reaches llama-server by its environment (LLAMA_API_KEY), not by the process list.
    assert Path(f"{marker}.key").read_text() == "key-0123456789abcdef"
    assert "key-0123456789abcdef" not in marker.read_text()


@pytest.mark.slow
def test_a_tampered_gguf_is_refused_before_exec(setup):
    path, _, gguf, marker = setup
    gguf.write_bytes(gguf.read_bytes() + b"\0")
    ran = _serve(path)
    assert ran.returncode == 2 and not marker.exists()
    (line,) = [line for line in ran.stderr.splitlines() if line.startswith("autotune: error")]
    assert "refusing to exec llama-server" in line and f"the GGUF {gguf} has sha256" in line
    assert "delete it to have it made again" in line


@pytest.mark.slow
def test_a_swapped_binary_is_refused_before_exec(setup):
    path, binary, _, marker = setup
    binary.write_text(binary.read_text().replace("printf", "printf  "))  # another build, same behaviour
    ran = _serve(path)
    assert ran.returncode == 2 and not marker.exists()
    (line,) = [line for line in ran.stderr.splitlines() if line.startswith("autotune: error")]
    assert f"{binary} has sha256" in line and "version: 4242 (abcdef0)" in line
    assert "rebuild it with bash scripts/build_llamacpp.sh" in line


@pytest.mark.slow
def test_force_serves_a_mismatch_and_says_so(setup):
    path, binary, _, marker = setup
    binary.write_text(binary.read_text() + "\n")
    ran = _serve(path, force=True)
    assert ran.returncode == 0 and marker.exists()
    assert "--force: " in ran.stderr and f"{binary} has sha256" in ran.stderr


def test_a_non_loopback_host_is_warned_on_the_llama_path(setup, monkeypatch, capsys):
    import autotune.serve.app as app

    path, *_ = setup
    execs = []
    monkeypatch.setattr(app, "placement", lambda recipe, draft: None)
    monkeypatch.setattr(os, "execve", lambda *a: execs.append(a))
    app.serve_forever(load_recipe(path), "0.0.0.0", 8123, 4, False, unguarded=True)
    assert execs and execs[0][1][execs[0][1].index("--host") + 1] == "0.0.0.0"
    err = capsys.readouterr().err
    assert "listening on 0.0.0.0, not only loopback, WITHOUT an API key" in err
    assert "--unguarded: llama-server answers on 0.0.0.0:8123 without autotune's guard" in err


def test_a_llama_cpp_recipe_is_refused_unless_unguarded(setup, monkeypatch):
    import autotune.serve.app as app

    path, *_ = setup
    execs = []
    monkeypatch.setattr(app, "placement", lambda recipe, draft: None)
    monkeypatch.setattr(os, "execve", lambda *a: execs.append(a))
    with pytest.raises(UserInputError) as refused:
        app.serve_forever(load_recipe(path), "127.0.0.1", 8123, 4, False)
    assert not execs
    message = str(refused.value)
    assert "none of autotune serve's guard" in message and "Pass --unguarded" in message and "\n" not in message


@pytest.mark.slow
def test_a_recipe_without_the_digests_is_served_with_a_warning(setup):
    path, _, _, marker = setup
    data = load_recipe(path).data
    for key in ("gguf_sha256", "llama_server_version", "llama_server_sha256"):
        del data["deploy"][key]
    old = path.with_name("old.yaml")
    write_recipe(old, data)
    ran = _serve(old)
    assert ran.returncode == 0 and marker.exists()
    assert "records no sha256 of its GGUF" in ran.stderr and "records no llama-server digest" in ran.stderr
