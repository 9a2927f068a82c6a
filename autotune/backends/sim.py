"""The simulator as a backend: every trial is a prediction of the analytical model (autotune/sim), labelled as
simulated. It measures nothing: not speed, not memory, not goodput (under an SLO, a discrete-event run of the serving
scheduler predicts it: sim/served.py), and not the accuracy gate."""
from __future__ import annotations

from autotune.backends.base import Backend
from autotune.config.deploy import DTYPES, DeployConfig
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.models.registry import resolve_model
from autotune.probe.capabilities import Capabilities, Precision, restrict_space
from autotune.sim.hardware import HardwareProfile, list_profiles, load_profile
from autotune.sim.predict import predict
from autotune.sim.served import predict_goodput
from autotune.space.search_space import SearchSpace
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["SimBackend", "GATE_NOT_MEASURED", "SIMULATOR_VERSION"]

SIMULATOR_VERSION = "1"
# Knobs the analytical model has no terms for: simulating them would only repeat one prediction under many names.
_NOT_SIMULATED = {
    "quant_method": "a quantization method changes accuracy, which the simulator does not predict (speed only by an "
                    "elementwise scale per layer); verify on real hardware",
    "fallback_layers": "the simulator's byte model holds one precision for every decoder layer, not per-layer "
                       "fallbacks",
}
GATE_NOT_MEASURED = {
    "measured": False,
    "reason": "the accuracy gate cannot be simulated: verify the recipe on real hardware (autotune verify)",
}


class SimBackend(Backend):
    """Backend "sim": `hardware` names a profile in hardware/ (see `autotune hardware`)."""

    name = "sim"
    measured = False
    takes_hardware = True

    def __init__(self, hardware: str | None = None) -> None:
        self.hardware = hardware
        self._profile: HardwareProfile | None = None

    @property
    def profile(self) -> HardwareProfile:
        if self._profile is None:
            if self.hardware is None:
                raise AutotuneError("the sim backend has no hardware profile")
            self._profile = load_profile(self.hardware)
        return self._profile

    def unavailable(self) -> str | None:
        if self.hardware is None:
            return f"the simulator needs --hardware, one of: {', '.join(list_profiles())}"
        self.profile  # noqa: B018 - load now, so that a bad profile is a user error before any trial
        return None

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        profile = self.profile
        names = {d.name for d in space.dimensions}
        if "device_power" in names:
            values = space.dimension("device_power").values
            if profile.power_kind == "none" or not profile.power_levels:
                space = space.restrict("device_power", (), f"{profile.name}: {profile.power_reason}")
            else:
                keep = tuple(v for v in values if v in profile.power_levels)
                if keep != values:
                    space = space.restrict("device_power", keep, f"{profile.name} has the levels "
                                           f"{sorted(profile.power_levels)} ({profile.power_reason})")
        if "quant" in names and profile.int8_tops <= 0:
            keep = tuple(v for v in space.dimension("quant").values if v != "w8a8")
            space = space.restrict("quant", keep, f"{profile.name} has no int8 matmul units")
        for name, reason in _NOT_SIMULATED.items():
            if name in names:
                space = space.restrict(name, (), reason)
        return restrict_space(space, self.capabilities())

    def capabilities(self) -> Capabilities:
        """The precisions the profile states a rate for, highest rate first; the others with the profile's reason."""
        p = self.profile
        precisions = [Precision(d, True, True, f"{p.tflops[d]:g} TFLOPS dense in the profile") if d in p.tflops else
                      Precision(d, False, False, p.precision_notes.get(d, "the profile states no rate for it"))
                      for d in DTYPES]
        order = ("bf16", "fp16", "fp32")
        precisions.sort(key=lambda q: (not q.offered, -p.tflops.get(q.name, 0.0), order.index(q.name)))
        return Capabilities(f"sim:{p.name}", p.description, tuple(precisions))

    def run(self, job: Job, timeout_s: float) -> JobResult:
        if job.kind is not JobKind.TRIAL:
            return JobResult.error(f"the simulator cannot run a {job.kind.value!r} job: it measures nothing")
        try:
            spec, config = resolve_model(job.model), DeployConfig.from_dict(job.config)
            workload = Workload(**job.workload)
            prediction = predict(spec, config, workload, self.profile)
        except (AutotuneError, ValueError) as exc:
            return JobResult.error(str(exc))
        versions = {"simulator": SIMULATOR_VERSION, "profile": self.profile.label,
                    "calibration": self.profile.calibration_source}
        result = JobResult(Status.OK, source="simulated", profile=self.profile.label, versions=versions)
        if not prediction.feasible:
            result.status, result.reason = Status.INFEASIBLE, f"simulated: {prediction.reason}"
            return result
        result.bench, result.gate, result.build_s = prediction.bench(), dict(GATE_NOT_MEASURED), 0.0
        result.prediction = prediction.to_dict()
        if job.slo is not None:  # a discrete-event run of the serving scheduler, labelled simulated
            result.goodput = predict_goodput(spec, config, workload, self.profile, Slo(**job.slo))
            result.bench["goodput_req_s"] = result.goodput["goodput_req_s"]
            result.bench["goodput_tok_s"] = result.goodput["goodput_tok_s"]
        return result

    def fingerprint(self) -> dict:
        p = self.profile
        return {"hardware": p.name, "profile": p.label, "simulated": True, "description": p.description,
                "calibration": p.calibration_source, "tflops": p.tflops, "int8_tops": p.int8_tops,
                "memory_gb": p.memory_gb, "bandwidth_gbs": p.bandwidth_gbs}
