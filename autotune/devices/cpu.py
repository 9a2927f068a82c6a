"""This machine's CPU as a Device, for callers that want one interface over every device kind."""
from __future__ import annotations

from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak
from autotune.devices.base import CompileOptions, Device
from autotune.engine.build import COMPILE_MODES
from autotune.engine.quant import QUANTIZERS

__all__ = ["CpuDevice"]


class CpuDevice(Device):
    """The CPU as the engine already uses it: memory is the process's RSS high-water mark (autotune/benchmark/peak_rss.py),
    compile modes are engine/build.py's COMPILE_MODES, quantizers engine/quant.py's QUANTIZERS."""

    name = "cpu"
    torch_device = "cpu"

    def synchronize(self) -> None:
        return None  # CPU kernels return when done

    def reset_peak_memory(self) -> None:
        reset_peak()

    def peak_memory_bytes(self) -> int:
        return peak_rss_bytes()

    def compile_options(self, fusion_level: str) -> CompileOptions | None:
        mode = COMPILE_MODES[fusion_level]
        return None if mode is None else CompileOptions("inductor", freezing=mode == "freezing")

    def quantizer(self, scheme: str):
        return QUANTIZERS[scheme]()
