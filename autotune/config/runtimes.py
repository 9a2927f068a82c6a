"""What can run a model, and which knobs belong to each: autotune's own engine (torch), llama.cpp (a GGUF file,
through llama-cpp-python in trials and llama-server in serving) and OpenVINO GenAI (an OpenVINO IR through its
ContinuousBatchingPipeline). The one place that tells the runtimes apart: a
configuration, a space file, a backend and a recipe name a runtime, and whatever differs between runtimes is
asked of the Runtime here (or of its knob class), never branched on by name elsewhere.

Kept free of the configuration class (autotune/config/deploy.py uses this module)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from autotune.config.engine_knobs import EngineKnobs
from autotune.config.llamacpp_knobs import LlamaCppKnobs
from autotune.config.openvino_knobs import OpenVinoKnobs

__all__ = ["Runtime", "RUNTIMES", "DEFAULT_RUNTIME", "SHARED_KNOBS", "ENGINE_KNOBS", "LLAMACPP_KNOBS", "OPENVINO_KNOBS",
           "runtime_of", "other_knobs", "Knobs", "SERVED_BY"]

Knobs = EngineKnobs | LlamaCppKnobs | OpenVinoKnobs
# Every runtime's: the sequences decoded together (the engine's batch, llama.cpp's parallel sequences) and the
# device power level (on the CPU, the threads).
SHARED_KNOBS = ("batch_size", "device_power")
ENGINE_KNOBS = tuple(f.name for f in fields(EngineKnobs))
LLAMACPP_KNOBS = tuple(f.name for f in fields(LlamaCppKnobs))
OPENVINO_KNOBS = tuple(f.name for f in fields(OpenVinoKnobs))
# How a runtime's recipes are served: "autotune", by `autotune serve`'s own server (guard, OpenAI API, metrics) whose
# engine loop drives the runtime's step runner in its process; "llama-server", llama.cpp's server exec'd by
# `autotune serve`.
SERVED_BY = ("autotune", "llama-server")


@dataclass(frozen=True)
class Runtime:
    """`knob_class`: its own knobs (besides SHARED_KNOBS), their validation, labels and key rules; `server`: what
    serves its recipes, in words; `served_by`: how `autotune serve` runs them (SERVED_BY); `trial_entry`: the module
    whose `main` runs one of its trials in a child process (`python -m ENTRY ENVELOPE RESULT`); `space_file`: its
    default space under search_spaces/; `named`: whether a stored configuration names it (the engine's predate
    runtimes and do not, so that they read, digest and key as before)."""

    name: str
    knob_class: type
    server: str
    served_by: str
    trial_entry: str
    space_file: str
    named: bool = True

    def __post_init__(self) -> None:
        assert self.served_by in SERVED_BY, self.served_by

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.knob_class))


DEFAULT_RUNTIME = EngineKnobs.RUNTIME
RUNTIMES: dict[str, Runtime] = {
    "engine": Runtime("engine", EngineKnobs, server="autotune's engine (autotune serve)", served_by="autotune",
                      trial_entry="autotune.trial", space_file="default.yaml", named=False),
    "llamacpp": Runtime("llamacpp", LlamaCppKnobs, server="llama-server", served_by="llama-server",
                        trial_entry="autotune.llamacpp.trial", space_file="llamacpp.yaml"),
    "openvino": Runtime("openvino", OpenVinoKnobs,
                        server="OpenVINO GenAI's ContinuousBatchingPipeline in autotune serve", served_by="autotune",
                        trial_entry="autotune.openvino.trial", space_file="openvino.yaml"),
}


def runtime_of(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"runtime must be one of {tuple(RUNTIMES)}, not {name!r}") from None


def other_knobs(name: str) -> tuple[str, ...]:
    """The knobs of every runtime but `name`: what a configuration or a space of `name` must not set."""
    return tuple(k for r in RUNTIMES.values() if r.name != name for k in r.knobs)
