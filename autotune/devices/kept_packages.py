"""O2's AOTInductor packages (engine/packaged.py) kept by what was built, not by the recipe, so that the packages
a trial compiled are the ones a later `autotune serve` of the recipe made from that trial loads: on the machine
that searched, the first start compiles only the serving graphs that the trial did not run (the prefill of a lone
prompt and its head, the prompt chunk) instead of all of them.

The key is everything the packages' content depends on: the configuration (its digest: every knob), the layers
kept unquantized, the weights, the build code and the libraries, this machine's hardware class and rounding facts,
and the backend. A package is matched within its folder by its inputs (engine/packaged.py), so one folder serves
every shape the build meets. Each package holds its graph's frozen weights, so a folder is a few times the model's
size: at most KEPT_BUILDS folders are kept, the least recently used removed first, and none is kept where the disk
has less than MIN_FREE_BYTES free (a trial then builds in a scratch folder, removed with it; a server keeps its
packages in its recipe's start-up bundle, as before there were kept builds)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from autotune.code_hash import code_hash
from autotune.engine.build import COMPILE_MODES
from autotune.engine.packaged import digests_path
from autotune.engine.startup_cache import META, keyed_packages
from autotune.gate.cache import host_numerics, numerics_versions
from autotune.host import cpu_fingerprint
from autotune.models.weights import model_checksum
from autotune.paths import cache_root, private_dir
from autotune.progress import log

__all__ = ["KEPT_BUILDS", "MIN_FREE_BYTES", "build_key", "kept_packages"]

# A search keeps the packages of its O2 trials; the best is usually among its last few. A fixed count, not bytes:
# a folder's size is the model's, whatever the machine.
KEPT_BUILDS = 4
MIN_FREE_BYTES = 4 << 30


def build_key(spec, config, keep, backend: str) -> dict:
    """What the packages of `config` built from `spec`'s weights, `keep` layers unquantized, were made under."""
    return {"build": config.digest(), "keep": sorted(keep or ()), "weights": model_checksum(spec),
            "torch": torch.__version__, "versions": numerics_versions(), "machine": cpu_fingerprint()["hardware"],
            "host": host_numerics(), "backend": backend, "engine": code_hash()}


def kept_packages(spec, config, keep, backend: str) -> Path | None:
    """The folder that keeps the O2 packages of this build (build_key), other builds' beyond KEPT_BUILDS removed;
    None where the build makes none (not O2 on the CPU) or none can be kept (disk, a folder it cannot write)."""
    if backend != "cpu" or COMPILE_MODES.get(config.fusion_level) != "freezing":
        return None
    key = build_key(spec, config, keep, backend)
    root = private_dir(cache_root() / "o2")
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        log(f"O2 packages not kept: {free / 2**30:.1f} GiB free under {root}, under the "
            f"{MIN_FREE_BYTES / 2**30:.0f} GiB kept free")
        return None
    folder = root / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    kept = keyed_packages(folder, key)
    if kept is not None:
        os.utime(kept / META)  # its last use: what the pruning below goes by
        _prune(root, keep_folder=kept)
    return kept


def _prune(root: Path, keep_folder: Path) -> None:
    def last_use(folder: Path) -> float:
        try:
            return (folder / META).stat().st_mtime
        except OSError:
            return 0.0

    folders = sorted((f for f in root.iterdir() if f.is_dir() and f != keep_folder), key=last_use, reverse=True)
    for folder in folders[KEPT_BUILDS - 1:]:
        log(f"O2 packages of another build removed from {folder} (the {KEPT_BUILDS} most recently used are kept)")
        shutil.rmtree(folder, ignore_errors=True)
        digests_path(folder).unlink(missing_ok=True)
