"""llama.cpp on this machine's CPU as a backend (optional: `pip install autotune[llamacpp]`): each trial makes the
configuration's GGUF, runs the accuracy gate on llama.cpp's own logits against the same fp32 reference, and
benchmarks llama.cpp's continuous batching on the study's workload, in its own process
(autotune/llamacpp/trial.py). The reference and the speed baselines are transformers', as for the cpu backend.

Its space is of the llamacpp runtime (search_spaces/llamacpp.yaml): llama.cpp's own knobs (GGUF type, flash
attention, KV cache type, n_batch/n_ubatch, context size), with batch_size as llama.cpp's parallel sequences and
device_power as its threads."""
from __future__ import annotations

from autotune.backends.base import restrict_to_cores
from autotune.backends.peer import PeerBackend
from autotune.host import cpu_fingerprint
from autotune.llamacpp.build_info import installed, numerics_versions
from autotune.llamacpp.trial import GATE_DEVICE
from autotune.space.search_space import SearchSpace

__all__ = ["LlamaCppBackend"]


class LlamaCppBackend(PeerBackend):
    name = GATE_DEVICE
    runtime = "llamacpp"

    def unavailable(self) -> str | None:
        if installed() is None:
            return ("llama-cpp-python is not installed: pip install 'autotune[llamacpp]', or scripts/build_llamacpp.sh "
                    "for a build with this CPU's instructions and llama.cpp's tools")
        return None

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        return restrict_to_cores(space, "llama.cpp's thread count")

    def gate_versions(self) -> dict:
        return numerics_versions()

    def fingerprint(self) -> dict:
        """The CPU's, its class prefixed: a llama.cpp recipe never shares a folder (or a digest's file name) with
        the cpu backend's recipes of the same configuration values."""
        cpu = cpu_fingerprint()
        return {**cpu, "hardware": f"llamacpp-{cpu['hardware']}", "llama_cpp_python": installed()}
