"""This machine's CPU as a Device: the one path trials, `verify` and `serve` take on the CPU."""
from __future__ import annotations

from autotune.benchmark.meter import HostMeter
from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak
from autotune.devices.base import CompileOptions, Device
from autotune.engine.build import COMPILE_MODES, build_engine
from autotune.engine.quant import QUANTIZERS

__all__ = ["CpuDevice"]


class CpuDevice(HostMeter, Device):
    """Memory is the process's RSS high-water mark (autotune/benchmark/meter.py HostMeter); compile modes are
    engine/build.py's COMPILE_MODES, quantizers engine/quant.py's QUANTIZERS; the build is engine/build.py's
    build_engine, with its prepacking, spilling and AOTInductor packages."""

    name = "cpu"
    torch_device = "cpu"

    def reset_peak_memory(self) -> None:
        reset_peak()

    def peak_memory_bytes(self) -> int:
        return peak_rss_bytes()

    def compile_options(self, fusion_level: str) -> CompileOptions | None:
        mode = COMPILE_MODES[fusion_level]
        return None if mode is None else CompileOptions("inductor", freezing=mode == "freezing")

    def quantizer(self, scheme: str):
        return QUANTIZERS[scheme]()

    def build(self, hf_model, config, plan=None, packages=None):
        return build_engine(hf_model, config, plan=plan, packages=packages)
