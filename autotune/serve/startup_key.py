"""What a served recipe's start-up bundle (engine/startup_cache.py) must have been made under to be loaded."""
from __future__ import annotations

import torch

from autotune.code_hash import code_hash
from autotune.devices.kept_packages import kept_packages
from autotune.engine.startup_cache import StartupCache
from autotune.gate.cache import host_numerics, numerics_versions
from autotune.host import cpu_fingerprint
from autotune.models.registry import resolve_model
from autotune.models.weights import model_checksum
from autotune.recipes.recipe import Recipe, recipe_checksum

__all__ = ["startup_key", "startup_cache"]


def startup_key(recipe: Recipe, backend: str) -> dict:
    """What a bundle must have been made under to be loaded: the recipe's content (its checksum computed here, so
    that a recipe accepted with --force is keyed by what it says now), the weights loaded (frozen into O2's
    packages: their checksum here, not the recipe's), the build code (code_hash.py) and the versions of the
    libraries it runs on, this machine's hardware class and the CPU facts that decide rounding (gate/cache.py
    host_numerics), and the backend it was served on."""
    return {"recipe": recipe_checksum(recipe.data), "weights": model_checksum(resolve_model(recipe.model)),
            "torch": torch.__version__, "versions": numerics_versions(), "machine": cpu_fingerprint()["hardware"],
            "host": host_numerics(), "backend": backend, "engine": code_hash()}


def startup_cache(recipe: Recipe, backend: str) -> StartupCache:
    """The recipe's bundle on this machine, keyed as above. O2 on the CPU keeps AOTInductor packages
    (autotune/devices/cpu.py builds O2 so everywhere) in the folder of what was built (devices/kept_packages.py:
    where the recipe's trial ran, its packages), or in the bundle where none can be kept there; the rest, torch's
    cache artifacts."""
    packaged = recipe.config.fusion_level == "O2" and backend == "cpu"
    kept = kept_packages(resolve_model(recipe.model), recipe.config, recipe.kept_layers, backend) if packaged \
        else None
    return StartupCache.keyed(startup_key(recipe, backend), recipe.config.fusion_level, packaged=packaged,
                              packages_folder=kept)
