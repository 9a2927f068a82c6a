"""OpenVINO GenAI's knobs (an OpenVINO IR run by its ContinuousBatchingPipeline): the weights' format and how NNCF
compresses them, the CPU plugin's inference precision and KV cache precision, and the scheduler. Frozen and
validated in OpenVINO's terms; the shared knobs (the scheduler's max_num_seqs = batch, threads = device power) are
DeployConfig's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.config.choices import check_choices

__all__ = ["OpenVinoKnobs", "WEIGHT_FORMATS", "INT4_METHODS", "INFERENCE_PRECISIONS", "KV_PRECISIONS"]

# The IR's weights: fp32 and fp16 as exported (fp16 is what `optimum-cli export openvino --weight-format fp16`
# writes, the plain deployment), int8 and int4 compressed from the fp32 export by NNCF's compress_weights.
WEIGHT_FORMATS = ("fp16", "fp32", "int8", "int4")
# How NNCF picks int4 scales: data-free round-to-nearest, or data-aware from the calibration set (AWQ's activation-
# aware scales, scale estimation, both).
INT4_METHODS = ("data_free", "awq", "scale_estimation", "awq_se")
# The CPU plugin's INFERENCE_PRECISION_HINT: bf16 where the CPU has it natively (its default there), f32 elsewhere.
INFERENCE_PRECISIONS = ("bf16", "f32")
# KV_CACHE_PRECISION of the paged cache: u8 (the CPU plugin's default: per-token scales), u4, bf16, f32. An f32 cache
# needs f32 inference (the paged-attention kernel refuses an f32 cache under bf16 inference).
KV_PRECISIONS = ("u8", "u4", "bf16", "f32")


@dataclass(frozen=True, slots=True)
class OpenVinoKnobs:
    """The defaults are OpenVINO GenAI 2026.4's (SchedulerConfig's, the CPU plugin's on a CPU with bf16) and
    optimum-cli's fp16 export. `group_size` (int4: weights per scale; -1 per output channel) and `ratio` (int4: the
    share of layers in int4, the rest int8) apply to int4 alone, `int4_method` likewise. `max_num_batched_tokens`:
    the most tokens one scheduler step runs (prompt chunks and decode tokens); `cache_size`: the paged KV cache in
    GB (0: grown as needed); `dynamic_split_fuse`: prompts split into chunks that share steps with decoding
    sequences; `prefix_caching`: KV blocks of a prompt prefix reused across requests."""

    RUNTIME: ClassVar[str] = "openvino"
    NUMERICS: ClassVar[tuple[str, ...]] = ("weight_format", "int4_method", "group_size", "ratio",
                                           "inference_precision", "kv_precision")
    LATER: ClassVar[tuple[str, ...]] = ()
    # The simulator sees the weights' bytes and the matmuls' precision (cost_knobs); the KV precision, the int4
    # details and the scheduler are left to the trials.
    MODELED: ClassVar[tuple[str, ...]] = ("weight_format", "inference_precision")
    SCHEME: ClassVar[tuple[str, ...]] = MODELED
    CHOICES: ClassVar[dict[str, tuple]] = {"weight_format": WEIGHT_FORMATS, "int4_method": INT4_METHODS,
                                           "inference_precision": INFERENCE_PRECISIONS, "kv_precision": KV_PRECISIONS}

    weight_format: str = "fp16"
    int4_method: str = "data_free"
    group_size: int = 128
    ratio: float = 1.0
    inference_precision: str = "bf16"
    kv_precision: str = "u8"
    max_num_batched_tokens: int = 256
    cache_size: int = 0
    dynamic_split_fuse: bool = True
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        check_choices(self)
        int4_knobs = (self.int4_method, self.group_size, self.ratio)
        if self.weight_format != "int4" and int4_knobs != ("data_free", 128, 1.0):
            raise ValueError(f"int4_method, group_size and ratio apply to weight_format int4 only, not "
                             f"{self.weight_format}")
        if self.group_size != -1 and self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, or -1 for one scale per output channel; not {self.group_size}")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], not {self.ratio}")
        if self.kv_precision == "f32" and self.inference_precision != "f32":
            raise ValueError("an f32 KV cache needs inference_precision f32 (OpenVINO's paged attention refuses it "
                             "under bf16)")
        if self.max_num_batched_tokens < 1 or self.cache_size < 0:
            raise ValueError(f"max_num_batched_tokens must be >= 1 and cache_size >= 0 (0: grown as needed), not "
                             f"{self.max_num_batched_tokens}, {self.cache_size}")

    def keyed(self, values: dict) -> dict:
        return dict(values)

    def cost_knobs(self) -> dict | None:
        """The simulator's view (sim/cost.py): int8 and int4 weights as its weight-only schemes, the inference
        precision as the matmuls' dtype, the CPU plugin's KV block of 32 tokens."""
        quant = {"int8": "w8a16", "int4": "w4a16"}.get(self.weight_format, "none")
        return {"quant": quant, "dtype": "bf16" if self.inference_precision == "bf16" else "fp32", "page_size": 32}

    def reads_calibration(self) -> bool:
        """Whether NNCF's compression reads the calibration set (the data-aware int4 methods)."""
        return self.weight_format == "int4" and self.int4_method != "data_free"

    def scheme_label(self) -> str:
        """"ov:int4+awq/g64/r0.8@bf16+kv:u8"; the int4 details only where they are not the defaults."""
        weights = self.weight_format
        if weights == "int4":
            weights += "" if self.int4_method == "data_free" else f"+{self.int4_method}"
            weights += "" if self.group_size == 128 else f"/g{self.group_size}"
            weights += "" if self.ratio == 1.0 else f"/r{self.ratio:g}"
        return f"ov:{weights}@{self.inference_precision}+kv:{self.kv_precision}"

    def label(self, batch_size: int, device_power: int) -> str:
        return (f"OpenVINO {self.scheme_label().removeprefix('ov:')}/seqs={batch_size}"
                f"/tokens={self.max_num_batched_tokens}/cache={self.cache_size or 'auto'}GB"
                f"/split_fuse={'on' if self.dynamic_split_fuse else 'off'}"
                f"/prefix={'on' if self.prefix_caching else 'off'}/t={device_power or 'all'}")
