"""What the accelerator devices hand their compilers, checked on the CPU with dynamo's own tracing in place of
inductor's CUDA path and of torchair: the KV pools reach a CUDA graph as static inputs (so cudagraph trees replay
the graph that writes into them), and torchair gets a dynamic prefill graph and static decode graphs whose only
symbolic size is the pools' page count (an on_demand pool grows without a recompile)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from autotune.config.deploy import DeployConfig
from autotune.devices.cuda import CudaDevice, mark_pools_static
from autotune.devices.npu_graph import POOL_PAGE_DIM, torchair_compile
from autotune.devices.segment_calls import before_each_call
from autotune.engine import Request, build_engine
from autotune.engine import build as build_module


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # compiled code is cached per code object: each test traces Segment's entries anew
    # As a fresh process has it (CudaDevice.compile sets it for itself): a CPU O2 engine built by an earlier test
    # leaves freezing on in this thread, and under it the pools marked static would be baked into the graph as
    # constants, so that a grown pool was indexed past the end of the old one.
    with torch._inductor.config.patch(freezing=False):
        yield
    torch._dynamo.reset()


def _run(tiny_llama, wrap) -> None:
    """Generate through an eager engine whose segment entries are replaced by `wrap(entry, name)`. The on_demand
    cache starts with 2 usable pages of 8 tokens, which the prompts (7 and 8 tokens) fill: the pools grow while
    they decode."""
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, page_size=8, kv_policy="on_demand",
                                                dtype="fp32"))
    for segment in engine.model.segments:
        segment.prefill = wrap(segment.prefill, "prefill")
        segment.decode = wrap(segment.decode, "decode")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, tiny_llama.config.vocab_size, (n,), generator=g).tolist() for n in (7, 8)]
    engine.runner(max_seq_len=64).run([Request(p, 6, min_new_tokens=6) for p in prompts])


def _cudagraph_view(records: list):
    """A dynamo backend that traces through AOTAutograd and records, per graph, the inputs it mutates and those it
    treats as static: inductor's cudagraph trees replay a graph only when the first are among the second
    (check_for_mutation in torch/_inductor/cudagraph_utils.py), else "skipping cudagraphs due to mutated inputs"."""

    def inference(gm, example_inputs):
        meta = torch._guards.TracingContext.try_get().fw_metadata
        mutated = {i for i, info in enumerate(meta.input_info) if info.mutates_data}
        records.append((mutated, set(meta.static_input_indices)))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=inference, inference_compiler=inference)


@pytest.mark.slow
@pytest.mark.parametrize("marked, replayable", [(True, True), (False, False)])
def test_kv_pools_reach_cuda_graphs_as_static_inputs(tiny_llama, marked, replayable):
    records: list = []
    backend = _cudagraph_view(records)

    def wrap(entry, _name):
        compiled = torch.compile(entry, backend=backend)
        return before_each_call(compiled, mark_pools_static) if marked else compiled

    _run(tiny_llama, wrap)
    assert records and all(mutated for mutated, _ in records)  # every segment graph writes K/V into its pools
    assert all(mutated <= static for mutated, static in records) is replayable


def test_cuda_compile_marks_the_pools_before_each_call(tiny_llama, monkeypatch):
    """CudaDevice.compile wraps what torch.compile returns (recorded here: no GPU) so that the pools of each
    segment call are static addresses when dynamo meets them."""
    seen: list[list[object]] = []

    def record(fn, **kwargs):
        def run(*args):
            seen.append([getattr(p, "_dynamo_static_input_type", None) for p in (*args[2], *args[3])])
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", record)
    device = CudaDevice()
    _run(tiny_llama, lambda entry, _name: device.compile(entry, "O2"))
    assert seen and all(kinds and set(kinds) == {"unguarded"} for kinds in seen)


def _symbolic(gm) -> dict[str, set[int]]:
    """Placeholder name -> the dims of its (fake) tensor that are symbolic."""
    out = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            out[node.name] = {d for d, size in enumerate(value.shape) if isinstance(size, torch.SymInt)}
    return out


@pytest.mark.slow
def test_torchair_gets_a_dynamic_prefill_and_static_decode_graphs(tiny_llama, monkeypatch):
    # The CPU's eager fp32 build prepacks its linears for oneDNN; an accelerator's build never does.
    monkeypatch.setattr(build_module, "prepack_available", lambda: False)
    graphs: dict[str, list] = {"prefill": [], "decode": []}
    decode_pages: set[int] = set()

    def wrap(entry, name):
        def backend(gm, example_inputs):
            graphs[name].append(_symbolic(gm))
            return gm.forward
        compiled = torchair_compile(entry, backend, dynamic=True)
        if name == "prefill":
            return compiled

        def decode(*args):
            decode_pages.add(args[2][0].shape[POOL_PAGE_DIM])
            return compiled(*args)
        return decode

    _run(tiny_llama, wrap)
    assert len(decode_pages) > 1  # the pools grew between decode steps
    assert len(graphs["decode"]) == 1  # and the decode graph held: no recompile per growth
    dims = graphs["decode"][0]
    pools = {name: d for name, d in dims.items() if "pools" in name}
    assert pools and all(d == {POOL_PAGE_DIM} for d in pools.values())
    assert not any(d for name, d in dims.items() if name not in pools), dims  # x and the step's tensors: static
    assert len(graphs["prefill"]) == 1 and any(graphs["prefill"][0].values())  # prompt shapes: symbolic


def test_dynamic_false_would_not_give_torchair_static_graphs(tiny_llama):
    """Why the NPU mapping says dynamic=True: the engine's maybe_mark_dynamic marks outrank dynamic=False, so the
    graphs are symbolic anyway (only the unmarked sizes specialise)."""
    graphs: list = []

    def wrap(entry, name):
        def backend(gm, example_inputs):
            graphs.append(_symbolic(gm))
            return gm.forward
        return torch.compile(entry, backend=backend, dynamic=False)

    _run(tiny_llama, wrap)
    assert any(d for dims in graphs for d in dims.values())
