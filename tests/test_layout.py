"""The package's imports point one way: down the pipeline. A cycle, an upward import, an import of autotune inside
a function (the usual way a cycle is hidden) or a private name used across modules fails here, naming the module
and line. Each check is also run on a small planted tree, to show it catches what it is for."""
from __future__ import annotations

import ast
from pathlib import Path

import autotune

ROOT = Path(autotune.__file__).resolve().parent

# Lower layers first; a module may import its own package and the layers below, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "progress", "paths", "redact", "microarch", "code_hash", "noise"),
    ("host", "contention"),
    ("config",),
    ("models", "space"),
    ("engine",),
    ("probe",),
    ("gate", "benchmark"),
    ("sim",),
    ("quant",),
    ("devices",),
    ("trial",),
    ("llamacpp", "openvino"),
    ("backends",),
    ("recipes",),
    ("study",),
    ("results", "serve"),
    ("api",),
    ("cli",),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
# A function-level import of autotune is allowed only in modules listed here, each with its reason.
LAZY_OK: dict[str, str] = {
    # Their quantizers import torch and torchao kernels; loaded when a trial builds on the device, so that choosing
    # a backend (the CLI, and the simulator's child process, whose start counts in its trial time) stays light.
    "autotune.devices.cuda": "quantizers load with the build, not with the backend",
    "autotune.devices.npu": "quantizers load with the build, not with the backend",
    "autotune.devices.base": "the engine's build loads with the build, not with the backend",
    # The probe's module is read by the CPU backend, which must load without torch; the quantizers it times load
    # only when it measures (once per machine).
    "autotune.probe.cpu": "quantizers load when the probe measures, not with the backend",
    # `import autotune` (every trial's child process imports it) stays cheap: the Python API, which loads Optuna
    # and the study, loads on first use of `autotune.search`.
    "autotune": "the Python API loads on first use",
}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(root, p): p for p in root.rglob("*.py")}


def _imports(root: Path, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module of this package, line, at module level) for each import in `path`. `from a import b`
    counts as importing a.b where b is a module."""
    pkg = root.name
    modules = _modules(root)
    tree = ast.parse(path.read_text())
    module = _module_name(root, path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` and try/except blocks at module level are module level
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out += [(n, node.lineno, id(node) in top) for n in names if n == pkg or n.startswith(pkg + ".")]
    return out


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def unlayered(root: Path, rank: dict[str, int]) -> list[str]:
    return sorted({_package_of(m) for m in _modules(root)} - {""} - set(rank))


def upward_imports(root: Path, rank: dict[str, int]) -> list[str]:
    wrong = []
    for module, path in _modules(root).items():
        here = _package_of(module)
        for target, line, _ in _imports(root, path):
            there = _package_of(target)
            if here and there and there != here and rank[there] >= rank[here]:
                wrong.append(f"{module}:{line} imports {target} ({here} is layer {rank[here]}, {there} {rank[there]})")
    return wrong


def cycles(root: Path) -> list[str]:
    modules = _modules(root)
    graph = {m: {t for t, _, top in _imports(root, p) if top and t in modules and t != m} for m, p in modules.items()}
    state: dict[str, int] = {}
    found = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def hidden_imports(root: Path, allowed: dict[str, str]) -> list[str]:
    return [f"{module}:{line} imports {target} inside a function"
            for module, path in _modules(root).items() if module not in allowed
            for target, line, top in _imports(root, path) if not top]


def private_leaks(root: Path) -> list[str]:
    leaks = []
    for module, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(root.name):
                leaks += [f"{module}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return leaks


def test_every_package_has_a_layer():
    assert not unlayered(ROOT, RANK), f"packages without a layer in LAYERS: {unlayered(ROOT, RANK)}"


def test_imports_point_down():
    wrong = upward_imports(ROOT, RANK)
    assert not wrong, "upward or sideways imports:\n" + "\n".join(wrong)


def test_no_import_cycles():
    found = cycles(ROOT)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_function_level_imports_of_autotune():
    hidden = hidden_imports(ROOT, LAZY_OK)
    assert not hidden, "imports of autotune inside functions (move them to the top):\n" + "\n".join(hidden)


def test_no_private_names_across_modules():
    leaks = private_leaks(ROOT)
    assert not leaks, "private names used from other modules:\n" + "\n".join(leaks)


def test_each_check_catches_a_planted_violation(tmp_path):
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "import pkg.low.b\n",  # a -> b -> a: a cycle
        "low/b.py": "from pkg.low import a\nfrom pkg.high.c import thing\n",  # and an upward import
        "high/__init__.py": "",
        "high/c.py": "def f():\n    from pkg.low.a import _private\n",  # hidden in a function, and private
        "stray/__init__.py": "",  # a package with no layer
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    rank = {"low": 0, "high": 1}
    assert unlayered(root, rank) == ["stray"]
    assert [w.split(" ")[0] for w in upward_imports(root, rank)] == ["pkg.low.b:2"]
    assert any("pkg.low.a" in c and "pkg.low.b" in c for c in cycles(root))
    assert hidden_imports(root, {}) == ["pkg.high.c:2 imports pkg.low.a inside a function"]
    assert private_leaks(root) == ["pkg.high.c:2 imports pkg.low.a._private"]
