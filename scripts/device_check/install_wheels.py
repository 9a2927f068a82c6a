"""Make the device check's Python packages importable on a machine that reaches no package index.

Usage: python install_wheels.py TARGET. Packages this interpreter already has in a suitable version are used as
they are; each missing one is unpacked from the wheels carried next to this file (wheels/) into TARGET, which the
caller puts first on PYTHONPATH (a wheel is a zip of its site-packages files: unpacking it is installing it, with
no pip, no venv and no network needed). The machine must bring torch (its CUDA build), transformers 5 and their
own dependencies; those are checked, never replaced. Standard library and `packaging` (a transformers
dependency) only."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import zipfile
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags, sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

WHEELS = Path(__file__).resolve().with_name("wheels")

# What the check runs that a bare CUDA machine lacks: (import name, distribution, version needed, Python below
# which it is needed at all). The CLI imports optuna-dashboard (autotune/results/annotate.py); recipes are
# validated with jsonschema when the study writes them; pytest runs the mapping and conformance tests.
CARRIED = [
    ("optuna", "optuna", ">=5.1", None),
    ("alembic", "alembic", ">=1.5", None),
    ("mako", "mako", "", None),
    ("sqlalchemy", "sqlalchemy", ">=2.0", None),
    ("colorlog", "colorlog", "", None),
    ("optuna_dashboard", "optuna-dashboard", "", None),
    ("bottle", "bottle", "", None),
    ("torchao", "torchao", "==0.18.0", None),
    ("jsonschema", "jsonschema", ">=4.18", None),
    ("jsonschema_specifications", "jsonschema-specifications", "", None),
    ("referencing", "referencing", "", None),
    ("attrs", "attrs", "", None),
    ("rpds", "rpds-py", "", None),
    ("pytest", "pytest", ">=8", None),
    ("pluggy", "pluggy", "", None),
    ("iniconfig", "iniconfig", "", None),
    ("pygments", "pygments", "", None),
    ("tomli", "tomli", "", (3, 11)),
    ("exceptiongroup", "exceptiongroup", "", (3, 11)),
]
# What the machine must bring (its own builds): checked only. transformers 5: the engine reads `rope_parameters`.
MACHINE = [
    ("torch", "torch", ""),
    ("transformers", "transformers", ">=5"),
    ("tokenizers", "tokenizers", ""),
    ("safetensors", "safetensors", ""),
    ("numpy", "numpy", ""),
    ("yaml", "pyyaml", ""),
    ("tqdm", "tqdm", ""),
    ("typing_extensions", "typing-extensions", ""),
    ("markupsafe", "markupsafe", ""),
]


def installed(module: str, dist: str, spec: str) -> str | None:
    """The installed version of `dist` when `module` imports from it and satisfies `spec`; None otherwise."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    return version if SpecifierSet(spec).contains(version, prereleases=True) else None


def _requires_python(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    match = re.search(r"^Requires-Python: *(.+)$", text, re.MULTILINE)
    return match[1].strip() if match else ""


def pick_wheel(dist: str, spec: str, python: tuple[int, int] | None = None) -> Path | None:
    """The newest carried wheel of `dist` that this interpreter and platform can use (or CPython `python` on this
    platform), within `spec`."""
    if python is None:
        here, version_text = set(sys_tags()), ".".join(map(str, sys.version_info[:3]))
    else:
        here = set(cpython_tags(python)) | set(compatible_tags(python))
        version_text = f"{python[0]}.{python[1]}.0"
    best = None
    for wheel in WHEELS.glob("*.whl"):
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if name != canonicalize_name(dist) or not tags & here or not SpecifierSet(spec).contains(version, True):
            continue
        if not SpecifierSet(_requires_python(wheel)).contains(version_text, prereleases=True):
            continue
        if best is None or version > best[0]:
            best = (version, wheel)
    return best[1] if best else None


def unpack(wheel: Path, target: Path) -> None:
    """A wheel's files into `target` as pip lays them out: `*.data/purelib|platlib` at the top, other .data (scripts,
    headers) left out, and so is a top-level test package (torchao's wheel ships one, which would shadow the
    standard library's `test` from the front of PYTHONPATH)."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.infolist():
            parts = member.filename.split("/")
            if parts[0] in ("test", "tests"):
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                dest = target.joinpath(*parts[2:])
            else:
                dest = target / member.filename
            if member.is_dir():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(member))


def main(target: Path) -> int:
    problems = []
    for module, dist, spec in MACHINE:
        version = installed(module, dist, spec)
        print(f"  {dist:<26} {version or 'MISSING or too old (needs ' + (spec or 'any') + ')'}  (machine)")
        if version is None:
            problems.append(f"{dist}{spec}")
    for module, dist, spec, below in CARRIED:
        if below is not None and sys.version_info[:2] >= below:
            continue
        version = installed(module, dist, spec)
        if version is not None:
            print(f"  {dist:<26} {version}  (machine)")
            continue
        wheel = pick_wheel(dist, spec)
        if wheel is None:
            problems.append(f"{dist}{spec} (no carried wheel fits Python {sys.version.split()[0]} here)")
            continue
        unpack(wheel, target)
        print(f"  {dist:<26} {parse_wheel_filename(wheel.name)[1]}  (carried: {wheel.name})")
    if problems:
        print(f"device_check: cannot run without {', '.join(problems)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
