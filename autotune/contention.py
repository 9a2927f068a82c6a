"""How much of the machine other processes took while a figure was measured. A run timed while another process held
a core is not the configuration's speed: on a 2-core machine a busy loop on one core slows a 2-thread build by far
more than half (its two threads meet at every operator's barrier, so one contended core stalls both). Read
from the kernel's own counters around each timed run: /proc/stat's busy and steal time over all CPUs, less this
process's CPU time (os.times: every thread of it), as cores' worth on average over the run.

Where /proc/stat is not readable (not Linux), nothing is read and nothing is doubted."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from autotune.progress import log

__all__ = ["CpuSample", "sample", "load_between", "doubt", "measured_quietly", "DOUBT_CORES", "DOUBT_STEAL"]

T = TypeVar("T")

# Other processes' CPU time, in cores on average over a run, past which the run's figure is doubted: half a core
# taken from a build that uses every core slows its barriers by far more than half a core's share.
DOUBT_CORES = 0.5
# The share of the machine's time the hypervisor gave to other guests (steal) past which a figure is doubted.
DOUBT_STEAL = 0.1
_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """Seconds of CPU time since boot over all CPUs: busy (user, nice, system, irq, softirq), steal, all of it;
    and this process's own (user and system, all threads)."""

    busy: float
    steal: float
    total: float
    own: float


def sample(stat: Path = _STAT) -> CpuSample | None:
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
    ticks = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = ticks[:8]
    hz = os.sysconf("SC_CLK_TCK")
    times = os.times()
    return CpuSample(busy=(user + nice + system + irq + softirq) / hz, steal=steal / hz,
                     total=(user + nice + system + idle + iowait + irq + softirq + steal) / hz,
                     own=times.user + times.system)


def load_between(before: CpuSample | None, after: CpuSample | None) -> dict:
    """{"others_cores": other processes' CPU time over the interval in cores on average, "steal_share": the
    hypervisor's share}; {} where either sample is missing or no time passed."""
    if before is None or after is None or after.total <= before.total:
        return {}
    cpus = os.cpu_count() or 1
    elapsed = (after.total - before.total) / cpus  # wall seconds, as the counters saw them
    # Each counter moves by whole ticks, so the difference of busy and own time is uncertain by a tick each: over a
    # run of a few ticks that alone reads as cores' worth of others (a 15 ms run of a tiny model: one stray tick is
    # 0.67 cores). Those two ticks are given to this process.
    tick = 1 / os.sysconf("SC_CLK_TCK")
    others = max(0.0, (after.busy - before.busy) - (after.own - before.own) - 2 * tick)
    return {"others_cores": round(others / elapsed, 3),
            "steal_share": round((after.steal - before.steal) / (after.total - before.total), 3)}


def doubt(figures: dict) -> str | None:
    """Why a run's figures (with load_between's keys) cannot be trusted, or None."""
    others, steal = figures.get("others_cores"), figures.get("steal_share")
    if others is not None and others >= DOUBT_CORES:
        return (f"the machine was busy: other processes took {others:.2f} cores on average during the run "
                f"(doubted past {DOUBT_CORES})")
    if steal is not None and steal >= DOUBT_STEAL:
        return f"the hypervisor took {steal:.0%} of the machine's time during the run (steal; doubted past " \
               f"{DOUBT_STEAL:.0%})"
    return None


def measured_quietly(measure: Callable[[], T], what: str) -> tuple[T, str | None]:
    """`measure()`, taken again once where other processes disturbed it; (its result, why it is still doubted or
    None). For figures kept past this run (a cache): a doubted one is used now and never stored."""
    for attempt in (1, 2):
        before = sample()
        result = measure()
        reason = doubt(load_between(before, sample()))
        if reason is None:
            return result, None
        log(f"{what}: {reason}" + ("; measuring again" if attempt == 1 else "; used for this run only, not cached"))
    return result, reason
