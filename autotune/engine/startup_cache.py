"""A served engine's compiled graphs, kept for its next start on this machine: torch's own cache artifacts
(`torch.compiler.save_cache_artifacts`: inductor's FX graphs and AOT autograd's entries), saved after the first
start's warm-up and loaded before the next build, in a folder of the cache root per recipe, with the key they
were made under beside them.

Loading can never change what the server computes. The artifacts only fill inductor's own caches, whose keys (the
graph, its shapes, inductor's settings, torch's version) decide whether an entry is used; our key decides only
whether a bundle is worth loading, and a stale, foreign or corrupt one is ignored with the reason in the log.
The bundle holds the compiled graphs, not the C++ kernels they call: those stay in inductor's own cache folder
(TORCHINDUCTOR_CACHE_DIR; /tmp/torchinductor_$USER unless set), and where that was cleared they compile again.

Frozen graphs are not cacheable this way: inductor bypasses its FX graph cache for a graph that holds weights
prepacked for oneDNN (it says "mkldnn tensors unpickleable"; O2 on the CPU prepacks every linear layer), and AOT
autograd's cache refuses freezing outright. Their bypasses are counted during the start and said in the log. So O2
on the CPU is served from AOTInductor packages instead (engine/packaged.py), kept in a folder keyed by what was
built (devices/kept_packages.py: the trial that measured the recipe made them, so the machine that searched serves
at once), or else in the `o2` folder of the same bundle under the same key (`packages()`): a folder made under
another key is emptied, with the reason in the log.
An accelerator's O2 goes through its Device's compiler, and keeps torch's artifacts as O1 does."""
from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path

import torch

from autotune.engine.compiler_cache import compile_seconds, compiler_cache_counts
from autotune.engine.packaged import digests_path
from autotune.paths import cache_root, private_dir, untrusted, write_atomic
from autotune.progress import log

__all__ = ["StartupCache", "ARTIFACTS", "META", "PACKAGES", "keyed_packages"]

ARTIFACTS, META = "artifacts.bin", "meta.json"
PACKAGES = "o2"


class _Bypasses(logging.Filter):
    """Why inductor did not cache a graph: its own log line, at INFO, counted by reason. The logger's level is
    lowered to INFO while counting; what only that lets through is not printed."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: Counter[str] = Counter()
        self.quiet_below = self.level_before = logging.NOTSET

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Bypassing FX Graph Cache") and record.args:
            self.reasons[str(record.args[0] if isinstance(record.args, tuple) else record.args)] += 1
        return record.levelno >= self.quiet_below

    def start(self) -> None:
        # One filter for the process, whatever the number of starts: a second would drop what the first counts.
        logger = logging.getLogger("torch._inductor.codecache")
        if self not in logger.filters:
            self.quiet_below, self.level_before = logger.getEffectiveLevel(), logger.level
            logger.addFilter(self)
            logger.setLevel(min(self.quiet_below, logging.INFO))
        self.reasons.clear()

    def stop(self) -> None:
        logger = logging.getLogger("torch._inductor.codecache")
        if self in logger.filters:
            logger.removeFilter(self)
            logger.setLevel(self.level_before)


_BYPASSES = _Bypasses()


class StartupCache:
    """One recipe's bundle: `load()` before building the engine, `save()` once it is warm."""

    def __init__(self, folder: Path, key: dict[str, str], enabled: bool = True, packaged: bool = False,
                 packages_folder: Path | None = None) -> None:
        self.folder, self.key, self.enabled, self.packaged = folder, key, enabled, packaged
        self.packages_folder = packages_folder
        self.loaded = False

    @classmethod
    def keyed(cls, key: dict, fusion_level: str, packaged: bool, packages_folder: Path | None = None
              ) -> StartupCache:
        """The bundle of the recipe whose content `key["recipe"]` names (serve/startup_key.py makes the key);
        `packaged`: O2 on the CPU, whose graphs are AOTInductor packages, in `packages_folder` where given (the
        folder kept by the build: a trial's packages are a later start's)."""
        # O0 compiles nothing: there is nothing to keep. O2 on the CPU compiles nothing through torch.compile.
        return cls(cache_root() / "startup" / key["recipe"].removeprefix("sha256:")[:16], key,
                   enabled=fusion_level != "O0" and not packaged, packaged=packaged, packages_folder=packages_folder)

    def packages(self) -> Path | None:
        """The folder of O2's AOTInductor packages (engine/packaged.py) when this start is served from them: the
        one kept by what was built (`packages_folder`: devices/kept_packages.py), else the `o2` folder of this
        bundle, under its key (keyed_packages)."""
        if not self.packaged:
            return None
        if self.packages_folder is not None:
            return self.packages_folder
        return keyed_packages(self.folder / PACKAGES, self.key)

    def report_packages(self, packaged) -> None:
        """Say how the start went with O2's packages (`packaged`: engine/packaged.py PackagedGraphs)."""
        log(f"serve: O2 graphs: {packaged.num_loaded} loaded from {packaged.folder}, {packaged.num_compiled} "
            f"compiled and saved there ({packaged.compile_seconds:.1f} s compiling)")

    def load(self) -> bool:
        """Fill torch's caches from the bundle, if there is one made under this key; True when it was loaded.
        Starts counting inductor's bypasses for save()."""
        if not self.enabled:
            return False
        _BYPASSES.start()
        why = self._refusal()
        if why is None:
            try:
                info = torch.compiler.load_cache_artifacts((self.folder / ARTIFACTS).read_bytes())
            except Exception as exc:  # noqa: BLE001  a bundle that torch cannot read is no reason not to start
                why = f"torch could not load it ({type(exc).__name__}: {exc})"
            else:
                if info is None:
                    why = "torch could not read its artifacts"
                else:
                    self.loaded = True
                    log(f"serve: start-up cache loaded from {self.folder} ({len(info.inductor_artifacts)} compiled "
                        f"graphs, {len(info.aot_autograd_artifacts)} AOT autograd entries)")
        if why is not None:
            log(f"serve: start-up cache not used: {why}")
        return self.loaded

    def _refusal(self) -> str | None:
        """Why the bundle is not to be loaded; None when it is. Its artifacts are compiled kernels that torch loads
        into this process: from a folder others could write to, never (as O2's packages)."""
        meta_path, data_path = self.folder / META, self.folder / ARTIFACTS
        if not meta_path.exists():
            return f"none yet in {self.folder}"
        if (why := untrusted(self.folder)) is not None:
            return why
        try:
            meta = json.loads(meta_path.read_text())
            made_under, digest = dict(meta["key"]), str(meta["sha256"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"its metadata {meta_path} is unreadable ({type(exc).__name__}: {exc}); it will be replaced"
        changed = [f"{name} {made_under.get(name)!r} there, {value!r} here" for name, value in self.key.items()
                   if made_under.get(name) != value]
        if changed:
            return f"{self.folder} was made under another key ({'; '.join(changed)}); it will be replaced"
        try:
            data = data_path.read_bytes()
        except OSError as exc:
            return f"{data_path} is unreadable ({exc.strerror or exc}); it will be replaced"
        if hashlib.sha256(data).hexdigest() != digest:
            return f"{data_path} does not match the checksum in its metadata (corrupt); it will be replaced"
        return None

    def save(self) -> None:
        """Write what this start compiled (after warm-up), unless the loaded bundle already held all of it, and
        say how the start went: graphs loaded, compiled, and not cacheable with inductor's reason."""
        if not self.enabled:
            return
        reasons = Counter(_BYPASSES.reasons)
        _BYPASSES.stop()
        counts = compiler_cache_counts()
        reasons["reason not logged"] = counts.get("bypasses", 0) - sum(reasons.values())
        bypassed = "".join(f"; {n} not cacheable by torch ({why})" for why, n in reasons.items() if n > 0)
        log(f"serve: compiled graphs: {counts.get('hits', 0)} from the cache, {counts.get('misses', 0)} compiled"
            f"{bypassed}; {compile_seconds():.1f} s compiling")
        if self.loaded and not counts.get("misses"):
            return
        try:
            saved = torch.compiler.save_cache_artifacts()
        except Exception as exc:  # noqa: BLE001  the server is warm: a cache it cannot write must not stop it
            log(f"serve: start-up cache not saved: torch could not serialize it ({type(exc).__name__}: {exc})")
            return
        if saved is None:
            log("serve: start-up cache not saved: torch recorded nothing cacheable in this start")
            return
        data = saved[0]
        meta = {"key": self.key, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                "inductor_artifacts": len(saved[1].inductor_artifacts)}
        try:
            private_dir(self.folder)
            # Artifacts first, metadata last, each replaced whole: a reader sees the old pair or a checksum miss.
            write_atomic(self.folder / ARTIFACTS, data)
            write_atomic(self.folder / META, json.dumps(meta, indent=1).encode())
        except OSError as exc:
            log(f"serve: start-up cache not saved in {self.folder}: {exc.strerror or exc}")
            return
        log(f"serve: start-up cache saved in {self.folder} ({len(data) / 2**20:.1f} MiB, "
            f"{meta['inductor_artifacts']} compiled graphs)")


def keyed_packages(folder: Path, key: dict) -> Path | None:
    """`folder`, for AOTInductor packages made under `key`: one made under another key, or whose key is unreadable,
    is emptied first, said why; None where it cannot be kept (the packages are then compiled in memory only)."""
    why = None
    try:
        made_under = dict(json.loads((folder / META).read_text())["key"])
    except FileNotFoundError:
        why = f"none yet in {folder}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"its metadata {folder / META} is unreadable ({type(exc).__name__}: {exc}); it is emptied"
    else:
        changed = [f"{name} {made_under.get(name)!r} there, {value!r} here" for name, value in key.items()
                   if made_under.get(name) != value]
        if changed:
            why = f"{folder} was made under another key ({'; '.join(changed)}); it is emptied"
    if why is None:
        log(f"O2 packages from {folder}")
        return folder
    log(f"O2 packages not used: {why}")
    try:
        for path in [*folder.glob("*"), digests_path(folder)]:
            if path.is_file():
                path.unlink()
        private_dir(folder)
        write_atomic(folder / META, json.dumps({"key": key}, indent=1).encode())
    except OSError as exc:
        log(f"O2 packages cannot be kept in {folder} ({exc.strerror or exc}): compiled in memory only")
        return None
    return folder
