"""The deployment of autotune's engine that the simulator predicts in place of another runtime's configuration: the
same arithmetic (the runtime's cost view, `cost_knobs`: the weights' bytes, the matmuls' precision, the KV block),
the same sequences and threads, run as one compiled graph. OpenVINO's CPU plugin and llama.cpp's ggml both run the
whole model as a graph of fused kernels, with no Python between operators, which is what the engine's O2 is to
the simulator. What differs between the runtimes beyond that (their kernels, their schedulers) is left to the
efficiency factors, which the guide fits per runtime to that runtime's own trials (study/guide.py)."""
from __future__ import annotations

from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME

__all__ = ["stand_in", "GRAPH_LEVEL"]

# The engine's fusion level that stands for a runtime running the whole model as one graph.
GRAPH_LEVEL = "O2"


def stand_in(config: DeployConfig) -> DeployConfig | None:
    """The engine configuration the simulator predicts for `config`: itself for the engine; None where the runtime
    has no cost view of this configuration (a quantized GGUF)."""
    if config.runtime == DEFAULT_RUNTIME:
        return config
    knobs = config.knobs.cost_knobs()
    if knobs is None:
        return None
    return DeployConfig(quant=knobs["quant"], dtype=knobs["dtype"], page_size=knobs["page_size"],
                        fusion_level=GRAPH_LEVEL, layers_per_subgraph=0, batch_size=config.batch_size,
                        device_power=config.device_power)
