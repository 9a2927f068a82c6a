"""Build a deployable engine from HF weights and a DeployConfig: quantize, split into segments, compile."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from autotune.config.deploy import TORCH_DTYPE_NAMES, DeployConfig
from autotune.engine.calibrated import QuantPlan, quantize_layers
from autotune.engine.model import EngineModel
from autotune.engine.packaged import PackagedGraphs, package_graphs
from autotune.engine.prepacked import prepack_available, prepack_linears
from autotune.engine.quant import decoder_linear
from autotune.engine.runner import Runner, batch_buckets
from autotune.engine.spill import SpilledParameters, spill_parameters

__all__ = ["Engine", "build_engine", "build_on_device", "COMPILE_MODES", "TORCH_DTYPES"]

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, t) for name, t in TORCH_DTYPE_NAMES.items()}

# How each fusion level runs a segment: O0 eager; O1 inductor, weights as graph inputs (segments of equal length
# share one graph); O2 inductor with freezing: weights folded in as constants and prepacked for oneDNN, one graph
# per segment. (max-autotune was measured and lost: slower decode steps, for minutes more of compiling.)
COMPILE_MODES: dict[str, str | None] = {"O0": None, "O1": "default", "O2": "freezing"}


class Engine:
    """A built model plus how to serve it: `runner()` gives a continuous-batching runner with a fresh cache."""

    def __init__(self, model: EngineModel, config: DeployConfig, build_seconds: float,
                 quantization: dict | None = None, spilled: SpilledParameters | None = None,
                 packaged: PackagedGraphs | None = None, compiler: str = "inductor") -> None:
        self.model, self.config, self.build_seconds = model, config, build_seconds
        self.compiler = compiler  # what compiled the graphs: inductor, or the device's own (torchair)
        # What the quantize step did: decoder linear layers, how many were converted, which were kept.
        self.quantization = quantization or {}
        # O2 on the CPU: the eager weights, out of memory once frozen into the graphs (engine/spill.py).
        self.spilled = spilled
        # O2 on the CPU built with a package folder: its graphs, as AOTInductor packages (engine/packaged.py).
        self.packaged = packaged

    @property
    def compiled(self) -> bool:
        return COMPILE_MODES[self.config.fusion_level] is not None

    @property
    def build_record(self) -> dict:
        """How this engine runs, as trials and recipes record it, so that `verify` and `serve` can check that they
        built the same: the compiled artifact (eager; a graph compiled in the process by `torch.compile:<compiler>`;
        or AOTInductor packages loaded as native code), whether the fp32 linears were prepacked for oneDNN, and
        whether the eager weights were spilled once frozen into the graphs."""
        artifact = ("eager" if not self.compiled else "aoti-package" if self.packaged is not None
                    else f"torch.compile:{self.compiler}")
        return {"artifact": artifact, "prepacked": bool(self.quantization.get("prepacked")),
                "spilled": self.spilled is not None}

    def enter_thread(self) -> None:
        """Call first in a thread other than the builder's that runs this engine (the serving loop): dynamo's and
        inductor's settings are per thread, and without them a graph compiled there was not frozen, and beyond
        dynamo's default of 8 graphs a segment ran eager (the serve log said `recompile_limit (8)`)."""
        if self.compiled:
            # An accelerator's Device passes its own compile options; only the CPU path sets inductor's freezing.
            _compile_settings(self.model, self.config, COMPILE_MODES[self.config.fusion_level] if self.on_cpu else None)

    @property
    def on_cpu(self) -> bool:
        return self.model.cos_table.device.type == "cpu"

    def runner(self, max_seq_len: int, pool_tokens: int | None = None, max_batch: int | None = None,
               prefill_chunk: int | None = None, bucketed: bool = False) -> Runner:
        """`prefill_chunk`: prompt tokens one step may prefill (serving bounds it; None: all admitted at once);
        `bucketed`: decode graphs at batch buckets (serving) rather than only the full batch, and on the CPU decode
        steps that read only the pages their rows use (Runner)."""
        batch = max_batch or self.config.batch_size
        cache = self.model.new_cache(page_size=self.config.page_size, policy=self.config.kv_policy,
                                     max_seq_len=max_seq_len, max_batch=batch, pool_tokens=pool_tokens)
        # Compiled graphs want few shapes: pad the batch to a bucket rather than recompile as rows come and go.
        return Runner(self.model, cache, batch, pad_batch=self.compiled, prefill_chunk=prefill_chunk,
                      bucketed=bucketed, dynamic_context=bucketed and self.on_cpu,
                      min_bucket=2 if self.packaged is not None else 1)


def _compile_settings(model: EngineModel, config: DeployConfig, cpu_mode: str | None) -> None:
    """dynamo's and inductor's settings for this engine, in the calling thread: they are per thread."""
    import torch._dynamo
    import torch._inductor.config

    if cpu_mode is not None:
        torch._inductor.config.freezing = cpu_mode == "freezing"
    # Per segment: a decode graph per batch bucket, a few prefill shapes (and, frozen, one graph per segment).
    graphs = (len(batch_buckets(config.batch_size)) + 6) * len(model.segments) + 8
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, graphs)


def _compile_segments(model: EngineModel, config: DeployConfig, mode: str) -> None:
    _compile_settings(model, config, mode)
    for segment in model.segments:
        segment.prefill = torch.compile(segment.prefill)
        segment.decode = torch.compile(segment.decode)
    model.logits = torch.compile(model.logits)  # final norm and the (vocabulary-wide) head


def build_on_device(hf_model: nn.Module, config: DeployConfig, device, plan: QuantPlan | None = None) -> Engine:
    """An accelerator's build (autotune/devices/base.py Device.build): weights move to the device before
    quantizing, so each quantizer packs for that device's kernels; each segment compiles as the device maps the
    fusion level. `hf_model` and `plan` as for build_engine."""
    started = time.perf_counter()
    model = EngineModel(hf_model, TORCH_DTYPES[config.dtype], config.layers_per_subgraph or None).to(
        device.torch_device)
    coverage = quantize_layers(model, config.quant, config.quant_method, plan, device.quantizer(config.quant),
                               config.fallback_layers)
    options = device.compile_options(config.fusion_level)
    if options is not None:
        _compile_settings(model, config, None)
        for segment in model.segments:
            segment.prefill = device.compile(segment.prefill, config.fusion_level)
            segment.decode = device.compile(segment.decode, config.fusion_level)
        model.logits = device.compile(model.logits, config.fusion_level)
    device.synchronize()
    return Engine(model, config, time.perf_counter() - started, coverage,
                  compiler=options.backend if options is not None else "inductor")


def build_engine(hf_model: nn.Module, config: DeployConfig, plan: QuantPlan | None = None,
                 packages: Path | None = None) -> Engine:
    """The CPU's build (autotune/devices/cpu.py CpuDevice.build; accelerators build with build_on_device).
    hf_model: a transformers LlamaForCausalLM in fp32; it is only read. The engine computes in `config.dtype`.
    `plan`: what the configuration's quant_method and fallback_layers need from the calibration set
    (autotune/quant: quant_plan); None for round-to-nearest without fallback. A scheme that converts fewer layers
    than it claims fails (TrialFailure).
    `packages`: a folder for O2's graphs on the CPU as AOTInductor packages (engine/packaged.py), which a later
    build with the same folder loads instead of compiling; None compiles them with torch.compile (the CPU's
    Device always passes one: autotune/devices/cpu.py)."""
    started = time.perf_counter()
    model = EngineModel(hf_model, TORCH_DTYPES[config.dtype], config.layers_per_subgraph or None)
    coverage = quantize_layers(model, config.quant, config.quant_method, plan, fallback_layers=config.fallback_layers)
    if config.quant == "none" and config.dtype == "fp32" and config.fusion_level == "O0" and prepack_available():
        coverage["prepacked"] = prepack_linears(model, decoder_linear, config.batch_size)
    mode = COMPILE_MODES[config.fusion_level]
    packaged = None
    if mode == "freezing" and packages is not None:
        _compile_settings(model, config, mode)
        packaged = package_graphs(model, packages)
    elif mode is not None:
        _compile_segments(model, config, mode)
    # Frozen graphs carry their own copies of the weights; the eager ones are read again only to compile.
    spilled = spill_parameters(model) if mode == "freezing" else None
    if packaged is not None and spilled is not None:
        packaged.after_compile = spilled.drop  # export does not go through dynamo's end-of-compile callback
    return Engine(model, config, time.perf_counter() - started, coverage, spilled, packaged)
