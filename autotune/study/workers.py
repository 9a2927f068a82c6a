"""`autotune worker`: join an existing study and run its trials until its budget is spent; and the local
workers of `autotune search --workers N`. Workers coordinate through the study's storage only."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
from sqlalchemy.engine import make_url

from autotune.backends import Backend, make_backend
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.progress import log
from autotune.redact import password_of, redact
from autotune.space.search_space import SearchSpace, default_space, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.coordination import worker_id
from autotune.study.loop import run_search
from autotune.study.settings import SearchSettings, make_sampler
from autotune.study.storage import PASSWORD_ENV, load_existing_study

__all__ = ["SETTINGS_ATTR", "settings_attr", "join_study", "run_local_workers"]

SETTINGS_ATTR = "worker_settings"  # everything a worker needs to run this study's trials as `search` would


def search_space(backend: Backend, space_file: str | Path | list | tuple | None,
                 runtimes: tuple[str, ...] | None, serving: bool = False) -> SearchSpace:
    """The space a search of `backend` runs: `space_file`'s where given (several files, one per runtime, as one
    space on a backend that runs several runtimes); on such a backend (the CPU's `space_over`), the default spaces
    of `runtimes` (None: every one this machine can run) as one; else the backend's runtime's default space.
    `serving`: the study measures on the serving path (goodput under latency objectives); without it the knobs
    only serving reads are dropped (space/serving_knobs.py)."""
    space = _search_space(backend, space_file, runtimes)
    return space if serving else offline_space(space)


def _search_space(backend: Backend, space_file: str | Path | list | tuple | None,
                  runtimes: tuple[str, ...] | None) -> SearchSpace:
    files = [space_file] if isinstance(space_file, (str, Path)) else list(space_file or ())
    span = getattr(backend, "space_over", None)
    if len(files) > 1:
        if span is None:
            raise UserInputError(f"backend {backend.name} runs one runtime: give it one space file")
        return span(None, tuple(str(f) for f in files))
    if files:
        return backend.space_for(load_space(files[0]))
    if span is not None:
        return span(runtimes)
    if runtimes is not None and tuple(runtimes) != (backend.runtime,):
        raise UserInputError(f"backend {backend.name} runs the {backend.runtime} runtime only, not {list(runtimes)}")
    return backend.space_for(load_space(default_space(backend.runtime)))


def settings_attr(settings: SearchSettings, backend: str, hardware: str | None, space: str | None, isolate: bool,
                  runtimes: tuple[str, ...] | None = None) -> dict:
    return {"model": settings.model, "workload": settings.workload.to_dict(), "min_agreement": settings.min_agreement,
            "tie_epsilon": settings.tie_epsilon, "accept_marginal": settings.accept_marginal,
            "memory_budget_mb": settings.memory_budget_mb,
            "tpot_slo_ms": settings.tpot_slo_ms, "sampler": settings.sampler, "seed": settings.seed,
            "trial_timeout_s": settings.trial_timeout_s, "repeats": settings.repeats,
            "repeat_time_s": settings.repeat_time_s, "timeout_s": settings.timeout_s, "deadline": settings.deadline,
            "trial_memory_mb": settings.trial_memory_mb, "backend": backend, "hardware": hardware, "space": space,
            "runtimes": list(runtimes) if runtimes else None, "isolate": isolate, "guided": settings.guided,
            "patience": settings.patience, "slo": settings.slo.to_dict() if settings.slo is not None else None}


def _settings(study: optuna.Study, url: str, seed_offset: int | None) -> tuple[SearchSettings, dict]:
    saved = study.user_attrs.get(SETTINGS_ATTR)
    if not saved or "target_trials" not in study.user_attrs:
        raise UserInputError(f"study {study.study_name!r} was not started by `autotune search` (no {SETTINGS_ATTR}"
                             " attribute): start it with autotune search, then add workers")
    keys = ("model", "min_agreement", "tie_epsilon", "accept_marginal", "memory_budget_mb", "tpot_slo_ms", "sampler",
            "trial_timeout_s", "repeats", "trial_memory_mb", "repeat_time_s", "timeout_s", "deadline", "patience")
    # Workers with one seed would suggest the same configurations: local workers get seed + index, others none.
    seed = saved["seed"] + seed_offset if saved.get("seed") is not None and seed_offset is not None else None
    settings = SearchSettings(study=study.study_name, storage=url, trials=None, workload=Workload(**saved["workload"]),
                              seed=seed, guided=saved.get("guided", True),
                              slo=Slo(**saved["slo"]) if saved.get("slo") else None,
                              **{k: saved[k] for k in keys if k in saved})
    return settings, saved


def join_study(name: str, storage: str, password_file: str | None = None, worker_index: int | None = None) -> None:
    """Run the trials of a study that `autotune search` started, until its budget is spent. Local workers get
    their index (their seed is the study's plus it); a worker on another machine passes None."""
    study, url = load_existing_study(name, storage, password_file)
    settings, saved = _settings(study, url, worker_index)
    backend = make_backend(saved["backend"], saved["hardware"], saved["isolate"], settings.trial_memory_mb)
    runtimes = saved.get("runtimes")
    space = search_space(backend, saved["space"], tuple(runtimes) if runtimes else None,
                         serving=settings.slo is not None)
    study.sampler = make_sampler(settings.sampler, settings.seed, grouped=bool(space.parts))
    target = study.user_attrs["target_trials"]
    name = worker_id() if worker_index is None else str(worker_index)
    budget = f"{target} trials" if target is not None else "no trial count"
    log(f"worker {name} joins study {study.study_name} in {redact(url)}: budget {budget}")
    run_search(settings, space, backend, study, target=target)
    log(f"worker {name}: the study's budget is spent")


def run_local_workers(num_workers: int, study: str, url: str) -> None:
    """Start `num_workers` worker processes on this machine and wait for them. The password travels in their
    environment, never on their command line (which `ps` shows to every user)."""
    env = dict(os.environ)
    secret = password_of(url)
    if secret:
        env[PASSWORD_ENV] = make_url(url).password or secret
        url = make_url(url).set(password=None).render_as_string(hide_password=False)
    procs = [subprocess.Popen([sys.executable, "-m", "autotune.cli", "worker", "--study", study, "--storage", url,
                               "--worker-index", str(i)], env=env) for i in range(num_workers)]
    log(f"{num_workers} local workers started (pids {', '.join(str(p.pid) for p in procs)})")
    try:
        codes = [p.wait() for p in procs]
    except BaseException:  # Ctrl-C or SIGTERM: each worker fails its running trial (retried on resume) and exits
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        raise
    failed = [c for c in codes if c != 0]
    if failed:
        log(f"{len(failed)} of {num_workers} workers exited with an error (codes {failed}); see their lines above")
