"""Where a recipe runs: the backend its figures belong to, and where it can run on this machine.

A measured recipe names its backend. A simulated one names the hardware profile it was predicted for, and the
profile's `device` (hardware/*.yaml) says which backend that hardware is. device_power is a thread count only
where the recipe's backend is the CPU; on a simulated GPU it is a clock level, which must never become a number of
CPU threads."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.backends import get_backend
from autotune.errors import BackendUnavailable, UserInputError
from autotune.recipes.recipe import Recipe
from autotune.sim.hardware import read_profile_data

__all__ = ["Target", "Placement", "recipe_target", "backend_missing", "place", "THREADS_BACKENDS"]

# The backends whose device_power is a thread count on this machine's CPU.
THREADS_BACKENDS = ("cpu", "llamacpp", "openvino")


@dataclass(frozen=True, slots=True)
class Target:
    """What a recipe says about where its figures come from. `backend`: "cpu", "cuda" or "npu" (None: a simulated
    profile that names no device, or one this checkout does not have); `power_kind`: what device_power means on
    it ("threads", "clock" or "none")."""

    backend: str | None
    hardware: str
    simulated: bool
    power_kind: str

    def describe(self) -> str:
        what = "simulated for" if self.simulated else "measured on"
        return f"{what} {self.hardware} ({self.backend or 'an unknown backend'})"


def recipe_target(recipe: Recipe) -> Target:
    data = recipe.data
    hardware = str((data.get("hardware") or {}).get("hardware") or "unknown hardware")
    if not recipe.simulated:
        backend = data["backend"]
        return Target(backend, hardware, False, "threads" if backend in THREADS_BACKENDS else "none")
    try:
        profile = read_profile_data(hardware)
    except UserInputError:
        return Target(None, hardware, True, "none")  # a profile made elsewhere: its hardware is unknown here
    power = (profile.get("device_power") or {}).get("kind", "none")
    return Target(profile.get("device"), hardware, True, str(power))


def backend_missing(name: str) -> str | None:
    """Why this machine cannot run backend `name`, in one line; None when it can."""
    try:
        get_backend(name)
    except BackendUnavailable as exc:
        return " ".join(str(exc).split())
    return None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a recipe runs here. `threads`: the torch thread count to set (its device_power, where that is a
    thread count on this backend), else None. `why`: why it is not on the recipe's backend (None when it is)."""

    backend: str
    target: Target
    threads: int | None
    why: str | None = None

    @property
    def comparable(self) -> bool:
        """Whether figures measured here are of the backend the recipe's figures are of."""
        return self.backend == self.target.backend


def place(recipe: Recipe, missing: Callable[[str], str | None] | None = None) -> Placement:
    """On the recipe's backend when this machine has it. A simulated recipe falls back to the CPU (its figures are
    then not comparable); a measured one whose backend is absent is refused in one line (BackendUnavailable)."""
    missing = missing or backend_missing
    target = recipe_target(recipe)
    why = missing(target.backend) if target.backend is not None else f"no backend is known for {target.hardware}"
    if why is None:
        backend = target.backend
    elif target.simulated:
        backend = "cpu"
    else:
        raise BackendUnavailable(f"recipe {recipe.path} was {target.describe()}, which this machine lacks: {why}; "
                                 f"use it where {target.backend} is, or search and export a recipe for this machine")
    assert backend is not None
    power = recipe.config.device_power
    threads = power if power and backend in THREADS_BACKENDS and target.power_kind == "threads" else None
    return Placement(backend, target, threads, why)
