"""What a trial needs from the accelerator it runs on: placement, synchronisation for timing, peak memory from the
device's allocator, the compile path of each fusion level, the quantized linear path of each scheme, and the knobs
the hardware cannot honour, and the build. Every trial, `verify` and `serve` build and measure through one: the CPU's
is autotune/devices/cpu.py. A Device is below the trial: it knows the engine, not the backends that pick it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.probe.capabilities import Capabilities
from autotune.space.search_space import SearchSpace

__all__ = ["CompileOptions", "Limit", "Device", "apply_limits"]


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """How one fusion level compiles a segment: `backend` is "inductor" or "torchair"; the rest are that
    backend's settings (torch.compile's `mode`, inductor freezing, torchair's CompilerConfig fields)."""

    backend: str
    mode: str | None = None
    freezing: bool = False
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Limit:
    """A dimension the device cannot honour in full: `remove` lists the values it cannot run (None: the whole
    dimension goes), with the reason recorded in the space."""

    dimension: str
    remove: tuple[Any, ...] | None
    reason: str


def apply_limits(space: SearchSpace, limits: list[Limit]) -> SearchSpace:
    """The space without what `limits` removes; each removal's reason lands in `space.dropped`."""
    for limit in limits:
        if limit.dimension not in {d.name for d in space.dimensions}:
            continue
        values = space.dimension(limit.dimension).values
        keep = () if limit.remove is None else tuple(v for v in values if v not in limit.remove)
        if keep != values:
            space = space.restrict(limit.dimension, keep, limit.reason)
    return space


class Device(ABC):
    """Contract: `torch_device` names where tensors live; `synchronize()` waits for queued work (timing reads a
    host clock only after it); `reset_peak_memory()` / `peak_memory_bytes()` bracket a measurement with the device
    allocator's high-water mark; `compile_options(level)` is a pure mapping (None: eager); `quantizer(scheme)`
    returns the engine Quantizer that runs the scheme on this device; `limits()` lists what it cannot honour;
    `capabilities()` says which precisions it computes natively (autotune/probe/), None where it cannot tell."""

    name: str = ""
    torch_device: str = "cpu"

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def reset_peak_memory(self) -> None: ...

    @abstractmethod
    def peak_memory_bytes(self) -> int: ...

    @abstractmethod
    def compile_options(self, fusion_level: str) -> CompileOptions | None: ...

    @abstractmethod
    def quantizer(self, scheme: str): ...  # -> autotune.engine.quant.Quantizer

    def limits(self) -> list[Limit]:
        return []

    def start_peak(self) -> bool:
        """The benchmark's (benchmark/meter.py Meter): an allocator's statistics are always resettable."""
        self.reset_peak_memory()
        return True

    def peak_since(self, base_rss: int) -> int:
        """The allocator's high-water mark: the process's memory before loading (`base_rss`) is not in it."""
        return self.peak_memory_bytes()

    def build(self, hf_model, config, plan=None, packages=None):
        """The engine of `config` on this device (engine/build.py build_on_device); `packages` (AOTInductor's, for
        O2 on the CPU) means nothing here."""
        from autotune.engine.build import build_on_device

        return build_on_device(hf_model, config, self, plan)

    def capabilities(self) -> Capabilities | None:
        return None

    def compile(self, fn: Callable, fusion_level: str) -> Callable:
        """`fn` compiled as `compile_options(fusion_level)` says (unchanged when eager)."""
        options = self.compile_options(fusion_level)
        if options is None:
            return fn
        import torch

        return torch.compile(fn, mode=options.mode)
