"""The speed baselines of a study, measured in it: transformers' generate as a user loads the model (dtype "auto")
and at the device's fastest plain precision (by its capability probe), as the space file lists them. Where two
resolve to the same precision and batch, one measurement serves both (and says so)."""
from __future__ import annotations

import optuna

from autotune.backends import Backend
from autotune.errors import UserInputError
from autotune.models.registry import ModelSpec
from autotune.models.weights import auto_dtype
from autotune.progress import log
from autotune.space.search_space import SearchSpace, SpeedBaseline
from autotune.trial.job import Job, JobKind

__all__ = ["resolve_baselines", "measure_baselines", "BASELINES_ATTR"]

BASELINES_ATTR = "speed_baselines"
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def resolve_baselines(space: SearchSpace, spec: ModelSpec, fastest: str | None) -> list[tuple[SpeedBaseline, str]]:
    """Each baseline with the precision it runs in: "auto" is the model's own dtype, "fastest" the device's
    fastest plain precision (the space's first dtype where no probe said, else bf16)."""
    if fastest is None:
        dims = {d.name: d for d in space.dimensions}
        fastest = dims["dtype"].values[0] if "dtype" in dims else "bf16"
    out = []
    for b in space.speed_baselines:
        if b.dtype == "auto":
            name = auto_dtype(spec)
            out.append((b, _SHORT.get(name, name)))
        else:
            out.append((b, fastest if b.dtype == "fastest" else b.dtype))
    return out


def _label(baseline: SpeedBaseline, dtype: str) -> str:
    return f'dtype="auto" ({dtype})' if baseline.dtype == "auto" else f"{dtype} ({baseline.dtype})" \
        if baseline.dtype == "fastest" else dtype


def measure_baselines(study: optuna.Study, backend: Backend, spec: ModelSpec, space: SearchSpace, common: dict,
                      timeout_s: float, fastest: str | None) -> dict[str, dict]:
    """Measure the baselines not yet measured for this workload; stores them in the study (BASELINES_ATTR, and
    the first as `speed_baseline`, which studies before there were two held) and returns them by name."""
    stored = dict(study.user_attrs.get(BASELINES_ATTR) or {})
    workload = common["workload"]
    measured: dict[tuple[str, int], str] = {}
    for baseline, dtype in resolve_baselines(space, spec, fastest):
        key = (dtype, baseline.batch_size)
        old = stored.get(baseline.name)
        # A baseline measured on a busy machine (its `doubt`) is measured again on the next run of the search.
        if old and old.get("workload") == workload and old.get("dtype") == dtype \
                and not (old.get("bench") or {}).get("doubt"):
            measured.setdefault(key, baseline.name)
            continue
        if key in measured:
            twin = stored[measured[key]]
            stored[baseline.name] = {**twin, "requested": baseline.dtype, "same_as": measured[key]}
            log(f"speed baseline {baseline.name}: {dtype} at batch {baseline.batch_size}, the same as "
                f"{measured[key]}: measured once")
            continue
        log(f"speed baseline {baseline.name}: transformers generate, {_label(baseline, dtype)}, eager, batch "
            f"{baseline.batch_size}")
        result = backend.run(Job(kind=JobKind.HF_BASELINE, baseline_batch=baseline.batch_size, baseline_dtype=dtype,
                                 **common), timeout_s)
        if not result.ok or result.bench is None:
            raise UserInputError(f"the speed baseline {baseline.name} failed: {result.reason}")
        what = f"transformers generate, {_label(baseline, dtype)}, eager, dynamic cache"
        stored[baseline.name] = {**result.to_dict(), "what": what, "requested": baseline.dtype, "dtype": dtype,
                                 "workload": workload}
        measured[key] = baseline.name
        bench = result.bench
        log(f"  {baseline.name}: {bench['throughput_tok_s']:.1f} tok/s ({bench['repeats']} runs, "
            f"{bench.get('repeats_stop', '')})" + (f"; DOUBTED, measured again on the next run: {bench['doubt']}"
                                                   if bench.get("doubt") else ""))
    stored = {b.name: stored[b.name] for b in space.speed_baselines}
    study.set_user_attr(BASELINES_ATTR, stored)
    study.set_user_attr("speed_baseline", next(iter(stored.values())))
    return stored
