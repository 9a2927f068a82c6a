"""OpenVINO GenAI on this machine's CPU as a backend: each trial makes the configuration's IR (exported once per
model, compressed once per weight format), runs the accuracy gate on OpenVINO's own logits and decode against the
same fp32 reference, and benchmarks its ContinuousBatchingPipeline on the study's workload, in its own process
(autotune/openvino/trial.py). The reference and the speed baselines are
transformers', as for the cpu backend.

Its space is of the openvino runtime (search_spaces/openvino.yaml): batch_size is the scheduler's max_num_seqs and
device_power its threads; the inference precision keeps what this CPU computes natively (its capability probe)."""
from __future__ import annotations

from autotune.backends.base import restrict_to_cores
from autotune.backends.peer import PeerBackend
from autotune.host import cpu_fingerprint
from autotune.openvino.build_info import installed, numerics_versions
from autotune.openvino.config import OPENVINO
from autotune.openvino.trial import GATE_DEVICE
from autotune.probe.capabilities import Capabilities
from autotune.probe.cpu import cpu_capabilities
from autotune.space.search_space import SearchSpace

__all__ = ["OpenVinoBackend"]


class OpenVinoBackend(PeerBackend):
    name = GATE_DEVICE
    runtime = OPENVINO

    def unavailable(self) -> str | None:
        if installed() is None:
            return "openvino-genai is not installed: pip install openvino-genai==2026.4.1.0"
        return None

    def capabilities(self) -> Capabilities:
        return cpu_capabilities()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        space = restrict_to_cores(space, "OpenVINO's thread count")
        bf16 = self.capabilities().precision("bf16")
        if "inference_precision" in {d.name for d in space.dimensions} and not (bf16 and bf16.native):
            space = space.restrict("inference_precision", ("f32",),
                                   "bf16 is emulated on this CPU (its capability probe): OpenVINO computes in f32 here")
        return space

    def gate_versions(self) -> dict:
        return numerics_versions()

    def fingerprint(self) -> dict:
        """The CPU's, its class prefixed: an OpenVINO recipe never shares a folder with the cpu backend's."""
        cpu = cpu_fingerprint()
        return {**cpu, "hardware": f"openvino-{cpu['hardware']}", "openvino_genai": installed()}
