"""The backend interface: where trials run, and which knobs that hardware can honour."""
from __future__ import annotations

from abc import ABC, abstractmethod

from autotune.config.runtimes import DEFAULT_RUNTIME, runtime_of
from autotune.errors import SpaceError
from autotune.gate.cache import numerics_versions
from autotune.host import num_cores
from autotune.probe.capabilities import Capabilities
from autotune.space.search_space import SearchSpace
from autotune.trial.job import Job, JobResult

__all__ = ["Backend", "restrict_to_cores"]


class Backend(ABC):
    """Contract:
    - `unavailable()` says why this backend cannot run here (None when it can): packages or hardware missing.
    - `adapt_space(space)` returns the space restricted to what the backend can honour; every removed value or
      dimension carries its reason in `SearchSpace.dropped`, nothing is faked.
    - `run(job, timeout_s)` executes a Job and returns its JobResult; a crash, hang or error in the job comes
      back as a result with status ERROR and its reason, never as an exception. A backend that runs jobs in a
      child process enforces `memory_limit_mb` (None: unlimited) on it.
    - `fingerprint()` describes the hardware and software that produced the figures.
    - `capabilities()` says what the hardware computes natively (autotune/probe/), as adapt_space used it; None
      where nothing was probed.
    - `gate_versions()` names the software whose kernels decide its gate figures, for the gate cache's key;
      `gate_identity(config)` is the (device, versions) a configuration's gate figures are keyed under (a backend
      that runs several runtimes answers per runtime).
    `measured` is False for backends whose figures are predictions (the simulator). `runtime` is what runs its
    trials' configurations (config/runtimes.py): it searches spaces of that runtime only (`space_for`)."""

    name: str = ""
    runtime: str = DEFAULT_RUNTIME
    measured: bool = True
    memory_limit_mb: float | None = None

    @abstractmethod
    def unavailable(self) -> str | None: ...

    @abstractmethod
    def adapt_space(self, space: SearchSpace) -> SearchSpace: ...

    @abstractmethod
    def run(self, job: Job, timeout_s: float) -> JobResult: ...

    @abstractmethod
    def fingerprint(self) -> dict: ...

    def capabilities(self) -> Capabilities | None:
        return None

    def space_for(self, space: SearchSpace) -> SearchSpace:
        """`space` adapted to this backend, refused where it is another runtime's: its knobs would have nothing
        to be set on here."""
        if space.runtime != self.runtime:
            raise SpaceError(f"{space.source}: a space of the {space.runtime} runtime, and backend {self.name} runs "
                             f"{self.runtime}: give it a {self.runtime} space (its default: "
                             f"search_spaces/{runtime_of(self.runtime).space_file})")
        return self.adapt_space(space)

    def gate_versions(self) -> dict:
        return numerics_versions()

    def gate_identity(self, config) -> tuple[str, dict]:
        """(device name, versions) that `config`'s gate figures are keyed under, as its trial's child keys them."""
        return self.name, self.gate_versions()

    def hardware_name(self) -> str:
        """A short, stable name of the hardware class, used in recipe paths."""
        return self.fingerprint()["hardware"]


def restrict_to_cores(space: SearchSpace, what: str) -> SearchSpace:
    """The space with `device_power`, where it is a thread count (`what` says whose), kept to this machine's cores:
    the levels above them dropped with the reason, or the core count alone where no level fits."""
    if "device_power" not in {d.name for d in space.dimensions}:
        return space
    cores = num_cores()
    values = space.dimension("device_power").values
    keep = tuple(v for v in values if v <= cores)
    if keep == values:
        return space
    return space.restrict("device_power", keep or (cores,),
                          f"device_power is {what} and this machine has {cores} cores")


