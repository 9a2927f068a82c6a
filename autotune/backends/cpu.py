"""This machine's CPU: real builds and real measurements, each trial in its own process. The space keeps the
precisions the capability probe found native (or nearly as fast), fastest first, and the thread counts the machine
has.

The CPU runs more than autotune's engine: the peer runtimes (OpenVINO GenAI, llama.cpp) run here too, and a search
of this backend spans every one this machine can run (`space_over`), each trial dispatched to the backend of its
configuration's runtime, so that one front compares engines on this CPU."""
from __future__ import annotations

from autotune.backends.base import Backend, restrict_to_cores
from autotune.backends.isolated import run_isolated
from autotune.backends.llamacpp import LlamaCppBackend
from autotune.backends.openvino import OpenVinoBackend
from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME, RUNTIMES, runtime_of
from autotune.errors import BackendUnavailable, UserInputError
from autotune.host import cpu_fingerprint
from autotune.probe.capabilities import Capabilities, restrict_space
from autotune.probe.cpu import cpu_capabilities
from autotune.progress import log
from autotune.space.search_space import SearchSpace, combine, default_space, load_space
from autotune.trial.job import Job, JobKind, JobResult

__all__ = ["CpuBackend", "PEERS"]

# The peer runtimes that run on this CPU, by runtime, and their backends.
PEERS: dict[str, type[Backend]] = {"openvino": OpenVinoBackend, "llamacpp": LlamaCppBackend}


class CpuBackend(Backend):
    name = "cpu"

    def unavailable(self) -> str | None:
        return None

    def capabilities(self) -> Capabilities:
        return cpu_capabilities()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        space = restrict_to_cores(space, "the thread count on the CPU")
        return restrict_space(space, self.capabilities())

    def _peer(self, runtime: str) -> Backend:
        peer = PEERS[runtime]()
        peer.memory_limit_mb = self.memory_limit_mb
        return peer

    def run(self, job: Job, timeout_s: float) -> JobResult:
        runtime = _runtime(job)
        if runtime is not None and runtime != DEFAULT_RUNTIME and job.kind in (JobKind.TRIAL, JobKind.HOLDOUT):
            peer = self._peer(runtime)
            why = peer.unavailable()
            return JobResult.error(f"runtime {runtime} cannot run here: {why}") if why else peer.run(job, timeout_s)
        return run_isolated(job, timeout_s, memory_limit_mb=self.memory_limit_mb)

    def gate_identity(self, config: DeployConfig) -> tuple[str, dict]:
        if config.runtime in PEERS:
            return self._peer(config.runtime).gate_identity(config)
        return super().gate_identity(config)

    def runtimes_here(self) -> dict[str, str | None]:
        """Every runtime, with why it cannot run on this machine (None: it can)."""
        return {name: None if name == DEFAULT_RUNTIME else self._peer(name).unavailable() for name in RUNTIMES}

    def space_over(self, runtimes: tuple[str, ...] | None, files: tuple[str, ...] = ()) -> SearchSpace:
        """The default spaces of `runtimes` (None: every runtime this machine can run, each one missing said in a
        line), or the space `files` (one per runtime), each adapted by its runtime's backend, as one space whose
        first dimension is the runtime."""
        here = self.runtimes_here()
        if files:
            loaded = [load_space(f) for f in files]
            for space in loaded:
                if here[space.runtime]:
                    raise BackendUnavailable(f"{space.source}: runtime {space.runtime} cannot run here: "
                                             f"{here[space.runtime]}")
            return combine([(self if s.runtime == DEFAULT_RUNTIME else self._peer(s.runtime)).space_for(s)
                            for s in loaded])
        if runtimes is None:
            for name, why in here.items():
                if why:
                    log(f"runtime {name}: not searched here ({why})")
            runtimes = tuple(name for name, why in here.items() if not why)
        parts = []
        for name in dict.fromkeys(runtimes):
            runtime_of(name)  # an unknown name: the registry's error, naming the runtimes
            if here[name]:
                raise BackendUnavailable(f"runtime {name} cannot run here: {here[name]}")
            backend = self if name == DEFAULT_RUNTIME else self._peer(name)
            parts.append(backend.space_for(load_space(default_space(name))))
        if not parts:
            raise UserInputError("no runtime to search")
        return combine(parts)

    def fingerprint(self) -> dict:
        return cpu_fingerprint()


def _runtime(job: Job) -> str | None:
    try:
        return DeployConfig.from_dict(job.config).runtime if job.config else None
    except (TypeError, ValueError):
        return None  # the engine's trial says what is wrong with it
