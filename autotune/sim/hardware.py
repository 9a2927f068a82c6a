"""Hardware profiles: peaks from public sources, efficiency factors written by scripts/calibrate_sim.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.config.deploy import DTYPES
from autotune.errors import UserInputError
from autotune.sim.microbench import measured_peaks

__all__ = ["HARDWARE_DIR", "HardwareProfile", "Factors", "list_profiles", "load_profile", "profile_path",
           "read_profile_data"]

HARDWARE_DIR = Path(__file__).resolve().parent.parent.parent / "hardware"


@dataclass(frozen=True, slots=True)
class Factors:
    """What the roofline alone gets wrong. Each value comes from the profile's `calibration.factors` when the
    calibration script could fit it, otherwise from its `assumptions` (priors, stated as such in the file)."""

    compute_eff: float  # fraction of peak FLOPS that large matmuls reach (prefill)
    bandwidth_eff: float  # fraction of peak bandwidth that weight streaming reaches (decode)
    quant_bw_eff: dict[str, float]  # streaming efficiency of each quant scheme relative to quant none (dequant cost)
    eager_launch_us: float  # host dispatch + launch of one operator in eager mode (O0)
    graph_launch_us: float  # launch of one compiled subgraph (O1/O2)
    kernel_us: float  # fixed device cost of one kernel inside a graph
    seq_step_us: float  # per-sequence bookkeeping of one decode step (block table, sampling)
    workspace_mb: float  # runtime reserve not explained by weights, KV pages and activations
    static_power_fraction: float  # board power drawn whatever the clock


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """`tflops`: dense matmul peak per precision the hardware computes natively (a precision without one is not
    offered: `precision_notes` says why). `kernel_slowdown`: "scheme@dtype" -> how many times slower than the
    plain matmul of the dtype a quantized kernel ran (measured by the CPU's capability probe; empty elsewhere)."""

    name: str
    version: int
    description: str
    tflops: dict[str, float]
    int8_tops: float
    memory_gb: float  # GiB of device memory (HBM sizes are binary)
    bandwidth_gbs: float  # GB/s (decimal), peak
    power_w: float | None
    factors: Factors
    power_levels: dict[int, dict[str, float]]  # device_power level -> {"clock": f, "bandwidth": g}
    power_kind: str  # "clock", "threads" or "none"
    power_reason: str
    calibration_source: str
    sources: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. load_bytes_per_param on the CPU
    precision_notes: dict[str, str] = field(default_factory=dict)
    kernel_slowdown: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def fastest_precision(self) -> str:
        """The highest-rate precision (bf16 before fp16 before fp32 at equal rates)."""
        order = ("bf16", "fp16", "fp32")
        return max(self.tflops, key=lambda d: (self.tflops[d], -order.index(d)))

    def matmul_tflops(self, dtype: str) -> float:
        if dtype not in self.tflops:
            why = self.precision_notes.get(dtype, "the profile states no rate for it")
            raise UserInputError(f"{self.name} does not compute {dtype}: {why}")
        return self.tflops[dtype]

    def level(self, device_power: int) -> dict[str, float]:
        """Clock and bandwidth fractions of a device_power level; 0 (the default) is the full device."""
        if device_power == 0 or not self.power_levels:
            return {"clock": 1.0, "bandwidth": 1.0}
        if device_power not in self.power_levels:
            raise UserInputError(f"device_power={device_power} is not a level of {self.name}; "
                                 f"levels: {sorted(self.power_levels) or 'none (the full device only)'}")
        return {"clock": 1.0, "bandwidth": 1.0, **self.power_levels[device_power]}


def profile_path(name: str) -> Path:
    return HARDWARE_DIR / f"{name}.yaml"


def list_profiles() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))


def read_profile_data(name: str) -> dict[str, Any]:
    path = profile_path(name)
    if not path.is_file():
        raise UserInputError(f"unknown hardware profile {name!r}; profiles: {', '.join(list_profiles())}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserInputError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or data.get("name") != name:
        raise UserInputError(f"{path}: a profile must be a mapping whose name is {name!r}")
    return data


def _factors(data: dict[str, Any], calibrated: bool) -> Factors:
    priors = dict(data.get("assumptions") or {})
    fitted = dict((data.get("calibration") or {}).get("factors") or {}) if calibrated else {}
    merged = {**priors, **fitted}
    quant = {"none": 1.0, **(priors.get("quant_bw_eff") or {}), **(fitted.get("quant_bw_eff") or {})}
    merged["quant_bw_eff"] = quant
    missing = [f for f in Factors.__dataclass_fields__ if f not in merged]
    if missing:
        raise UserInputError(f"hardware profile {data['name']}: no value for {missing} in calibration or assumptions")
    return Factors(**{k: merged[k] for k in Factors.__dataclass_fields__})


def load_profile(name: str, calibrated: bool = True) -> HardwareProfile:
    """Read hardware/<name>.yaml; a profile whose peaks say `measure` gets them from this machine (cached).
    With calibrated=False the factors are the stated priors alone (where a calibration starts)."""
    data = read_profile_data(name)
    peaks = data.get("peaks")
    power = dict(data.get("device_power") or {"kind": "none", "reason": "no power levels in the profile"})
    if peaks == "measure":
        peaks = measured_peaks()
        if power.get("levels") == "measure":  # thread counts, at the fractions the micro-benchmark saw
            power["levels"] = peaks["levels"]
    levels = {int(k): dict(v) for k, v in (power.get("levels") or {}).items()}
    calib = data.get("calibration") or {}
    try:
        return HardwareProfile(
            name=name, version=int(data["version"]), description=str(data.get("description", "")),
            tflops={d: float(peaks[f"{d}_tflops"]) for d in DTYPES if peaks.get(f"{d}_tflops")},
            int8_tops=float(peaks["int8_tops"]),
            memory_gb=float(peaks["memory_gb"]), bandwidth_gbs=float(peaks["bandwidth_gbs"]),
            power_w=None if peaks.get("power_w") is None else float(peaks["power_w"]),
            factors=_factors(data, calibrated), power_levels=levels, power_kind=str(power.get("kind", "none")),
            power_reason=str(power.get("reason", "")),
            calibration_source=str(calib.get("source", "uncalibrated: assumptions only")) if calibrated
            else "uncalibrated: assumptions only",
            sources=tuple(data.get("sources") or ()), extra=dict(data.get("extra") or {}),
            precision_notes={**dict(data.get("precisions") or {}), **dict(peaks.get("precision_notes") or {})},
            kernel_slowdown=dict(peaks.get("kernel_slowdown") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserInputError(f"{profile_path(name)}: malformed profile ({exc!r})") from None
