"""One OpenVINO deployment: a DeployConfig of the openvino runtime (its knobs are config/openvino_knobs.py's;
batch_size is the scheduler's max_num_seqs, device_power the threads). Kept free of openvino: a study's process
builds and stores these without loading it."""
from __future__ import annotations

from autotune.config.deploy import DeployConfig, OpenVinoKnobs

__all__ = ["OPENVINO", "openvino_config", "PIPELINE_DEFAULTS"]

# This runtime's name (autotune/config/runtimes.py).
OPENVINO = OpenVinoKnobs.RUNTIME


def openvino_config(config: DeployConfig | dict) -> DeployConfig:
    """`config` (or a stored one), refused where it is another runtime's."""
    return DeployConfig.of_runtime(OPENVINO, config, "OpenVINO")


# What a user who exports with `optimum-cli export openvino --weight-format fp16` and sets nothing but the batch runs:
# SchedulerConfig's defaults but max_num_seqs, the CPU plugin's precisions (bf16 where native, a u8 KV cache),
# every core.
PIPELINE_DEFAULTS = DeployConfig(runtime=OPENVINO, batch_size=16, device_power=0)
