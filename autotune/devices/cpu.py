"""This machine's CPU as a Device: the one path trials, `verify` and `serve` take on the CPU."""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

from autotune.benchmark.meter import HostMeter
from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak
from autotune.devices.base import CompileOptions, Device
from autotune.engine.build import COMPILE_MODES, build_engine
from autotune.engine.quant import QUANTIZERS
from autotune.paths import cache_root, private_dir

__all__ = ["CpuDevice", "scratch_packages"]


def scratch_packages() -> Path:
    """A private folder of its own for one build's O2 packages, where nothing keeps them (`verify`, a trial where
    devices/kept_packages.py keeps none). A process killed at its limit cannot remove its own: the folders of
    processes no longer alive go first."""
    root = private_dir(cache_root() / "scratch")
    for folder in root.glob("o2-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"o2-{os.getpid()}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class CpuDevice(HostMeter, Device):
    """Memory is the process's RSS high-water mark (autotune/benchmark/meter.py HostMeter); compile modes are
    engine/build.py's COMPILE_MODES, quantizers engine/quant.py's QUANTIZERS; the build is engine/build.py's
    build_engine, with its prepacking, spilling and AOTInductor packages.

    O2 is always built as AOTInductor packages (engine/packaged.py), in trials and `verify` too, not only where
    `serve` keeps them: the program that the gate and the benchmark judged is then the kind of program that is
    served (the same export, the same inductor settings, native code loaded the same way), not a torch.compile of
    the same graphs. Where the caller keeps no folder, the packages live in a scratch folder removed with the
    engine."""

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
        scratch = packages is None and COMPILE_MODES[config.fusion_level] == "freezing"
        if scratch:
            packages = scratch_packages()
        engine = build_engine(hf_model, config, plan=plan, packages=packages)
        if scratch:
            weakref.finalize(engine, shutil.rmtree, packages, True)
        return engine
