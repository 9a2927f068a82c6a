"""O2 (inductor freezing) keeps no second copy of the weights in memory: once built, the eager parameters live in a
read-only file-backed mapping, out of memory except while a compile reads them. The engine still compiles new
shapes from them (another batch size, other prompt lengths) and gives the same greedy tokens as a build that kept
them in memory."""
from __future__ import annotations

import gc

import pytest
import torch
import torch._dynamo
from conftest import make_tiny_llama
from torch.multiprocessing.reductions import StorageWeakRef

import autotune.engine.build
from autotune.config.deploy import DeployConfig
from autotune.engine import Request, build_engine
from autotune.engine.model import EngineModel
from autotune.engine.spill import SpilledParameters

# (batch size, prompt lengths, new tokens, longest sequence): the second needs new graphs (decode over a wider block
# table, at another batch), compiled after the first's compiles dropped the weights' pages.
SHAPES = [(4, (5, 17, 33, 9, 24), 10, 64), (2, (40, 3, 12), 6, 96)]


@pytest.fixture(scope="module")
def wide_llama():
    # Wide enough that the decoder weights (3.75 MiB in bf16) dwarf what eager code touches (embedding rows); two
    # layers in one segment, so that each of the two builds compiles few, small graphs.
    return make_tiny_llama(vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=2)


def _tokens(engine, batch: int, lengths: tuple[int, ...], new: int, max_seq_len: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in lengths]
    runner = engine.runner(max_seq_len=max_seq_len, max_batch=batch)
    return [c.output_ids for c in runner.run([Request(p, new, min_new_tokens=new) for p in prompts])]


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))


def test_spilling_releases_the_original_storage(wide_llama):
    model = EngineModel(wide_llama, torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    originals = [StorageWeakRef(p.untyped_storage()) for p in model.parameters()]
    spilled = SpilledParameters(model)
    gc.collect()
    assert spilled.count == len({id(p) for p in model.parameters()}) and spilled.nbytes > 3 * 2**20
    assert spilled.resident_bytes() < 2**16  # written, mapped and dropped: nothing of it in memory
    assert all(ref.expired() for ref in originals)
    assert all(spilled.holds(p) for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # read back from the file
    assert spilled.resident_bytes() > 3 * 2**20
    spilled.drop()
    assert spilled.resident_bytes() < 2**16


@pytest.mark.slow
def test_o2_engine_runs_new_shapes_from_spilled_weights_with_the_same_tokens(wide_llama, monkeypatch):
    torch._dynamo.reset()
    config = DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=4, page_size=8)
    monkeypatch.setattr(autotune.engine.build, "spill_parameters", lambda model: None)
    kept = build_engine(wide_llama, config)
    assert kept.spilled is None
    expected = [_tokens(kept, *shape) for shape in SHAPES]
    del kept
    monkeypatch.undo()

    originals: list[StorageWeakRef] = []
    real = autotune.engine.build.spill_parameters

    def recording(model):
        originals.extend(StorageWeakRef(p.untyped_storage()) for p in model.parameters())
        return real(model)

    monkeypatch.setattr(autotune.engine.build, "spill_parameters", recording)
    engine = build_engine(wide_llama, config)
    spilled = engine.spilled
    assert spilled is not None and originals
    graphs = _graphs()
    assert _tokens(engine, *SHAPES[0]) == expected[0]
    first = _graphs()
    assert first > graphs  # compiled here, from the mapped weights
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # Frozen graphs read their prepacked copies; the mapping keeps only what eager code touched since.
        assert spilled.resident_bytes() < spilled.nbytes / 4, (spilled.resident_bytes(), spilled.nbytes)
    assert _tokens(engine, *SHAPES[1]) == expected[1]
    assert _graphs() > first  # new graphs after the drop: traced and frozen again from the file
    gc.collect()
    assert all(ref.expired() for ref in originals)
    assert all(spilled.holds(p) for p in engine.model.parameters())
