"""The device check's carried wheels (scripts/device_check/): every package it may need has a wheel for any CPython
from 3.10 to 3.14 on this platform, the folder fits the working tree's 64 MiB with room to spare, and the wheels
unpacked without pip are importable (from the unpacked copies, not from this venv)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("install_wheels",
                                               ROOT / "scripts" / "device_check" / "install_wheels.py")
install_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_wheels)


def test_the_wheels_fit_the_working_tree():
    size = sum(p.stat().st_size for p in install_wheels.WHEELS.glob("*.whl"))
    assert size < 24 * 2**20, f"{size / 2**20:.1f} MiB of wheels: the whole working tree travels in 64 MiB"


@pytest.mark.parametrize("python", [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14)])
def test_a_wheel_for_every_carried_package_on_each_python(python):
    picked = {}
    for _, dist, spec, below in install_wheels.CARRIED:
        if below is not None and python >= below:
            continue
        wheel = install_wheels.pick_wheel(dist, spec, python)
        assert wheel is not None, f"no carried wheel of {dist}{spec} for Python {python}"
        picked[dist] = wheel.name
    # SQLAlchemy 2.1 needs Python 3.11: 3.10 gets 2.0 (alembic needs >= 2.0); rpds-py is built per CPython
    assert picked["sqlalchemy"].startswith("sqlalchemy-2.1" if python >= (3, 11) else "sqlalchemy-2.0")
    assert f"-cp{python[0]}{python[1]}-" in picked["rpds-py"]
    assert picked["torchao"] == "torchao-0.18.0-py3-none-any.whl"  # pure Python: no kernels built for another torch


@pytest.mark.slow
def test_unpacked_wheels_import_without_pip(tmp_path):
    for _, dist, spec, below in install_wheels.CARRIED:
        if below is None or sys.version_info[:2] < below:
            install_wheels.unpack(install_wheels.pick_wheel(dist, spec), tmp_path)
    assert not (tmp_path / "test").exists()  # torchao's stray test package would shadow the standard library's
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
             "import optuna, alembic, sqlalchemy, mako, colorlog, optuna_dashboard, torchao, jsonschema, pytest; "
             "from optuna.storages import RDBStorage; RDBStorage('sqlite://'); "  # alembic's migrations, from files
             "print(all(m.__file__.startswith(sys.path[0]) for m in (optuna, alembic, sqlalchemy, torchao, pytest)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("True"), proc.stderr[-2000:]
