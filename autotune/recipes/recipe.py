"""Frozen recipes: the self-describing result of a study, one YAML file per chosen configuration.

A recipe is checked on load against the published JSON Schema (autotune/recipes/schemas/recipe-v1.schema.json) and
against the checksum it carries of its own content, so that a hand-edited or corrupted file is refused."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import optuna
import yaml

from autotune import __version__
from autotune.config.deploy import DeployConfig
from autotune.errors import UserInputError
from autotune.gate.design import GATE_VERSION
from autotune.host import class_note
from autotune.llamacpp.build_info import SERVER_FIELDS
from autotune.progress import log
from autotune.recipes.baselines import study_baselines
from autotune.recipes.compute_limit import trial_compute_limit
from autotune.recipes.signature import canonical_json, content_of, sign, signature_problem
from autotune.redact import redact

__all__ = ["SCHEMA_VERSION", "SCHEMA_PATH", "Recipe", "RecipeInvalid", "build_recipe", "HOLDOUT_ATTR", "holdout_of",
           "holdout_verdict", "seal", "dump_recipe", "write_recipe", "load_recipe", "recipe_checksum", "recipe_dir",
           "DEFAULT_MAX_SEQ_LEN"]

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / f"recipe-v{SCHEMA_VERSION}.schema.json"
# Serving accepts prompt + new tokens up to this by default; at least the benchmarked lengths.
DEFAULT_MAX_SEQ_LEN = 512
_METRICS = ("throughput_tok_s", "throughput_min", "throughput_max", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "peak_memory_mb", "kv_reserved_peak_mb", "repeats")


class RecipeInvalid(UserInputError):
    """A recipe that does not match its schema or its own checksum (edited by hand, or corrupted)."""


@dataclass(slots=True)
class Recipe:
    """A loaded recipe. `verified` is False when it was accepted with --force despite `problems`."""

    data: dict
    path: Path | None = None
    verified: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def config(self) -> DeployConfig:
        return DeployConfig.from_dict(self.data["configuration"])

    @property
    def model(self) -> str:
        return self.data["model"]["name"]

    @property
    def max_seq_len(self) -> int:
        return int(self.data["deploy"]["max_seq_len"])

    @property
    def simulated(self) -> bool:
        return self.data["metrics"]["source"] == "simulated"

    @property
    def notes(self) -> list[str]:
        """What to know before reading its figures here: a hardware class named under an older rule (before
        classes carried the ISA level, or the microarchitecture), a gate older than today's."""
        out = []
        hardware = str((self.data.get("hardware") or {}).get("hardware", ""))
        note = class_note(hardware)
        if note:
            out.append(f"its hardware class {note}")
        gate = self.data.get("gate") or {}
        if gate and gate.get("measured", True) is not False and gate.get("decode_agreement") is None:
            out.append("it was gated before the gate checked the decode path: its gate figures are not today's gate's "
                       "(autotune verify re-gates it)")
        elif gate and gate.get("measured", True) is not False and str(gate.get("version", "2")) != GATE_VERSION:
            out.append(f"it was gated by gate version {gate.get('version', '2')}, not today's {GATE_VERSION} (another "
                       "decode check or verdict rule): autotune verify re-gates it")
        if gate.get("accepted_marginal"):
            out.append(f"its gate verdict was marginal ({gate.get('decode_verdict')}), accepted by "
                       "--accept-marginal: it may be below the threshold")
        held = gate.get("holdout")
        verdict = holdout_verdict(held)
        if verdict == "not run":
            out.append("its held-back check (the decode check on prompts no trial saw) could not run: "
                       + held["reason"])
        elif verdict == "marginal":
            out.append(f"its held-back check was undecided at its cap ({held['decode_agreement']:.4f} over "
                       f"{held['decode_positions']} positions): it may be nearer the threshold than its gate says")
        ran = self.data["metrics"].get("concurrency_peak")
        if ran is not None and ran < self.config.batch_size:
            out.append(f"at most {ran} of its batch of {self.config.batch_size} sequences ran at once (its KV page "
                       "pool held no more): its figures are of that concurrency")
        if not self.simulated and self.data["metrics"].get("repeats") == 1:
            out.append("its figures come from one timed run of the workload (the time cap or a clearly dominating "
                       "front point ended the others): their spread is not known")
        return out

    def build_difference(self, built: dict) -> str | None:
        """What differs between the engine measured for this recipe (deploy.build) and `built` (Engine.build_record
        of the one built here), in one line; None where they are the same. A recipe made before builds were
        recorded says so: its figures may be of another artifact (O2 on the CPU was a torch.compile then)."""
        recorded = self.data["deploy"].get("build")
        if recorded is None:
            return (f"this recipe does not record what its figures were measured on (made before builds were "
                    f"recorded); here it runs as {built['artifact']}: autotune verify measures that")
        changed = [f"{k} {recorded.get(k)!r} there, {v!r} here" for k, v in built.items() if recorded.get(k) != v]
        return f"built otherwise than it was measured: {'; '.join(changed)}" if changed else None

    @property
    def kept_layers(self) -> tuple[str, ...]:
        """The decoder linear layers this recipe's quantization keeps in the compute dtype (fallback_layers)."""
        return tuple((self.data.get("quantization") or {}).get("kept_layers", ()))


def recipe_dir(out: str | Path, model: str, hardware: str) -> Path:
    # A local model folder is named by its last component, never by its absolute path.
    return Path(out) / Path(model).name / hardware


# A study attribute per trial: "holdout:<number>", its held-back check (autotune/results/holdout.py). On the study,
# not the trial, because a finished trial's attributes cannot be changed.
HOLDOUT_ATTR = "holdout:"


def holdout_of(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict | None:
    return study.user_attrs.get(f"{HOLDOUT_ATTR}{trial.number}")


def holdout_verdict(record: dict | None) -> str | None:
    """A held-back check's verdict: "pass", "FAIL", "marginal" (undecided at the cap) or "not run" (its reason
    stored); None where there is no check. The last two leave the front unless --accept-marginal (results/front.py)."""
    if not record:
        return None
    if "reason" in record:
        return "not run"
    if record["decode_passed"]:
        return "pass"
    return "FAIL" if record["decode_decided"] else "marginal"


def build_recipe(study: optuna.Study, trial: optuna.trial.FrozenTrial, storage_url: str, picks: list[str]) -> dict:
    attrs = study.user_attrs
    bench = trial.user_attrs["bench"]
    baselines = [_baseline_entry(b, bench) for b in study_baselines(attrs)]
    workload = attrs["workload"]
    recipe = {
        "schema_version": SCHEMA_VERSION,
        "kind": "autotune-recipe",
        "model": {"name": attrs["model"], "source": attrs["model_source"], "checksum": attrs["model_checksum"],
                  # transformers' model_type; studies made before it was recorded have none
                  **({"architecture": attrs["model_architecture"]} if "model_architecture" in attrs else {})},
        "backend": attrs["backend"],
        "hardware": attrs["hardware"],
        "software": {k: v for k, v in trial.user_attrs.get("versions", {}).items() if k not in SERVER_FIELDS},
        "configuration": trial.user_attrs["config"],
        "quantization": _quantization(trial.user_attrs.get("quant")),
        "threads": trial.user_attrs.get("threads"),
        "workload": workload,
        "metrics": {"source": "measured" if attrs.get("measured", True) else "simulated",
                    **{k: bench.get(k) for k in _METRICS}, "build_s": trial.user_attrs.get("build_s"),
                    # The most sequences that ran at once (below batch_size where the pool's pages ran out first).
                    **({"concurrency_peak": bench["concurrency_peak"]} if "concurrency_peak" in bench else {}),
                    # Only where the peak also holds loading and building (benchmark/bench.py), so that it says so.
                    **({"peak_memory_reset": False} if bench.get("peak_memory_reset") is False else {}),
                    # The decode's compute rate against this machine's measured matmul rate (sim/limit.py).
                    **({"compute_limit": limit} if (limit := trial_compute_limit(attrs, trial.user_attrs)) else {})},
        "gate": _gate(study, trial),
        # The first speed baseline (as a user loads the model), and every one measured in the study.
        "baseline": {k: v for k, v in baselines[0].items() if k not in ("name", "dtype")} if baselines else None,
        "baselines": baselines,
        "picks": picks,
        # The trial's completion time, never the export time: re-exporting an unchanged study gives the same bytes.
        "provenance": {"study": study.study_name, "storage": redact(storage_url), "trial": trial.number,
                       "date": (trial.datetime_complete or trial.datetime_start or dt.datetime(1970, 1, 1))
                       .isoformat(timespec="seconds"), "autotune": __version__},
        "deploy": {"command": "autotune serve RECIPE", "env": {"HF_HUB_OFFLINE": "1"},
                   "max_seq_len": max(DEFAULT_MAX_SEQ_LEN, workload["prompt_max"] + workload["output_tokens"])},
    }
    if recipe["quantization"] is None:
        del recipe["quantization"]
    if trial.user_attrs.get("goodput"):  # a study under latency objectives: the SLO, the goodput, every rate tried
        recipe["goodput"] = trial.user_attrs["goodput"]
    if trial.user_attrs.get("build"):
        # What was gated and benchmarked: `verify` and `serve` build the same and say so where they cannot.
        recipe["deploy"]["build"] = trial.user_attrs["build"]
    if trial.user_attrs.get("what") and recipe["configuration"].get("runtime") == "llamacpp":
        # What `autotune serve` runs for it (autotune/serve/llama_server.py), and what serves it without autotune.
        recipe["deploy"]["llama_server"] = trial.user_attrs["what"]
        # The GGUF measured and the llama-server that serves it, checked before `autotune serve` execs it.
        versions = trial.user_attrs.get("versions", {})
        recipe["deploy"].update({k: versions[k] for k in SERVER_FIELDS if k in versions})
    if trial.user_attrs.get("what") and recipe["configuration"].get("runtime") == "openvino":
        recipe["deploy"]["pipeline"] = trial.user_attrs["what"]
    return recipe


def _gate(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict | None:
    gate = trial.user_attrs.get("gate")
    holdout = holdout_of(study, trial)
    return {**gate, "holdout": holdout} if gate is not None and holdout is not None else gate


def _baseline_entry(baseline: dict, bench: dict) -> dict:
    b = baseline["bench"]
    return {"name": "/".join(baseline["names"]), "what": baseline.get("what", "speed baseline"),
            "dtype": baseline.get("dtype"), "throughput_tok_s": b["throughput_tok_s"],
            "tpot_p99_ms": b["tpot_p99_ms"], "peak_memory_mb": b["peak_memory_mb"],
            "throughput_gain": bench["throughput_tok_s"] / b["throughput_tok_s"],
            "tpot_p99_ratio": _ratio(bench["tpot_p99_ms"], b["tpot_p99_ms"]),
            "memory_ratio": _ratio(bench["peak_memory_mb"], b["peak_memory_mb"])}


def _quantization(quant: dict | None) -> dict | None:
    """The trial's quantize step as the recipe states it: method, layers kept (most sensitive first, each with its
    measured error) and converted, and the calibration set; None for round-to-nearest without fallback."""
    if not quant or (quant.get("method", "rtn") == "rtn" and not quant.get("kept_layers")):
        return None
    out = {k: quant[k] for k in ("method", "fallback_layers", "kept_layers", "decoder_linear_layers", "converted")
           if k in quant}
    sensitivity = quant.get("sensitivity")
    if sensitivity:
        errors = dict(sensitivity["ranking"])
        out["sensitivity"] = {"scheme": sensitivity["scheme"], "method": sensitivity["method"],
                              "measure": sensitivity["measure"],
                              "kept": {name: errors[name] for name in quant.get("kept_layers", []) if name in errors}}
    if quant.get("calibration"):
        out["calibration"] = quant["calibration"]
    return out


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def recipe_checksum(data: dict) -> str:
    """sha256 of the canonical JSON of everything but the checksum itself (and the signature)."""
    return "sha256:" + hashlib.sha256(canonical_json(content_of(data))).hexdigest()


def seal(recipe: dict, key: bytes | None = None) -> dict:
    """The recipe as it will read back from YAML (tuples become lists), with its checksum, signed with `key`
    where one is given (recipes/signature.py)."""
    content = yaml.safe_load(yaml.safe_dump(content_of(recipe), sort_keys=False))
    sealed = {**content, "checksum": recipe_checksum(content)}
    if key is not None:
        sealed = sign(sealed, key)
    problems = _schema_problems(sealed)
    assert not problems, f"built an invalid recipe: {problems}"
    return sealed


def dump_recipe(recipe: dict, key: bytes | None = None) -> str:
    return yaml.safe_dump(seal(recipe, key), sort_keys=False, allow_unicode=True)


def write_recipe(path: Path, recipe: dict, key: bytes | None = None) -> bool:
    """Write (sealed, signed with `key` where given) unless the file already holds the same bytes; True when the
    file changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    recipe = {**recipe, "deploy": {**recipe["deploy"], "command": f"autotune serve {path}"}}
    text = dump_recipe(recipe, key)
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


@cache
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def _schema_problems(data: object) -> list[str]:
    out = []
    for err in sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(map(str, err.absolute_path)) or "(top level)"
        out.append(f"{where}: {err.message}")
    return out


def load_recipe(path: str | Path, *, force: bool = False, key: bytes | None = None) -> Recipe:
    """Load with safe YAML, check schema and checksum. Problems are refused unless `force`, which accepts the
    recipe as unverified (its figures can no longer be trusted). With `key`, a recipe not signed by it is refused,
    `force` or not: who made it is not a figure that can be accepted unverified."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserInputError(f"cannot read recipe {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RecipeInvalid(f"{path} is not valid YAML ({str(exc).splitlines()[0]}): a corrupted recipe") from None
    if not isinstance(data, dict):
        raise RecipeInvalid(f"{path} is not a recipe (expected a mapping at the top level)")
    if key is not None and (why := signature_problem(data, key)) is not None:
        raise RecipeInvalid(f"refusing recipe {path}: a signature is required and {why}")
    problems = []
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        problems.append(f"schema_version {version!r}: this autotune reads version {SCHEMA_VERSION}")
    else:
        problems += _schema_problems(data)
    if "checksum" in data and data["checksum"] != recipe_checksum(data):
        problems.append("content does not match its checksum: the recipe was edited or corrupted after export")
    if problems and not force:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise RecipeInvalid(f"refusing recipe {path}: {shown}. Re-export it, or pass --force to use it "
                            "anyway (it is then treated as unverified)")
    try:
        DeployConfig.from_dict(data["configuration"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecipeInvalid(f"recipe {path} has no usable configuration: {exc}") from None
    recipe = Recipe(data, path, verified=not problems, problems=problems)
    for note in recipe.notes:
        log(f"recipe {path}: {note}")
    return recipe
