"""O2's frozen graphs as AOTInductor packages on disk, so that a later start loads them instead of compiling.

torch.compile cannot keep a frozen graph between processes: inductor's FX graph cache bypasses any graph that holds
weights prepacked for oneDNN ("mkldnn tensors unpickleable"; O2 on the CPU prepacks every linear layer) and AOT
autograd's cache refuses freezing. AOTInductor compiles the same graph ahead of time, with the same inductor
freezing, into a .pt2 package that holds the kernels, the C++ wrapper and the frozen (prepacked) constants; loading
one takes milliseconds. Each segment entry (prefill, prompt chunk, decode) and the head is exported on first use
with the dimensions that the model's own table marks dynamic for dynamo (engine/model.py DYNAMIC_DIMS) marked so,
and a decode step's batch too (BATCH_DIMS), the rest static, compiled, written to the folder and loaded; a
later start that meets the same inputs (structure, dtypes, static sizes) loads the package. A package that is
corrupt or cannot be loaded is compiled again, with the reason in the log.

A package is native code loaded into the server. It is loaded only from a private folder (paths.py `untrusted`),
and only when its sha256 is the one in the record beside the folder (`DIGESTS`), not in the folder itself: a file
dropped into the folder, with a metadata file of its own, is not loaded."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim
from torch.utils import _pytree as pytree

from autotune.engine.layers import StepInputs
from autotune.engine.model import DYNAMIC_DIMS, EngineModel, Segment
from autotune.errors import UserInputError
from autotune.paths import private_dir, untrusted, write_atomic
from autotune.progress import log

__all__ = ["PackagedGraphs", "package_graphs", "digests_path"]

# What torch.compile runs at O2 on the CPU (engine/build.py COMPILE_MODES): inductor's defaults, frozen. The frozen
# constants stay inside each package's .so (AOTInductor's default): with `aot_inductor.package_constants_in_so`
# False the process crashed loading prepacked weights (torch 2.13). The cost: a loaded package keeps its .so's
# constant pages mapped beside the copies it runs on, so a served O2 process's RSS is above its trial's, by clean
# file-backed pages that the kernel may reclaim.
INDUCTOR_CONFIGS: dict[str, Any] = {"freezing": True}

# Beyond the model's table, a package of a decode step takes every batch of 2 rows or more: one package serves
# every batch bucket (the runner still pads rows to them, a lone row to 2: Engine.runner), where dynamo keeps a
# static graph per bucket (engine/model.py). Each package is an AOTInductor compile of a minute or more on two
# cores, and a server of batch 16 has five buckets. The batch dimension of each decode input, by name.
BATCH_DIMS: dict[str, dict[str, tuple[int, ...]]] = {
    "decode": {"x": (0,), "cos": (0,), "sin": (0,), "slots": (0,), "block_table": (0,), "context_mask": (1,),
               "window_mask": (1,), "local_cos": (0,), "local_sin": (0,)},
}


class _SegmentStep(nn.Module):
    """One segment entry with the step's tensors as a dict, as torch.export takes them (StepInputs is no pytree)."""

    def __init__(self, segment: Segment, prefill: bool) -> None:
        super().__init__()
        self.segment, self.prefill = segment, prefill

    def forward(self, x: torch.Tensor, fields: dict[str, torch.Tensor], k_pools: list[torch.Tensor],
                v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.segment.forward(x, StepInputs(prefill=self.prefill, **fields), k_pools, v_pools)


class _Head(nn.Module):
    def __init__(self, logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)


# The argument names of every entry (the head takes only x), for the leaves that are not step fields.
_ARGUMENTS = ("x", "fields", "k_pools", "v_pools")


def _leaf_names(args: tuple) -> list[str]:
    """The input name that decides each leaf's dynamic dimensions: a step field's own name, else the argument's."""
    names = []
    for path, _ in pytree.tree_flatten_with_path(args)[0]:
        field = len(path) > 1 and isinstance(path[1], pytree.MappingKey)
        names.append(str(path[1].key) if field else _ARGUMENTS[path[0].idx])
    return names


class PackagedGraphs:
    """The packages of one engine in `folder` (which its owner keys: engine/startup_cache.py). `after_compile` runs
    after each compile (engine/spill.py drops the eager weights' pages that it read)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        private_dir(folder)
        if (why := untrusted(folder)) is not None:
            raise UserInputError(why)
        self._digests = _read_digests(digests_path(folder))
        self.after_compile: Callable[[], None] | None = None
        self.num_compiled = self.num_loaded = 0
        self.compile_seconds = 0.0
        # entry and inputs -> [[shape pattern, package (None until first used), its file's stem]], the most dynamic
        # pattern first: where several fit a step, the one that serves every size runs (the one a first-start check
        # ran), not a static one that a trial left in the same folder.
        self._programs: dict[tuple, list[list]] = {}
        # The packages (stems) run since `ran` was last emptied; those the first-start check ran (serve/first_start.py),
        # once it has: a package outside them that runs is said, once.
        self.ran: set[str] = set()
        self.checked: set[str] | None = None

    def run(self, name: str, kind: str, module: nn.Module, args: tuple) -> Any:
        """`module(*args)`, by the package compiled for these inputs (loaded, or compiled and saved first)."""
        # A plain tuple as the key, not the pytree spec: this runs for every segment at every step.
        leaves = _leaves(args)
        key = (name, kind, *(tuple(a) if isinstance(a, dict) else len(a) for a in args if not _is_tensor(a)))
        programs = self._programs.get(key)
        if programs is None:
            programs = self._programs[key] = self._load_all(_signature(name, kind, args, leaves))
        for found in programs:
            if _fits(found[0], leaves):
                if found[1] is None:
                    found[1] = self._load(found[2])
                    if found[1] is None:
                        programs.remove(found)
                        break
                if found[2] not in self.ran:
                    self._first_run(found[2])
                return found[1](*args)
        programs.append(self._compile(_signature(name, kind, args, leaves), name, kind, module, args, leaves))
        self._first_run(programs[-1][2])
        return programs[-1][1](*args)

    def _first_run(self, stem: str) -> None:
        self.ran.add(stem)
        if self.checked is not None and stem not in self.checked:
            log(f"WARNING: O2 graph {stem} runs, which the first-start check of these packages did not run")

    def _load_all(self, signature: str) -> list[list]:
        """Every package in the folder made for this signature, by its metadata; each is loaded when a step first
        fits it (_load), so that a package no step of this process runs costs no memory."""
        found = []
        for meta_path in sorted(self.folder.glob(f"{signature}-*.json")):
            try:
                pattern = json.loads(meta_path.read_text())["pattern"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log(f"O2 package {meta_path.with_suffix('.pt2').name} not used: its metadata is unreadable "
                    f"({type(exc).__name__}: {exc})")
                continue
            found.append([pattern, None, meta_path.stem])
        return sorted(found, key=lambda f: -sum(d is None for dims in f[0] for d in dims))

    def _load(self, stem: str) -> Any:
        """The package `stem`, checked against the start-up record's digest; None where it cannot be used (it is
        compiled again), said why."""
        package = self.folder / f"{stem}.pt2"
        try:
            # Read again where missing: another build of this configuration may have recorded it since.
            expected = self._digests.get(package.name) or _read_digests(digests_path(self.folder)).get(package.name)
            if expected is None:
                raise ValueError(f"it is not in the start-up record {digests_path(self.folder)} (not compiled "
                                 "by a build of this configuration)")
            if hashlib.sha256(package.read_bytes()).hexdigest() != expected:
                raise ValueError("it does not match the checksum in the start-up record (corrupt or replaced)")
            program = torch._inductor.aoti_load_package(str(package))
        except Exception as exc:  # noqa: BLE001  a package we cannot use is compiled again, never fatal
            log(f"O2 package {package.name} not used: {type(exc).__name__}: {exc}")
            return None
        self.num_loaded += 1
        return program

    def _compile(self, signature: str, name: str, kind: str, module: nn.Module, args: tuple,
                 leaves: list) -> list:
        started = time.perf_counter()
        dynamic = {name: DYNAMIC_DIMS[kind].get(name, ()) + BATCH_DIMS.get(kind, {}).get(name, ())
                   for name in _leaf_names(args)}
        dims = [{d: Dim.AUTO for d in dynamic[leaf_name] if leaf.shape[d] >= 2}
                for leaf_name, leaf in zip(_leaf_names(args), leaves)]
        dynamic_shapes = pytree.tree_unflatten(dims, pytree.tree_flatten(args)[1])
        # The step runs under inference_mode; export traces outside it, without autograd, on copies of its inference
        # tensors (whether export takes them as they are was not tried; the copies cost one step's inputs, once).
        with torch.inference_mode(False), torch.no_grad():
            program = torch.export.export(module, _clone_inference(args), dynamic_shapes=dynamic_shapes,
                                          strict=False)
            pattern = _pattern(program)
            private_dir(self.folder)
            stem = f"{signature}-{hashlib.sha256(json.dumps(pattern).encode()).hexdigest()[:12]}"
            fd, tmp = tempfile.mkstemp(prefix=stem, suffix=".pt2", dir=self.folder)
            os.close(fd)
            try:
                torch._inductor.aoti_compile_and_package(program, package_path=tmp,
                                                         inductor_configs=INDUCTOR_CONFIGS)
                meta = {"entry": name, "kind": kind, "pattern": pattern}
                digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
                # Package first, metadata last: a reader finds the old pair, or a checksum miss it compiles again.
                os.replace(tmp, self.folder / f"{stem}.pt2")
            finally:
                Path(tmp).unlink(missing_ok=True)
        write_atomic(self.folder / f"{stem}.json", json.dumps(meta, indent=1).encode())
        # Re-read first: another start of the same recipe may have recorded packages of its own meanwhile.
        self._digests = {**_read_digests(digests_path(self.folder)), **self._digests, f"{stem}.pt2": digest}
        write_atomic(digests_path(self.folder), json.dumps(self._digests, indent=1, sort_keys=True).encode())
        loaded = torch._inductor.aoti_load_package(str(self.folder / f"{stem}.pt2"))
        seconds = time.perf_counter() - started
        self.num_compiled += 1
        self.compile_seconds += seconds
        log(f"O2 graph {name} ({kind}) compiled into {self.folder / stem}.pt2 in {seconds:.1f} s")
        if self.after_compile is not None:
            self.after_compile()
        return [pattern, loaded, stem]


def digests_path(folder: Path) -> Path:
    """The record of the packages' digests: beside their folder, in the start-up folder keyed by the recipe."""
    return folder.parent / f"{folder.name}.digests.json"


def _read_digests(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _signature(name: str, kind: str, args: tuple, leaves: list) -> str:
    """What must match for a package to be looked at: the entry, the input structure, each input's dtype and rank."""
    described = [name, kind, str(pytree.tree_flatten(args)[1])] + [f"{leaf.dtype}:{leaf.dim()}" for leaf in leaves]
    return f"{name}-" + hashlib.sha256("|".join(described).encode()).hexdigest()[:16]


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)


def _leaves(args: tuple) -> list[torch.Tensor]:
    """The tensors of an entry's arguments (tensors, a dict of them, lists of them) in pytree's order."""
    leaves: list[torch.Tensor] = []
    for arg in args:
        leaves.extend([arg] if _is_tensor(arg) else arg.values() if isinstance(arg, dict) else arg)
    return leaves


def _pattern(program) -> list[list[int | None]]:
    """Each user input's shape as the package takes it: a static size, or None where it is dynamic."""
    user_inputs = set(program.graph_signature.user_inputs)
    shapes = [[d if isinstance(d, int) else None for d in node.meta["val"].shape]
              for node in program.graph.nodes if node.op == "placeholder" and node.name in user_inputs]
    return shapes


def _fits(pattern: list, leaves: list) -> bool:
    # A dynamic dimension was exported for sizes of 2 and more (dynamo, too, specialises 0 and 1).
    return len(pattern) == len(leaves) and all(
        len(dims) == leaf.dim() and all(d == s if d is not None else s >= 2 for d, s in zip(dims, leaf.shape))
        for dims, leaf in zip(pattern, leaves))


def _clone_inference(args: tuple) -> tuple:
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and t.is_inference() else t, args)


def package_graphs(model: EngineModel, folder: Path) -> PackagedGraphs:
    """Route every segment entry and the head of `model` through packages in `folder` (O2 on the CPU)."""
    graphs = PackagedGraphs(folder)
    for index, segment in enumerate(model.segments):
        prefill, decode = _SegmentStep(segment, True), _SegmentStep(segment, False)

        def run_prefill(x, step, k_pools, v_pools, _module=prefill, _index=index):
            kind = "prefill" if step.block_table is None else "chunk"
            return graphs.run(f"segment{_index}", kind, _module, (x, _fields(step), list(k_pools), list(v_pools)))

        def run_decode(x, step, k_pools, v_pools, _module=decode, _index=index):
            return graphs.run(f"segment{_index}", "decode", _module, (x, _fields(step), list(k_pools),
                                                                      list(v_pools)))

        segment.prefill, segment.decode = run_prefill, run_decode
    head = _Head(model.logits)
    model.logits = lambda x: graphs.run("head", "head", head, (x,))
    return graphs


def _fields(step: StepInputs) -> dict[str, torch.Tensor]:
    return {name: value for name in StepInputs.__slots__ if name != "prefill"
            and (value := getattr(step, name)) is not None}
