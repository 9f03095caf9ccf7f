"""Import rules: pure algorithm code imports no Ray/vLLM/DeepSpeed/torch.distributed, and imports
follow the data (rollout -> reward -> learner/diagnostics; only launch wires them together)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "learner/advantage.py",
    "learner/loss.py",
    "learner/trigger.py",
    "learner/config.py",
    "learner/advantage_stage.py",
    "diagnostics/acr.py",
    "diagnostics/groups.py",
]
HEAVY = ("ray", "vllm", "deepspeed", "torch.distributed")
PACKAGES = ("rollout", "reward", "learner", "diagnostics", "launch")
# package -> project packages it must not import
FORBIDDEN = {
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
    code = (
        "import sys; import learner.advantage, learner.loss, learner.advantage_stage; "
        "import diagnostics.acr; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'vllm', 'deepspeed'}))"
    )
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
