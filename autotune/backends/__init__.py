"""Backends by name: each implements autotune.backends.base.Backend. They depend on the trial's job types, the
devices and the simulator; nothing below them imports them."""
from __future__ import annotations

from autotune.backends.base import Backend
from autotune.backends.cpu import CpuBackend
from autotune.backends.cuda import CudaBackend
from autotune.backends.faults import FaultBackend
from autotune.backends.isolated import IsolatedBackend
from autotune.backends.llamacpp import LlamaCppBackend
from autotune.backends.npu import NpuBackend
from autotune.backends.openvino import OpenVinoBackend
from autotune.backends.sim import SimBackend
from autotune.errors import BackendUnavailable, UserInputError

__all__ = ["Backend", "BACKENDS", "get_backend", "make_backend"]

BACKENDS: dict[str, type[Backend]] = {"cpu": CpuBackend, "cuda": CudaBackend, "npu": NpuBackend, "sim": SimBackend,
                                      "llamacpp": LlamaCppBackend, "openvino": OpenVinoBackend}
# Test doubles: reachable by name (workers and child processes find them), never listed.
_HIDDEN: dict[str, type[Backend]] = {"sim-faults": FaultBackend}


def get_backend(name: str, hardware: str | None = None) -> Backend:
    """`hardware` names a profile, for backends that model hardware they do not run on (the simulator)."""
    if name not in BACKENDS and name not in _HIDDEN:
        raise BackendUnavailable(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    cls = BACKENDS.get(name) or _HIDDEN[name]
    takes_hardware = getattr(cls, "takes_hardware", False)
    if hardware is not None and not takes_hardware:
        raise UserInputError(f"--hardware applies to the sim backend only; backend {name!r} runs on this machine")
    backend = cls(hardware) if takes_hardware else cls()  # type: ignore[call-arg]
    reason = backend.unavailable()
    if reason:
        raise BackendUnavailable(f"backend {name!r} cannot run here: {reason}")
    return backend


def make_backend(name: str, hardware: str | None, isolate: bool, memory_mb: float | None) -> Backend:
    """The backend of a study, with each trial's memory limit. In-process backends (the simulator) run each
    trial in a child process when isolation is asked for, or when a memory limit must be enforced (it can only be
    set on a process)."""
    backend = get_backend(name, hardware)
    if (isolate or memory_mb) and not backend.measured:
        return IsolatedBackend(backend, memory_mb)
    backend.memory_limit_mb = memory_mb
    return backend
