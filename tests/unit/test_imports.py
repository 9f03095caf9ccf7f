"""Import rules: pure algorithm code imports no Ray/vLLM/DeepSpeed/torch.distributed, imports
follow the data (rollout -> reward -> learner/diagnostics; only launch wires them together;
comm, shared by all, imports none of them), and
the project's modules import each other without cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [  # docs/ARCHITECTURE.md section 3: torch and the standard library only
    "learner/advantage.py",
    "learner/virtual_samples.py",
    "learner/loss.py",
    "learner/trigger.py",
    "learner/config.py",
    "learner/advantage_stage.py",
    "learner/logprobs.py",
    "learner/tempered_logits.py",
    "learner/shared_prefix.py",
    "learner/batch.py",
    "learner/update.py",
    "learner/dcpo.py",
    "learner/estimators.py",
    "diagnostics/acr.py",
    "comm/collapse.py",
    "comm/groups.py",
    "rollout/seeding.py",
    "rollout/types.py",
    "reward/extract.py",
    "reward/cells.py",
    "reward/intrinsic.py",
]
HEAVY = ("ray", "vllm", "deepspeed", "torch.distributed", "transformers")
PACKAGES = ("comm", "rollout", "reward", "learner", "diagnostics", "launch")
# package -> project packages it must not import
FORBIDDEN = {
    "comm": {"rollout", "reward", "learner", "diagnostics", "launch"},
    "rollout": {"reward", "learner", "diagnostics", "launch"},
    "reward": {"learner", "diagnostics", "launch"},
    "learner": {"launch"},
    "diagnostics": {"learner", "launch"},
    "launch": set(),
}


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("rel", PURE)
def test_pure_modules_import_nothing_heavy(rel):
    mods = imported_modules(ROOT / rel)
    bad = {m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY)}
    assert not bad, f"{rel} imports {bad}"


def test_pure_modules_load_without_heavy_packages():
    mods = ", ".join(p.removesuffix(".py").replace("/", ".") for p in PURE)
    heavy = {"ray", "vllm", "deepspeed", "transformers"}
    found = "{m.split('.')[0] for m in sys.modules}"
    code = f"import sys; import {mods}; print(sorted({found} & {heavy!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_data(package):
    for path in (ROOT / package).rglob("*.py"):
        tops = {m.split(".")[0] for m in imported_modules(path)}
        bad = tops & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


# --- import cycles ---------------------------------------------------------------------------

# Strongly connected components of the module import graph that are known and tolerated, each
# as the sorted tuple of its modules. Nothing else may import in a circle.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()  # none: a new cycle must be argued for here


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports anywhere in its file (in functions and under
    TYPE_CHECKING too); ``from pkg import x`` is ``pkg.x`` when that is a module, else ``pkg``."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package holding this module
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one node (each sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def find_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One import cycle through the component's first module, for the failure message."""
    start, members = comp[0], set(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return comp


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: import_edges(name, path, modules) for name, path in modules.items()}


def test_cycle_finder_on_a_small_graph():
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"d"},
        "f": {"g"},
        "g": {"f"},
    }
    assert strongly_connected(graph) == [["a", "b", "c"], ["f", "g"]]
    assert find_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_import_edges_resolve_names_to_modules():
    graph = import_graph()
    assert "reward.verifiers" in graph["reward"]  # from reward.verifiers import Verdict
    assert "reward.pool" in graph["reward"]  # inside verify(): from reward.pool import ...
    assert "diagnostics.report" in graph["launch.analyze"]


def test_no_import_cycles_among_project_modules():
    graph = import_graph()
    found = {tuple(c): find_cycle(graph, c) for c in strongly_connected(graph)}
    new = {c: " -> ".join(cycle) for c, cycle in found.items() if c not in ALLOWED_CYCLES}
    assert not new, f"import cycles: {sorted(new.values())}"
