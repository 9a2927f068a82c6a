"""Search spaces as data: dimensions with values, conditions, and whether they change numerics."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from autotune.config.deploy import (
    DTYPES,
    NUMERICS_KNOBS,
    QUANT_METHODS,
    DeployConfig,
)
from autotune.config.runtimes import DEFAULT_RUNTIME, RUNTIMES, SHARED_KNOBS, other_knobs, runtime_of
from autotune.errors import SpaceError

__all__ = ["Dimension", "SearchSpace", "SpeedBaseline", "load_space", "DEFAULT_SPACE", "default_space", "combine",
           "RUNTIME_DIMENSION"]

_SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
DEFAULT_SPACE = _SPACES / "default.yaml"
_KNOWN = (*SHARED_KNOBS, *(k for r in RUNTIMES.values() for k in r.knobs))


def default_space(runtime: str = DEFAULT_RUNTIME) -> Path:
    """The space file a search of `runtime` uses unless given one: search_spaces/default.yaml for the engine,
    search_spaces/RUNTIME.yaml for the others."""
    return _SPACES / runtime_of(runtime).space_file


@dataclass(frozen=True, slots=True)
class Dimension:
    """One knob: its values, when it applies (`when`: other dimension -> allowed values), and whether it
    changes what the model computes. A knob whose meaningful values depend on another's (`by`: quant_method by
    quant) holds them per value of that one in `choices`, and `values` is their union; it applies only where it
    has choices."""

    name: str
    values: tuple[Any, ...]
    numerics: bool = False
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    by: str | None = None
    choices: dict[Any, tuple[Any, ...]] = field(default_factory=dict)

    def values_for(self, params: dict[str, Any]) -> tuple[Any, ...]:
        return self.choices.get(params.get(self.by), ()) if self.by else self.values

    def applies(self, params: dict[str, Any]) -> bool:
        return all(params.get(dim) in allowed for dim, allowed in self.when.items()) and bool(self.values_for(params))

    def trial_name(self, params: dict[str, Any]) -> str:
        """The Optuna parameter's name. Optuna keeps one set of choices per name, so a knob with `by` has one
        name per value of that dimension: "quant_method[w8a8]"."""
        return f"{self.name}[{params[self.by]}]" if self.by else self.name


@dataclass(frozen=True, slots=True)
class SpeedBaseline:
    """A speed baseline every gain is read against: transformers' generate (eager, dynamic cache) on the study's
    workload. `dtype`: "auto" (as a user loads the model: its own dtype), "fastest" (the device's fastest plain
    precision, by its capability probe) or a precision."""

    name: str
    dtype: str
    batch_size: int


# The baselines of a space file that names none.
_DEFAULT_BASELINES = (SpeedBaseline("as_loaded", "auto", 8), SpeedBaseline("fastest", "fastest", 8))


@dataclass(frozen=True, slots=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]
    baseline: dict[str, Any]
    source: str = "<memory>"
    dropped: dict[str, str] = field(default_factory=dict)  # what a backend removed, and why
    speed_baselines: tuple[SpeedBaseline, ...] = _DEFAULT_BASELINES
    # Values the device runs only through a slow kernel ("w8a16@fp32" -> why): kept, but the guide tries them last.
    ordered_last: dict[str, str] = field(default_factory=dict)
    # What runs every configuration of this space (config/runtimes.py), as its file names it (`runtime:`): only a
    # backend of that runtime searches it. A space over several runtimes (`combine`) has each runtime's space in
    # `parts` and the runtime as its first dimension; its `runtime` is the first part's.
    runtime: str = DEFAULT_RUNTIME
    parts: tuple[SearchSpace, ...] = ()

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(p.runtime for p in self.parts) or (self.runtime,)

    def dimension(self, name: str) -> Dimension:
        return next(d for d in self.dimensions if d.name == name)

    def suggest(self, trial) -> dict[str, Any]:
        """Ask an Optuna trial for one value of each applicable dimension, in file order."""
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.applies(params):
                params[dim.name] = trial.suggest_categorical(dim.trial_name(params), list(dim.values_for(params)))
        return params

    def trial_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters by dimension name (as `suggest` returns them) -> by Optuna parameter name, for
        `enqueue_trial` and for comparing with `trial.params`."""
        out: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.name in params:
                out[dim.trial_name(params)] = params[dim.name]
        return out

    def from_trial_params(self, named: dict[str, Any]) -> dict[str, Any]:
        """The inverse of trial_params: Optuna's parameter names (an enqueued trial's fixed_params) -> by dimension."""
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.applies(params) and dim.trial_name(params) in named:
                params[dim.name] = named[dim.trial_name(params)]
        return params

    def baselines(self) -> list[dict[str, Any]]:
        """Each runtime's plain deployment (its file's `baseline`), by dimension name: one per runtime, the first
        trials of the study."""
        if not self.parts:
            return [self.baseline_params()]
        return [{RUNTIME_DIMENSION: part.runtime, **part.baseline_params()} for part in self.parts]

    def baseline_params(self) -> dict[str, Any]:
        if self.parts:
            return self.baselines()[0]
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            if not dim.applies(params):
                continue
            values = dim.values_for(params)
            value = self.baseline.get(dim.name, values[0])
            # "max": the largest level kept (all cores); "fastest": the first, as a backend orders a dimension
            # fastest first (dtype, by the capability probe).
            params[dim.name] = max(values) if value == "max" else values[0] if value == "fastest" else value
        return params

    def to_config(self, params: dict[str, Any]) -> DeployConfig:
        """A trial's configuration: its parameters, of the runtime they name (a space over several runtimes) or of
        this space's."""
        return DeployConfig.from_params({"runtime": self.runtime, **params})

    def restrict(self, name: str, keep: tuple[Any, ...], reason: str) -> SearchSpace:
        """A copy with `name` limited to `keep`; with nothing kept the dimension is dropped. The reason is recorded."""
        dims = []
        for dim in self.dimensions:
            if dim.name != name:
                dims.append(dim)
            elif keep:
                choices = {k: tuple(v for v in vs if v in keep) for k, vs in dim.choices.items()}
                dims.append(replace(dim, values=tuple(v for v in dim.values if v in keep),
                                    choices={k: vs for k, vs in choices.items() if vs}))
        removed = [v for v in self.dimension(name).values if v not in keep]
        note = f"values {removed} removed: {reason}" if keep else f"dropped: {reason}"
        return replace(self, dimensions=tuple(dims), dropped={**self.dropped, name: note})

    def reorder(self, name: str, order: tuple[Any, ...]) -> SearchSpace:
        """A copy with `name`'s values in `order` (values not in it keep their place after it)."""
        dim = self.dimension(name)
        values = tuple(v for v in order if v in dim.values) + tuple(v for v in dim.values if v not in order)
        return replace(self, dimensions=tuple(replace(d, values=values) if d.name == name else d
                                              for d in self.dimensions))

    def note_ordered_last(self, slow: dict[str, str]) -> SearchSpace:
        return replace(self, ordered_last={**self.ordered_last, **slow})

    def grid(self) -> list[dict[str, Any]]:
        """Every configuration's parameters, conditional dimensions only where they apply (as grid_size counts)."""
        out: list[dict[str, Any]] = [{}]
        for dim in self.dimensions:
            out = [{**p, dim.name: v} for p in out for v in (dim.values_for(p) if dim.applies(p) else (None,))]
        return [{k: v for k, v in p.items() if v is not None} for p in out]

    def grid_size(self) -> int:
        """Number of distinct configurations (conditional dimensions counted only where they apply)."""
        def count(i: int, params: dict[str, Any]) -> int:
            if i == len(self.dimensions):
                return 1
            dim = self.dimensions[i]
            if not dim.applies(params):
                return count(i + 1, params)
            return sum(count(i + 1, {**params, dim.name: v}) for v in dim.values_for(params))
        return count(0, {})


# The dimension of a space over several runtimes that picks the runtime; every other knob is conditional on it.
RUNTIME_DIMENSION = "runtime"


def combine(spaces: list[SearchSpace]) -> SearchSpace:
    """One space over the runtimes of `spaces` (each already adapted by its backend), for a study whose front
    compares engines: `runtime` first, then the shared knobs (batch, device power) with their values per runtime
    (`by: runtime`, so that each runtime's are an Optuna parameter of their own), then each runtime's own knobs,
    conditional on it. The speed baselines are the first space's."""
    if len(spaces) == 1:
        return spaces[0]
    names = [s.runtime for s in spaces]
    if len(set(names)) != len(names):
        raise SpaceError(f"two spaces of one runtime: {names}")
    dims: list[Dimension] = [Dimension(RUNTIME_DIMENSION, tuple(names), numerics=True)]
    for shared in SHARED_KNOBS:
        choices = {s.runtime: s.dimension(shared).values for s in spaces if shared in {d.name for d in s.dimensions}}
        if choices:
            dims.append(Dimension(shared, tuple(dict.fromkeys(v for vs in choices.values() for v in vs)),
                                  by=RUNTIME_DIMENSION, choices=choices))
    for s in spaces:
        dims += [replace(d, when={RUNTIME_DIMENSION: (s.runtime,), **d.when}) for d in s.dimensions
                 if d.name not in SHARED_KNOBS]
    dropped = {(name if s is spaces[0] else f"{name}[{s.runtime}]"): note for s in spaces
               for name, note in s.dropped.items()}
    return SearchSpace(tuple(dims), {}, source=" + ".join(s.source for s in spaces), dropped=dropped,
                       speed_baselines=spaces[0].speed_baselines,
                       ordered_last={k: v for s in spaces for k, v in s.ordered_last.items()},
                       runtime=spaces[0].runtime, parts=tuple(spaces))


def _fail(path: str, node: yaml.Node | None, message: str) -> SpaceError:
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    return SpaceError(f"{path}{line}: {message}")


def _mapping(path: str, node: yaml.Node, what: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(path, node, f"{what} must be a mapping")
    out: dict[str, yaml.Node] = {}
    for key, value in node.value:
        if key.value in out:
            raise _fail(path, key, f"{what}: {key.value!r} appears twice")
        out[key.value] = value
    return out


def _key(node: yaml.Node, name: str) -> yaml.Node:
    """The key node of `name` in a mapping node: errors about a name point at its own line."""
    return next(k for k, _ in node.value if k.value == name)


def _scalars(path: str, node: yaml.Node, what: str) -> tuple[Any, ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise _fail(path, node, f"{what} must be a non-empty list")
    values = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode):
            raise _fail(path, item, f"{what} must hold plain values")
        values.append(yaml.safe_load(yaml.serialize(item)))
    if len(set(map(str, values))) != len(values):
        raise _fail(path, node, f"{what} repeats a value")
    return tuple(values)


def _positive_int(v: Any) -> bool:
    return type(v) is int and v >= 1


def _by_values(path: str, name: str, node: yaml.Node, by: Dimension) -> dict[Any, tuple[Any, ...]]:
    """`values` of a knob with `by`: a mapping from values of that dimension to lists of this knob's values."""
    choices: dict[Any, tuple[Any, ...]] = {}
    for key, sub in _mapping(path, node, f"{name}.values (by {by.name})").items():
        parent = yaml.safe_load(key)
        if parent not in by.values:
            raise _fail(path, sub, f"{name}.values: {parent!r} is not a value of {by.name}")
        choices[parent] = _scalars(path, sub, f"{name}.values.{parent}")
        for v in choices[parent]:
            if not _VALID_BY[name](parent, v):
                raise _fail(path, sub, f"{name}: {v!r} is not a valid value for {by.name}={parent}")
    return choices


# Every knob's valid values: each runtime's fixed sets (its knob class's CHOICES), and the numbers.
_VALID = {
    **{name: (lambda v, allowed=allowed: v in allowed) for r in RUNTIMES.values()
       for name, allowed in r.knob_class.CHOICES.items()},
    "layers_per_subgraph": lambda v: v == "all" or _positive_int(v),
    "batch_size": _positive_int,
    "page_size": _positive_int,
    "device_power": _positive_int,
    "fallback_layers": lambda v: type(v) is int and v >= 0,  # the default space's are FALLBACK_LAYERS
    "prefill_chunk": lambda v: type(v) is int and v >= 0,  # 0: whole prompts
    "quant_method": lambda v: any(v in methods for methods in QUANT_METHODS.values()),
    "n_batch": _positive_int,
    "n_ubatch": _positive_int,
    "n_ctx": lambda v: type(v) is int and v >= 0,
    "group_size": lambda v: v == -1 or _positive_int(v),
    "ratio": lambda v: type(v) in (int, float) and 0 < v <= 1,
    "max_num_batched_tokens": _positive_int,
    "cache_size": lambda v: type(v) is int and v >= 0,
    "dynamic_split_fuse": lambda v: type(v) is bool,
    "prefix_caching": lambda v: type(v) is bool,
}
# Knobs that may be given per value of another (`by`), and which values are meaningful for which.
_VALID_BY = {"quant_method": lambda scheme, v: v in QUANT_METHODS.get(scheme, ()),
             # OpenVINO's paged attention refuses an f32 KV cache under bf16 inference.
             "kv_precision": lambda precision, v: v != "f32" or precision == "f32"}


def load_space(path: str | Path = DEFAULT_SPACE) -> SearchSpace:
    """Read and validate a space file; errors name the file, the line and what is wrong."""
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpaceError(f"{path}: cannot read the space file ({exc.strerror})") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise SpaceError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if root is None:
        raise SpaceError(f"{path}: the file is empty")
    top = _mapping(path, root, "the space file")
    for key, node in top.items():
        if key not in ("version", "runtime", "dimensions", "baseline", "speed_baselines"):
            raise _fail(path, _key(root, key), f"unknown section {key!r} (expected version, runtime, dimensions, "
                        "baseline, speed_baselines)")
    runtime = yaml.safe_load(yaml.serialize(top["runtime"])) if "runtime" in top else DEFAULT_RUNTIME
    if runtime not in RUNTIMES:
        raise _fail(path, top["runtime"], f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    foreign = set(other_knobs(runtime))
    if "dimensions" not in top:
        raise _fail(path, root, "missing section 'dimensions'")
    dims: list[Dimension] = []
    for name, node in _mapping(path, top["dimensions"], "dimensions").items():
        if name not in _KNOWN:
            raise _fail(path, _key(top["dimensions"], name), f"unknown dimension {name!r}; known: {', '.join(_KNOWN)}")
        if name in foreign:
            owner = next(r.name for r in RUNTIMES.values() if name in r.knobs)
            raise _fail(path, _key(top["dimensions"], name), f"{name} is a knob of the {owner} runtime, and this "
                        f"space's runtime is {runtime} (`runtime:` at the top, default {DEFAULT_RUNTIME}); "
                        f"{owner}'s knobs go in a space of its own ({default_space(owner).name})")
        spec = _mapping(path, node, f"dimension {name}")
        for key, sub in spec.items():
            if key not in ("values", "numerics", "when", "by"):
                raise _fail(path, _key(node, key), f"dimension {name}: unknown key {key!r} (values, numerics, when, by)")
        if "values" not in spec:
            raise _fail(path, node, f"dimension {name}: missing 'values'")
        by, choices = None, {}
        if "by" in spec:
            by = yaml.safe_load(yaml.serialize(spec["by"]))
            if name not in _VALID_BY or by not in {d.name for d in dims}:
                raise _fail(path, spec["by"], f"{name}.by: {by!r} must be a dimension defined above it, and only "
                            f"{', '.join(_VALID_BY)} can be given by another")
            choices = _by_values(path, name, spec["values"], next(d for d in dims if d.name == by))
            values = tuple(dict.fromkeys(v for vs in choices.values() for v in vs))
        else:
            values = _scalars(path, spec["values"], f"{name}.values")
        for v in values:
            if name == "quant" and v == "bf16":
                raise _fail(path, spec["values"], "quant: 'bf16' is now 'none', with the precision in a dimension "
                            "of its own: `dtype: {values: [bf16]}`")
            if not _VALID[name](v):
                # YAML reads a bare on/off as a boolean.
                hint = " (quote it: \"on\", \"off\")" if isinstance(v, bool) else ""
                raise _fail(path, spec["values"], f"{name}: {v!r} is not a valid value{hint}")
        numerics = name in NUMERICS_KNOBS
        if "numerics" in spec and yaml.safe_load(yaml.serialize(spec["numerics"])) != numerics:
            raise _fail(path, spec["numerics"], f"{name}: numerics is {numerics} for this knob, by what it does")
        when: dict[str, tuple[Any, ...]] = {}
        if "when" in spec:
            for other, allowed in _mapping(path, spec["when"], f"{name}.when").items():
                if other not in {d.name for d in dims}:
                    raise _fail(path, allowed, f"{name}.when refers to {other!r}, which must be defined above it")
                when[other] = _scalars(path, allowed, f"{name}.when.{other}")
        dims.append(Dimension(name, values, numerics, when, by, choices))
    names = {d.name for d in dims}
    if "layers_per_subgraph" in names and "fusion_level" in names and not dims[
            [d.name for d in dims].index("layers_per_subgraph")].when:
        raise _fail(path, top["dimensions"], "layers_per_subgraph needs `when: {fusion_level: [O1, O2]}`")
    _check_llamacpp_pairs(path, top["dimensions"], {d.name: d for d in dims})
    baseline: dict[str, Any] = {}
    if "baseline" in top:
        for name, node in _mapping(path, top["baseline"], "baseline").items():
            if name not in names:
                raise _fail(path, node, f"baseline sets {name!r}, which is not a dimension of this space")
            value = yaml.safe_load(yaml.serialize(node))
            if value not in ("max", "fastest") and value not in dict((d.name, d.values) for d in dims)[name]:
                raise _fail(path, node, f"baseline {name}={value!r} is not among that dimension's values")
            baseline[name] = value
    speed = _speed_baselines(path, top["speed_baselines"]) if "speed_baselines" in top else _DEFAULT_BASELINES
    return SearchSpace(tuple(dims), baseline, source=path, speed_baselines=speed, runtime=runtime)


def _check_llamacpp_pairs(path: str, node: yaml.Node, dims: dict[str, Dimension]) -> None:
    """llama.cpp's pairs that would make configurations it refuses: an n_ubatch above an n_batch, a quantized KV
    cache without flash attention. Said at load, not as failed trials."""
    if "n_batch" in dims and "n_ubatch" in dims and max(dims["n_ubatch"].values) > min(dims["n_batch"].values):
        raise _fail(path, _key(node, "n_ubatch"), f"n_ubatch {max(dims['n_ubatch'].values)} is above n_batch "
                    f"{min(dims['n_batch'].values)}: llama.cpp needs n_ubatch <= n_batch in every configuration")
    kv = dims.get("kv_type")
    if kv is not None and any(v != "f16" for v in kv.values) and "off" in kv.when.get(
            "flash_attn", dims["flash_attn"].values if "flash_attn" in dims else ()):
        raise _fail(path, _key(node, "kv_type"), "kv_type: a quantized KV cache needs flash attention: give it "
                    "`when: {flash_attn: [\"on\"]}`")


def _speed_baselines(path: str, node: yaml.Node) -> tuple[SpeedBaseline, ...]:
    out = []
    for name, spec_node in _mapping(path, node, "speed_baselines").items():
        spec = _mapping(path, spec_node, f"speed_baselines.{name}")
        unknown = set(spec) - {"dtype", "batch_size"}
        if unknown:
            raise _fail(path, spec_node, f"speed_baselines.{name}: unknown keys {sorted(unknown)} (dtype, batch_size)")
        dtype = yaml.safe_load(yaml.serialize(spec["dtype"])) if "dtype" in spec else "auto"
        batch = yaml.safe_load(yaml.serialize(spec["batch_size"])) if "batch_size" in spec else 8
        if dtype not in ("auto", "fastest", *DTYPES):
            raise _fail(path, spec.get("dtype", spec_node), f"speed_baselines.{name}.dtype must be auto, fastest or "
                        f"one of {', '.join(DTYPES)}, not {dtype!r}")
        if not _positive_int(batch):
            raise _fail(path, spec.get("batch_size", spec_node), f"speed_baselines.{name}.batch_size must be a "
                        f"positive integer, not {batch!r}")
        out.append(SpeedBaseline(name, dtype, batch))
    if not out:
        raise _fail(path, node, "speed_baselines needs at least one baseline")
    return tuple(out)
