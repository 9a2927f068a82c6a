"""A build the decode check leaves undecided at its cap is marginal: gated (off the front) by default, benchmarked
and marked where the search accepts marginal builds, and said so by the table's row."""
from __future__ import annotations

import pytest

from autotune.config.deploy import DeployConfig
from autotune.gate.result import GateResult, verdict_word
from autotune.gate.verdict import judge
from autotune.trial.job import Job, JobKind, JobResult, Status
from autotune.trial.pipeline import run_trial

_WINDOWS = dict(tie_aware_agreement=0.999, raw_agreement=0.999, perplexity=2.0, reference_perplexity=2.0,
                kl_divergence=0.0, positions=5110, tie_epsilon=0.05, min_agreement=0.995)


def _gate(agreeing: int, positions: int = 6144) -> dict:
    verdict = judge(agreeing, positions, 0.995, cap_positions=6144)
    return GateResult(**_WINDOWS, decode_agreement=agreeing / positions, decode_raw_agreement=agreeing / positions,
                      decode_positions=positions, decode_prompts=192, decode_interval=[verdict.low, verdict.high],
                      decode_passed=verdict.passed, decode_decided=verdict.decided,
                      decode_verdict=verdict.reason).to_dict()


class _Stages:
    device, versions, checksum = "cpu", None, "sha256:test"

    def __init__(self, gate: dict) -> None:
        self.figures, self.benched = gate, False

    def build(self) -> JobResult:
        return JobResult(Status.OK, build_s=0.1)

    def gate(self, cached):
        return dict(self.figures)

    def bench(self) -> dict:
        self.benched = True
        return {"throughput_tok_s": 100.0}

    def timing(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def _job(accept: bool) -> Job:
    return Job(kind=JobKind.TRIAL, model="smollm2-135m", workload={}, config=DeployConfig().to_dict(),
               accept_marginal=accept)


def test_a_marginal_build_is_gated_unless_accepted():
    marginal = _gate(6118)  # 26 misses: 0.99577, undecided at the cap
    assert marginal["marginal"] and not marginal["passed"] and verdict_word(marginal) == "marginal"
    stages = _Stages(marginal)
    result = run_trial(_job(False), stages, lambda partial: None)
    assert result.status is Status.GATED and not stages.benched
    stages = _Stages(marginal)
    result = run_trial(_job(True), stages, lambda partial: None)
    assert result.status is Status.OK and stages.benched
    assert result.gate["passed"] and result.gate["accepted_marginal"]
    assert verdict_word(result.gate) == "marginal (accepted)"


@pytest.mark.parametrize("agreeing, word", [(6125, "pass"), (6100, "FAIL")])
def test_accepting_marginal_builds_changes_no_decided_verdict(agreeing, word):
    stages = _Stages(_gate(agreeing))
    result = run_trial(_job(True), stages, lambda partial: None)
    assert verdict_word(result.gate) == word and "accepted_marginal" not in result.gate
    assert (result.status is Status.OK) is (word == "pass")


def test_the_table_marks_an_accepted_marginal_build():
    from autotune.results.tables import _agreement

    accepted = {**_gate(6118), "passed": True, "accepted_marginal": True}
    assert _agreement(accepted).endswith(" marginal") and not _agreement(_gate(6125)).endswith("marginal")
