"""The held-back check: the chosen configurations re-checked on prompts no trial saw before their recipes are
written; a failure leaves the front and the point that replaces it is checked in turn; the figure is stored."""
from __future__ import annotations

import pytest

from autotune.backends.cpu import CpuBackend
from autotune.cli import main
from autotune.config.deploy import DeployConfig
from autotune.gate.cache import holdout_reference_path
from autotune.gate.corpus import EVAL_FILE, PROMPT_FILES, _ids, decode_prompts, holdout_prompts
from autotune.gate.design import DECODE_PROMPT_TOKENS, HOLDOUT_MAX_PROMPTS, HOLDOUT_OVERLAP_TOKENS
from autotune.models.registry import resolve_model
from autotune.models.weights import load_tokenizer, model_checksum
from autotune.recipes.recipe import holdout_verdict, load_recipe
from autotune.results.export import write_recipes
from autotune.results.front import pareto_trials
from autotune.results.holdout import recheck_front
from autotune.results.tables import pareto_table
from autotune.trial.job import Job, JobKind, JobResult, Status
from tests.recipe_factory import GATE, TINY_WORKLOAD, bench, config, make_study
from tests.test_study import ScriptedBackend

COMMON = dict(model="m", workload=TINY_WORKLOAD, min_agreement=0.995, tie_epsilon=0.05)


def _spans(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + HOLDOUT_OVERLAP_TOKENS]) for i in range(len(ids) - HOLDOUT_OVERLAP_TOKENS + 1)}


def test_held_back_prompts_share_no_span_with_any_text_the_gate_reads(smollm2_folder):
    tokenizer = load_tokenizer(resolve_model(str(smollm2_folder)))
    held = holdout_prompts(tokenizer)
    assert len(held) == HOLDOUT_MAX_PROMPTS and {len(p) for p in held} == {DECODE_PROMPT_TOKENS}
    # The figure design.py and PROVENANCE.md give: the unseen passages SmolLM2's tokenizer leaves, of which the
    # check takes HOLDOUT_MAX_PROMPTS.
    assert len(holdout_prompts(tokenizer, count=10_000)) == 136
    seen = set().union(*(_spans(_ids(tokenizer, path)) for path in (EVAL_FILE, *PROMPT_FILES)))
    assert not any(_spans(p) & seen for p in held)
    assert not {tuple(p) for p in held} & {tuple(p) for p in decode_prompts(tokenizer)}
    assert len({tuple(p) for p in held}) == len(held)


class HoldoutBackend(ScriptedBackend):
    """Answers held-back checks by batch size: `fail` decided against, `error` could not run, the rest pass."""

    name = "cpu"

    def __init__(self, fail=(), error=()) -> None:
        super().__init__()
        self.fail, self.error = set(fail), set(error)

    def run(self, job, timeout_s):
        self.jobs.append(job)
        batch = DeployConfig.from_dict(job.config).batch_size
        if batch in self.error:
            return JobResult.error(f"timed out after {timeout_s:.0f} s")
        failed = batch in self.fail
        return JobResult(Status.OK, holdout={
            "decode_agreement": 0.990 if failed else 0.9990, "decode_positions": 1536, "decode_prompts": 48,
            "decode_passed": not failed, "decode_decided": True, "decode_verdict": "decided"})


def _points():
    return [
        (config(batch_size=8), bench(300.0, 20.0, 500.0), GATE, {}),  # best throughput: fails its held-back check
        (config(batch_size=1), bench(90.0, 8.0, 300.0), GATE, {}),  # best latency: its check cannot run
        (config(batch_size=2, page_size=64), bench(150.0, 12.0, 200.0), GATE, {}),  # smallest memory
        (config(batch_size=16), bench(280.0, 25.0, 550.0), GATE, {}),  # dominated by batch 8 alone
        (config(batch_size=4), bench(100.0, 30.0, 600.0), GATE, {}),  # dominated by batch 2 too
    ]


def test_a_failed_held_back_check_takes_the_point_off_the_front_and_its_replacement_is_checked(
        tmp_path, tiny_model_folder):
    study, url = make_study(tmp_path, tiny_model_folder, tmp_path, points=_points())
    assert {DeployConfig.from_dict(t.user_attrs["config"]).batch_size for t in pareto_trials(study)} == {8, 1, 2}
    backend = HoldoutBackend(fail={8}, error={1})
    assert recheck_front(study, backend, COMMON) == 4
    checked = [DeployConfig.from_dict(j.config).batch_size for j in backend.jobs]
    assert checked == [8, 2, 1, 16]  # the front, fastest first; then the point the failure let onto it
    assert all(j.kind is JobKind.HOLDOUT and j.min_agreement == 0.995 for j in backend.jobs)
    # Batch 1's check could not run: not a pass, so it leaves the front too (the search had no --accept-marginal).
    assert {DeployConfig.from_dict(t.user_attrs["config"]).batch_size for t in pareto_trials(study)} == {16, 2}
    assert recheck_front(study, backend, COMMON) == 0 and len(backend.jobs) == 4  # stored: never run twice

    out = tmp_path / "recipes"
    recipes = {p.name: load_recipe(p) for p in write_recipes(study, out, url)}
    best = recipes["best-throughput.yaml"]
    assert best.config.batch_size == 16
    assert best.data["gate"]["holdout"]["decode_agreement"] == 0.9990 and holdout_verdict(
        best.data["gate"]["holdout"]) == "pass"
    assert recipes["best-latency.yaml"].config.batch_size == 2
    assert not any(r.config.batch_size in (8, 1) for r in recipes.values())
    table = pareto_table(study)
    assert "held: decode agreement on held-back prompts" in table
    assert any("/bs=16/" in line and " 0.9990 " in line for line in table.splitlines())
    assert not any("/bs=1/" in line for line in table.splitlines())


class _Marginal(HoldoutBackend):
    def run(self, job, timeout_s):
        return JobResult(Status.OK, holdout={"decode_agreement": 0.9952, "decode_positions": 4096,
                                             "decode_prompts": 128, "decode_passed": False,
                                             "decode_decided": False, "decode_verdict": "undecided at the cap"})


def test_a_marginal_held_back_check_leaves_the_front_unless_accepted(tmp_path, tiny_model_folder):
    """Undecided is not a pass (misses clustered in a few prompts end there, however high the estimate): the point
    leaves the front as a decided failure would, unless the search ran with --accept-marginal, and then its recipe
    says so."""
    study, url = make_study(tmp_path, tiny_model_folder, tmp_path, points=_points()[:1])
    assert recheck_front(study, _Marginal(), COMMON) == 1
    assert pareto_trials(study) == [] and write_recipes(study, tmp_path / "recipes", url) == []

    accepting = tmp_path / "accepting"
    accepting.mkdir()
    study, url = make_study(accepting, tiny_model_folder, accepting, points=_points()[:1],
                            trial_attrs={"measured_under": {"accept_marginal": True}})
    assert recheck_front(study, _Marginal(), COMMON) == 1
    (recipe,) = {load_recipe(p).data["gate"]["holdout"]["decode_agreement"] for p in
                 write_recipes(study, accepting / "recipes", url)}
    assert recipe == 0.9952 and [t.number for t in pareto_trials(study)] == [0]
    (best,) = (accepting / "recipes").rglob("best-throughput.yaml")
    assert any("undecided at its cap" in note for note in load_recipe(best).notes)


def test_a_simulated_study_has_nothing_to_check(tmp_path, tiny_model_folder):
    study, _ = make_study(tmp_path, tiny_model_folder, tmp_path, points=_points()[:1])
    backend = HoldoutBackend()
    backend.measured = False
    assert recheck_front(study, backend, COMMON) == 0 and not backend.jobs


@pytest.mark.slow
def test_the_held_back_check_rebuilds_and_decodes_the_unseen_prompts(tiny_model_folder):
    """The real pipeline in its own process: build, the held-back reference computed and cached, the decode check's
    staged rule on those prompts; no gate, no benchmark."""
    job = Job(kind=JobKind.HOLDOUT, model=str(tiny_model_folder), workload=TINY_WORKLOAD,
              config=config(batch_size=4, dtype="fp32"), threads=1, min_agreement=0.995, tie_epsilon=0.05)
    result = CpuBackend().run(job, 600)
    assert result.ok, result.reason
    assert result.gate is None and result.bench is None
    held = result.holdout
    assert held["decode_prompts"] >= 48 and held["decode_positions"] == 32 * held["decode_prompts"]
    # fp32 against the fp32 reference on the peaked model: the same tokens, decided at the first stage.
    assert held["decode_agreement"] > 0.995 and held["decode_passed"] and held["decode_decided"]
    assert holdout_reference_path(model_checksum(resolve_model(str(tiny_model_folder)))).is_file()


def test_export_names_the_front_points_without_a_held_back_check(tmp_path, tiny_model_folder, capsys):
    study, url = make_study(tmp_path, tiny_model_folder, tmp_path, points=_points())
    recheck_front(study, HoldoutBackend(), COMMON)  # the front of three checked...
    study.set_user_attr("holdout:2", None)  # ...but one
    assert main(["export", "--study", "tiny-cpu", "--storage", url, "--out", str(tmp_path / "r")]) == 0
    assert "front trial(s) 2 have no held-back check" in capsys.readouterr().out
