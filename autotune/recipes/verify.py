"""`autotune verify`: rebuild a recipe's configuration here, re-run its gate and benchmark, and say whether its
figures still hold. A simulated recipe comes out as a measured one, written next to it: measured on the recipe's
backend when this machine has it, else on the CPU, and then said to be not comparable with the prediction."""
from __future__ import annotations

import datetime as dt
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from autotune.backends import Backend, get_backend
from autotune.errors import AutotuneError, UserInputError
from autotune.gate.cache import reference_path
from autotune.gate.corpus import EVAL_POSITIONS, eval_set_digest
from autotune.gate.result import verdict_word
from autotune.host import class_note
from autotune.models.registry import resolve_model
from autotune.models.weights import model_checksum
from autotune.progress import log
from autotune.recipes.recipe import Recipe, load_recipe, write_recipe
from autotune.recipes.signature import read_key
from autotune.recipes.target import Placement, place
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["verify", "Check", "compare", "fingerprint_differences", "DEFAULT_TOLERANCE"]

# How much worse than recorded a re-measured figure may be: `verify --tolerance`'s default, and what a packaged
# build's first start (autotune/serve/first_start.py) holds its own figures to.
DEFAULT_TOLERANCE = 0.10

# (metric, better direction): a figure fails only when it is worse than recorded by more than the tolerance.
# A recipe of a study under latency objectives also has its goodput re-measured under its SLO (the rate search's
# own resolution is 10%: a tolerance below that can fail a recipe that holds).
_FIGURES = (("throughput_tok_s", "higher"), ("ttft_p50_ms", "lower"), ("ttft_p99_ms", "lower"),
            ("tpot_p50_ms", "lower"), ("tpot_p99_ms", "lower"), ("peak_memory_mb", "lower"),
            ("goodput_req_s", "higher"))


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    recorded: float
    measured: float
    better: str
    tolerance: float

    @property
    def change(self) -> float:
        return self.measured / self.recorded - 1 if self.recorded else 0.0

    @property
    def worsening(self) -> float:
        """How many times worse than recorded (1.0: as recorded or better), in the figure's own direction."""
        if self.recorded <= 0 or self.measured <= 0:
            return 1.0 if self.measured == self.recorded else float("inf")
        ratio = self.recorded / self.measured if self.better == "higher" else self.measured / self.recorded
        return max(ratio, 1.0)

    @property
    def holds(self) -> bool:
        # As a ratio, so that a tolerance of 0.1 means "10% worse" both ways and stays meaningful above 1.
        return self.worsening <= 1 + self.tolerance


def compare(recorded: dict, measured: dict, tolerance: float) -> list[Check]:
    return [Check(name, float(recorded[name]), float(measured[name]), better, tolerance)
            for name, better in _FIGURES if recorded.get(name) is not None and measured.get(name) is not None]


def _software_here(recorded: dict) -> dict:
    out = {}
    for name in recorded:
        if name == "python":
            out[name] = platform.python_version()
            continue
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def fingerprint_differences(recipe: dict, hardware: dict) -> list[str]:
    recorded_hw = recipe.get("hardware") or {}
    diffs = [f"hardware {k}: recipe {recorded_hw.get(k)!r}, here {hardware.get(k)!r}"
             for k in sorted(set(recorded_hw) | set(hardware)) if recorded_hw.get(k) != hardware.get(k)]
    if (recipe.get("metrics") or {}).get("source") == "simulated":
        return diffs  # the simulator's "software" is its own version and profile: nothing to compare here
    software = recipe.get("software") or {}
    here = _software_here(software)
    diffs += [f"software {k}: recipe {software[k]!r}, here {here[k]!r}" for k in software if software[k] != here[k]]
    return diffs


def _measure(recipe: Recipe, backend: Backend, threads: int | None, repeats: int, timeout_s: float) -> JobResult:
    data = recipe.data
    spec = resolve_model(recipe.model)
    if not spec.has_weights:
        raise UserInputError(f"{recipe.model} has no weights on this machine: its recipe cannot be measured here "
                             "(verify it where the model's weights are, or use a local Hugging Face folder)")
    checksum = model_checksum(spec)
    gate = data.get("gate") or {}
    common = dict(model=recipe.model, workload=data["workload"], eval_positions=EVAL_POSITIONS, repeats=repeats)
    if not reference_path(checksum, eval_set_digest(EVAL_POSITIONS)).is_file():
        log("verify: reference: fp32 eager transformers over the evaluation text (cached afterwards)")
        result = backend.run(Job(kind=JobKind.REFERENCE, **common), timeout_s)
        if not result.ok:
            raise AutotuneError(f"the reference could not be computed: {result.reason}")
    log(f"verify: rebuild {recipe.config.label()}, gate and benchmark ({repeats} timed runs)")
    # The layers the recipe kept in the compute dtype, as recorded: a ranking redone here could pick others.
    keep = list(recipe.kept_layers) or None
    slo = (data.get("goodput") or {}).get("slo")
    job = Job(kind=JobKind.TRIAL, config=recipe.config.to_dict(), threads=threads, keep=keep,
              min_agreement=gate.get("min_agreement", 0.995), tie_epsilon=gate.get("tie_epsilon", 0.05),
              accept_marginal=bool(gate.get("accepted_marginal")), slo=slo, **common)
    if slo is not None:
        log(f"verify: and the goodput under its SLO (TTFT {slo['ttft_ms']:g} ms, TPOT {slo['tpot_ms']:g} ms, "
            f"{slo['attainment']:.0%} of requests)")
    result = backend.run(job, timeout_s)
    if result.status is Status.ERROR:
        tail = "\n".join((result.log_tail or [])[-5:])
        raise AutotuneError(f"the configuration could not be rebuilt here: {result.reason}\n{tail}".rstrip())
    return result


def _print_side_by_side(checks: list[Check], recorded_gate: dict, gate: dict, predicted: bool,
                        comparable: bool = True) -> None:
    what = ("predicted" if comparable else "predicted*") if predicted else "recorded"
    print(f"{'figure':<22} {what:>12} {'measured':>12} {'change':>8}  verdict")
    for key in ("tie_aware_agreement", "raw_agreement", "perplexity", "decode_agreement"):
        if gate.get(key) is not None:
            rec = recorded_gate.get(key)
            print(f"gate {key:<17} {'-' if rec is None else format(rec, '.4f'):>12} {gate[key]:>12.4f} {'':>8}")
    print(f"{'gate':<22} {verdict_word(recorded_gate) if recorded_gate else 'pass':>12} {verdict_word(gate):>12} "
          f"{'':>8}  {'ok' if gate['passed'] else 'FAILS (min ' + str(gate['min_agreement']) + ')'}")
    for c in checks:
        if not comparable:
            # Another backend's figures: a ratio to the prediction would read as the simulator's error.
            print(f"{c.name:<22} {c.recorded:>12.2f} {c.measured:>12.2f} {'-':>8}  not comparable")
            continue
        verdict = "ok" if c.holds else f"OUT OF TOLERANCE ({c.tolerance:.0%}, {c.better} is better)"
        if predicted:
            verdict = f"simulator error {c.change:+.0%}"
        print(f"{c.name:<22} {c.recorded:>12.2f} {c.measured:>12.2f} {c.change:>+8.1%}  {verdict}")
    if not comparable:
        print("* figures of other hardware than this (predicted for it, or measured on another class)")


def _measured_recipe(recipe: Recipe, result: JobResult, backend: Backend, where: Placement) -> dict:
    data = recipe.data
    # A device_power that was not a thread count here (a simulated GPU's clock level) was not applied: the
    # measured recipe must not hand it to `autotune serve` as one.
    configuration = {**data["configuration"], "device_power": where.threads or 0}
    bench = result.bench or {}
    keep = ("throughput_tok_s", "throughput_min", "throughput_max", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "peak_memory_mb", "kv_reserved_peak_mb", "repeats")
    provenance = {**data["provenance"], "verified_from": str(recipe.path),
                  "date": dt.datetime.now().isoformat(timespec="seconds")}
    return {**{k: v for k, v in data.items() if k != "checksum"}, "backend": backend.name,
            "configuration": configuration,
            "hardware": backend.fingerprint(), "software": result.versions or {},
            "threads": result.threads,
            "metrics": {"source": "measured", **{k: bench.get(k) for k in keep}, "build_s": result.build_s},
            # The baseline's figures belong to the simulated hardware, not to this machine.
            "gate": result.gate, "baseline": None, "provenance": provenance,
            "deploy": {**data["deploy"], **({"build": result.build} if result.build else {})}}


def verify(args) -> int:
    if args.tolerance < 0:
        raise UserInputError(f"--tolerance must be >= 0, not {args.tolerance}")
    key = read_key(args.require_signature) if getattr(args, "require_signature", None) else None
    recipe = load_recipe(args.recipe, force=args.force, key=key)
    if not recipe.verified:
        log(f"verify: recipe accepted with --force, UNVERIFIED: {'; '.join(recipe.problems[:3])}")
    data = recipe.data
    where = place(recipe)  # a measured recipe whose backend is absent here: refused in one line
    backend = get_backend(where.backend)
    comparable = where.comparable
    if not where.comparable:
        print(f"verify: this recipe was {where.target.describe()}; it runs here on {where.backend} ({where.why}): "
              f"the figures below are of {where.backend} and NOT comparable with the recipe's")
    elif not recipe.simulated and where.target.hardware != backend.hardware_name():
        # Another class of the same backend: a bf16 recipe of an AVX-512 machine is emulated on an AVX2 one.
        comparable = False
        note = class_note(where.target.hardware)
        print(f"verify: this recipe was measured on {note or where.target.hardware}; this machine is "
              f"{backend.hardware_name()}: the figures below are NOT comparable with the recipe's; the gate is")
    diffs = fingerprint_differences(data, backend.fingerprint())
    if diffs:
        print("fingerprint differs from the recipe's (figures may legitimately differ):")
        for line in diffs:
            print(f"  {line}")
    else:
        print("fingerprint: same hardware and software as the recipe")
    spec = resolve_model(recipe.model)
    here = model_checksum(spec) if spec.has_weights else None
    if here is not None and here != data["model"]["checksum"]:
        # The recipe's gate and figures are of other weights: a pass here would not be its pass.
        print(f"verify: the weights of {recipe.model} here ({here}) are not the ones the recipe was made for "
              f"({data['model']['checksum']})" + ("; --force: measured anyway, NOT judged" if args.force else ""))
        if not args.force:
            print("verify: FAILED: other weights (pass --force to measure them anyway)")
            return 1
        comparable = False
    repeats = args.repeats or int(data["metrics"].get("repeats") or 3)
    result = _measure(recipe, backend, where.threads, repeats, args.timeout)
    if result.build and (difference := recipe.build_difference(result.build)):
        print(f"verify: {difference}")
    gate = result.gate or {}
    goodput = data.get("goodput")
    recorded = {**data["metrics"], **({"goodput_req_s": goodput["goodput_req_s"]} if goodput else {})}
    checks = compare(recorded, result.bench, args.tolerance) if result.bench is not None else []
    _print_side_by_side(checks, data.get("gate") or {}, gate, recipe.simulated, comparable)
    if not gate["passed"]:
        print("verify: FAILED: the accuracy gate fails here")
        return 1
    if not comparable and not recipe.simulated:
        print("verify: the gate passes here; the figures belong to another hardware class or other weights and "
              "were not judged")
        return 0
    if recipe.simulated:
        assert recipe.path is not None
        out = recipe.path.with_name(recipe.path.stem + ".measured.yaml")
        write_recipe(out, _measured_recipe(recipe, result, backend, where), key)  # signed as its source was
        print(f"verify: measured recipe ({where.backend}, {backend.hardware_name()}) written to {out}")
        return 0
    failed = [c.name for c in checks if not c.holds]
    if failed:
        print(f"verify: FAILED: {', '.join(failed)} out of tolerance ({args.tolerance:.0%})")
        return 1
    print(f"verify: OK: every figure within {args.tolerance:.0%} and the gate passes")
    return 0
