"""The vLLM pack for a bare Hopper machine (tests/gpu/pack_vllm.py), built for this machine's
Python and installed into a folder of its own, rehearses its import chain here
(tests/gpu/rehearse_vllm_pack.py): ``from vllm import LLM, SamplingParams``, the project's engine
and worker extension, and the modules an engine on an H100 loads, with only the GPU image's
packages visible. Needs the network (vLLM's wheel, 290 MiB, and its dependencies; or
``VLLM_WHEEL`` naming the wheel) and ~5 minutes: ``make test-vllm-pack``, not ``make test``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.vllm_pack]


def test_every_module_the_engine_reaches_is_in_the_image_or_the_pack(tmp_path):
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = [sys.executable, "tests/gpu/pack_vllm.py", "--python", python,
             "--out", str(tmp_path / "pack")]  # fmt: skip
    if os.environ.get("VLLM_WHEEL"):
        build += ["--wheel", os.environ["VLLM_WHEEL"]]
    made = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    rehearsal = subprocess.run(
        [sys.executable, "tests/gpu/rehearse_vllm_pack.py", "--pack", str(tmp_path / "pack"),
         "--json", str(tmp_path / "report.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    print(rehearsal.stdout)
    assert rehearsal.returncode == 0, rehearsal.stdout[-6000:] + rehearsal.stderr[-3000:]
    plain, hopper = json.loads((tmp_path / "report.json").read_text())
    # the project's own entry points import in full on either platform
    for report in (plain, hopper):
        for target in ("vllm:LLM", "vllm:SamplingParams", "rollout.vllm_engine",
                       "rollout.collective:VLLMWeightSyncExtension"):  # fmt: skip
            assert report["imports"][target] == "ok", (report["mode"], target)
        assert report["vllm"][0] == "0.26.0" and "/.venv/" not in report["vllm"][1]
    # FlashAttention 3's interface and backend import without FA2 and FA4 (dropped)
    assert hopper["imports"]["vllm.v1.attention.backends.flash_attn"] == "ok"
    # the V2 model runner, which runs a dense model on vLLM 0.26, imports from the pack
    v2 = {t: r for t, r in hopper["imports"].items() if t.startswith("vllm.v1.worker.gpu.")}
    assert "vllm.v1.worker.gpu.model_runner" in v2 and set(v2.values()) == {"ok"}, v2
