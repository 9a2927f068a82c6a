"""Device memory of a deployment: weights, reserved KV pages by policy, activations, runtime workspace."""
from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config.deploy import DTYPE_BYTES, DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import ModelSpec
from autotune.sim.cost import layer_activation_elems, weight_bytes
from autotune.sim.hardware import HardwareProfile

__all__ = ["MemoryEstimate", "estimate_memory", "kv_bytes_reserved", "kv_pages_reserved"]


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights: float
    kv_reserved: float
    kv_pages: int
    activations: float
    workspace: float
    load_transient: float  # the high-water mark while loading, where it exceeds the running state

    @property
    def total(self) -> float:
        return max(self.weights + self.kv_reserved + self.activations, self.load_transient) + self.workspace

    def parts_mb(self) -> dict[str, float]:
        return {k: getattr(self, k) / 2**20 for k in ("weights", "kv_reserved", "activations", "workspace",
                                                      "load_transient")}


def _rows_and_pages(config: DeployConfig, workload: Workload) -> tuple[int, int]:
    """(sequences holding pages, pages each holds) at the peak; see kv_pages_reserved."""
    rows = min(config.batch_size, workload.num_requests)
    page = config.page_size
    mean_len = (workload.prompt_min + workload.prompt_max) / 2 + workload.output_tokens
    if config.kv_policy == "preallocate":
        per_seq = math.ceil(workload.max_seq_len / page)
        rows = config.batch_size  # reserved for every slot, used or not
    elif config.kv_policy == "pool":
        per_seq = math.ceil(workload.max_seq_len / page)
    else:
        per_seq = math.ceil(mean_len / page)
    return rows, per_seq


def kv_pages_reserved(config: DeployConfig, workload: Workload) -> int:
    """Peak pages held, counted per sequence as the engine does (one page id spans every layer).

    preallocate: every batch slot reserves the workload's maximum length up front; on_demand: pages follow the
    tokens, so the peak is the mean request at its end; pool: each admitted request reserves its own length
    (prompt + output), pages of the maximum prompt in the worst case."""
    rows, per_seq = _rows_and_pages(config, workload)
    return rows * per_seq


def kv_bytes_reserved(spec: ModelSpec, config: DeployConfig, workload: Workload) -> float:
    """Bytes of the reserved KV pages. A windowed layer holds at most the pages its window spans (the window
    plus one page: it rarely starts on a page boundary), as a window-aware paged cache (vLLM's) keeps them.
    This project's CPU engine masks instead and keeps every page of every layer: its measured KV is the
    all-layers figure."""
    pages = kv_pages_reserved(config, workload)
    width = float(DTYPE_BYTES[config.dtype])
    # +1 page: the engine keeps a scratch page for padded rows
    if not spec.num_sliding_layers:
        return (pages + 1) * config.page_size * spec.kv_bytes_per_token(width)
    rows, per_seq = _rows_and_pages(config, workload)
    window_pages = rows * min(per_seq, math.ceil(spec.sliding_window / config.page_size) + 1)
    page_layers = spec.num_full_layers * (pages + 1) + spec.num_sliding_layers * (window_pages + 1)
    return page_layers * config.page_size * spec.kv_bytes_per_token_layer(width)


def estimate_memory(spec: ModelSpec, config: DeployConfig, workload: Workload,
                    profile: HardwareProfile) -> MemoryEstimate:
    pages = kv_pages_reserved(config, workload)
    kv = kv_bytes_reserved(spec, config, workload)
    fused = config.fusion_level == "O2"
    rows = min(config.batch_size, workload.num_requests)
    prefill_tokens = rows * workload.prompt_max
    # Live intermediates of one layer's prefill; a compiled graph plans buffers for all its layers, reusing only
    # part of them, so bigger subgraphs hold more (the "memory balanced" split of the reference recipe).
    per_layer = prefill_tokens * layer_activation_elems(spec, fused) * DTYPE_BYTES[config.dtype]
    if config.fusion_level == "O0":
        graph_layers = 1.0
    else:
        lps = config.layers_per_subgraph or spec.num_layers
        graph_layers = 1.0 + (min(lps, spec.num_layers) - 1) * profile.extra.get("graph_layer_memory_fraction", 0.25)
    scores = rows * spec.num_heads * workload.prompt_max ** 2 * 4  # fp32 attention scores of one layer
    logits = rows * spec.vocab_size * 4
    activations = per_layer * graph_layers + scores + logits
    load = spec.num_params * float(profile.extra.get("load_bytes_per_param", 0.0))
    return MemoryEstimate(weight_bytes(spec, config.quant, config.dtype), kv, pages, activations,
                          profile.factors.workspace_mb * 2**20, load)
