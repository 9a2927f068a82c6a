"""What `autotune serve` builds for an OpenVINO recipe: the engine loop (autotune/serve/engine_loop.py) asks it for a
step runner as it asks autotune's engine, and gets OpenVINO's pipeline with the recipe's knobs; the server around it
(guard, OpenAI API, streaming, metrics) is the one every recipe gets."""
from __future__ import annotations

from pathlib import Path

from autotune.config.deploy import DeployConfig
from autotune.openvino.pipeline import OpenVinoPipeline

__all__ = ["OpenVinoServing"]


class OpenVinoServing:
    """The recipe's IR folder, configuration and threads; `runner()` makes the pipeline (once per engine loop, and
    again after a failed step)."""

    packaged = None  # no AOTInductor packages: nothing for a first-start check of compiled graphs

    def __init__(self, folder: Path, config: DeployConfig, threads: int) -> None:
        self.folder, self.config, self.threads = folder, config, threads

    @property
    def build_record(self) -> dict:
        return {"artifact": "openvino-ir"}

    def runner(self, *, max_seq_len: int, pool_tokens: int | None = None, prefill_chunk: int | None = None,
               bucketed: bool = False) -> OpenVinoPipeline:
        """The pipeline: its scheduler chunks prompts by the recipe's max_num_batched_tokens and holds its own KV
        cache (the engine's page pool and prefill chunk do not apply)."""
        return OpenVinoPipeline(self.folder, self.config, self.threads)

    def enter_thread(self) -> None:
        """OpenVINO's threads are its own: nothing to set per calling thread."""
