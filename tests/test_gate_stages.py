"""The gate's stages and the benchmark's early stop: a gate that cannot pass stops early, a pass is decided on
everything, the decode path is checked at the configuration's batch size, and a clearly dominated configuration
stops its timed repeats."""
from __future__ import annotations

import torch

from autotune.benchmark.bench import benchmark_engine
from autotune.benchmark.policy import RunPolicy
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.engine import build_engine
from autotune.engine.runner import Runner
from autotune.gate.accuracy import compute_reference, evaluate_gate
from autotune.trial.run import dominated_cut


def _text(vocab: int, windows: int = 6) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(5)
    return ([torch.randint(3, vocab, (64,), generator=g).tolist() for _ in range(windows)],
            [torch.randint(3, vocab, (10,), generator=g).tolist() for _ in range(2)])


def _damaged(engine) -> None:
    with torch.no_grad():  # a copy: an fp32 engine shares the session model's tensors
        engine.model.final_norm = torch.nn.Parameter(engine.model.final_norm.clone(), requires_grad=False)
        engine.model.final_norm[::2] = 0


def test_a_gate_that_cannot_pass_stops_early_and_a_pass_sees_every_position(tiny_llama):
    windows, prompts = _text(tiny_llama.config.vocab_size)
    ref = compute_reference(tiny_llama, windows, prompts, new_tokens=13)
    # 0.8: 24 agreeing decode positions decide a pass there (at 0.995 they would leave it marginal).
    exact = evaluate_gate(build_engine(tiny_llama, DeployConfig(dtype="fp32")), ref, windows, prompts,
                          min_agreement=0.8)
    assert exact.passed and not exact.stopped_early and exact.positions == 6 * 63
    assert exact.decode_agreement == 1.0 and exact.decode_raw_agreement == 1.0 and exact.decode_positions == 2 * 12
    damaged = build_engine(tiny_llama, DeployConfig(dtype="fp32"))
    _damaged(damaged)
    gate = evaluate_gate(damaged, ref, windows, prompts)
    # Two windows held more misses than a pass over six allows (1.9 at 0.995): the rest was not run.
    assert gate.stopped_early and not gate.passed and gate.positions == 2 * 63
    assert gate.raw_agreement < 0.5 and gate.decode_agreement is None


def test_the_decode_check_catches_a_decode_path_that_the_windows_never_run(tiny_llama):
    windows, prompts = _text(tiny_llama.config.vocab_size, windows=2)
    ref = compute_reference(tiny_llama, windows, prompts, new_tokens=17)
    engine = build_engine(tiny_llama, DeployConfig(batch_size=4, dtype="fp32"))
    for segment in engine.model.segments:  # a broken decode graph; prefill (the windows) untouched
        segment.decode = lambda x, step, k, v, run=segment.decode: run(x, step, k, v) * 0.0
    seen: list[int] = []
    original = Runner.run

    def spy(self, requests):
        seen.append(len(requests))
        return original(self, requests)

    Runner.run = spy
    try:
        gate = evaluate_gate(engine, ref, windows, prompts)
    finally:
        Runner.run = original
    assert gate.tie_aware_agreement == 1.0 and gate.raw_agreement == 1.0  # the windows cannot see it
    assert gate.decode_agreement < 0.5 and gate.decode_first_miss is not None and not gate.passed
    assert seen == [4]  # two prompts filled the configuration's batch of four


def test_a_clearly_dominated_configuration_stops_its_repeats(tiny_llama):
    front = [{"number": 3, "throughput_tok_s": 1e9, "tpot_p99_ms": 1e-6, "peak_memory_mb": 1e9}]
    assert dominated_cut(front)({"throughput_tok_s": 10.0, "tpot_p99_ms": 5.0, "peak_memory_mb": 100.0}) is None
    front[0]["peak_memory_mb"] = 100.0
    reason = dominated_cut(front)({"throughput_tok_s": 10.0, "tpot_p99_ms": 5.0, "peak_memory_mb": 100.0})
    assert reason and "trial #3" in reason
    # Within the run-to-run noise (20%): not clearly dominated.
    near = [{"number": 1, "throughput_tok_s": 11.0, "tpot_p99_ms": 4.5, "peak_memory_mb": 90.0}]
    assert dominated_cut(near)({"throughput_tok_s": 10.0, "tpot_p99_ms": 5.0, "peak_memory_mb": 100.0}) is None
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    workload = Workload(num_requests=2, prompt_min=8, prompt_max=8, output_tokens=4)
    bench = benchmark_engine(engine, [[5] * 8, [6] * 8], workload, policy=RunPolicy(), base_rss=0,
                             cut=dominated_cut(front))
    assert bench["repeats"] == 1 and "stopped after 1 of 3 runs" in bench["repeats_cut"]
    # With a wave smaller than the workload, the screening wave alone decides: the whole workload never runs.
    four = Workload(num_requests=4, prompt_min=8, prompt_max=8, output_tokens=4)
    screened = benchmark_engine(engine, [[5] * 8, [6] * 8, [7] * 8, [8] * 8], four,
                                policy=RunPolicy(screen=True), base_rss=0, cut=dominated_cut(front))
    assert screened["repeats"] == 0 and "trial #3" in screened["screened_out"]
    kept = benchmark_engine(engine, [[5] * 8, [6] * 8, [7] * 8, [8] * 8], four, policy=RunPolicy(screen=True),
                            base_rss=0, cut=dominated_cut(near))
    assert "screened_out" not in kept and kept["repeats"] >= 1 and kept["repeats_stop"]
