"""The environment that exports models to OpenVINO IR, made by autotune once and kept under its cache.

optimum-intel (the exporter OpenVINO's own documentation uses) 2.2.0 requires transformers<5.6, and autotune runs on
transformers 5.24: the two cannot share one environment, and an exporter written anew would have to follow every
architecture's quirks that optimum-intel already handles (its model patchers, the stateful KV cache, the tokenizer
IRs). So the export runs in a virtual environment of its own, with the versions below pinned, through
autotune/openvino/export_tool.py; autotune's own environment holds only the runtime (openvino-genai).

torchvision is a requirement of optimum-intel that the export of a text model never uses; PyPI's torchvision
beside the CPU build of torch fails to import ("operator torchvision::nms does not exist"), and transformers imports
it wherever it is installed: it is removed once the rest is in."""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from autotune.errors import BackendUnavailable
from autotune.paths import cache_root, private_dir
from autotune.progress import log

__all__ = ["export_requirements", "export_python", "TOOL"]

TOOL = Path(__file__).with_name("export_tool.py")
_UNUSED = ("torchvision", "pillow")


def _pinned(name: str) -> str:
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        raise BackendUnavailable(f"{name} is not installed: pip install openvino-genai==2026.4.1.0") from None


def export_requirements() -> tuple[str, ...]:
    """What the export environment installs: the exporter and NNCF at the versions this was written against, and
    OpenVINO and torch at the versions autotune's own environment has (an IR is read by the OpenVINO that wrote it,
    and one torch build is already on the machine)."""
    return (_pinned("torch"), _pinned("openvino"), _pinned("openvino-tokenizers"), "optimum-intel==2.2.0",
            "optimum==2.3.0", "nncf==3.4.0", "transformers==5.5.4", "torchvision==0.28.0")


def _folder() -> Path:
    digest = hashlib.sha256("\n".join(export_requirements()).encode()).hexdigest()[:12]
    return cache_root() / "openvino" / f"export-env-{digest}"


def export_python() -> Path:
    """The export environment's Python, made on first use (a minute or two of pip; a lock keeps concurrent trials
    from making it twice)."""
    folder = _folder()
    python = folder / "bin" / "python"
    ready = folder / "READY"
    if ready.is_file():
        return python
    private_dir(folder.parent)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file():
            return python
        started = time.perf_counter()
        log(f"openvino: making the export environment (once): {' '.join(export_requirements())}")
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        steps = [[sys.executable, "-m", "venv", "--clear", str(folder)],
                 [str(python), "-m", "pip", "install", "-q", *export_requirements()],
                 [str(python), "-m", "pip", "uninstall", "-q", "-y", *_UNUSED]]
        for step in steps:
            ran = subprocess.run(step, env=env, capture_output=True, text=True)
            if ran.returncode != 0:
                tail = "\n".join((ran.stdout + ran.stderr).strip().splitlines()[-5:])
                raise BackendUnavailable(f"could not make OpenVINO's export environment in {folder} "
                                         f"({' '.join(step[:4])}... exited {ran.returncode}):\n{tail}")
        ready.write_text("\n".join(export_requirements()) + "\n")
        log(f"openvino: export environment ready in {time.perf_counter() - started:.0f} s ({folder})")
    return python


if __name__ == "__main__":  # scripts/setup.sh makes it ahead of the first search
    print(export_python())
