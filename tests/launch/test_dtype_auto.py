"""``model.dtype: auto`` (issue 46 item 2): bf16 where the launching machine has native bf16,
fp32 elsewhere, chosen before any actor starts and written where the run's actors read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.models.dtype import BF16_CPU_FLAGS, cpu_flags, native_bf16, resolve_dtype
from launch.validation import ConfigError
from tests.helpers import load

# Two /proc/cpuinfo excerpts: a Sapphire Rapids Xeon (AMX and AVX512_BF16) and an AMD Zen 2
# (AVX2 only), the flags cut to the ones that matter here.
XEON = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN2 = "processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2 fma\n"


def test_the_cpu_flags_decide_on_a_machine_without_cuda():
    assert native_bf16(cpu_flags(XEON), cuda=False) == "the CPU has amx_bf16 and avx512_bf16"
    assert native_bf16(cpu_flags(ZEN2), cuda=False) is None
    assert native_bf16({"avx512f", "avx512_bf16"}, cuda=False) == "the CPU has avx512_bf16"
    assert cpu_flags("") == set() and native_bf16(set(), cuda=False) is None


def test_auto_resolves_once_and_says_why():
    lines: list[str] = []
    cfg = load("model.dtype=auto").model
    resolve_dtype(cfg, log=lines.append, native=lambda: native_bf16(cpu_flags(XEON), cuda=False))
    assert cfg.dtype == "bfloat16"
    assert lines == ["model.dtype auto -> bfloat16 (the CPU has amx_bf16 and avx512_bf16)"]
    resolve_dtype(cfg, log=lines.append, native=lambda: None)  # already chosen: kept, silent
    assert cfg.dtype == "bfloat16" and len(lines) == 1
    cfg = load("model.dtype=auto").model
    resolve_dtype(cfg, log=lines.append, native=lambda: native_bf16(cpu_flags(ZEN2), cuda=False))
    assert cfg.dtype == "float32" and lines[-1].endswith("(no native bf16 on this machine)")
    explicit = load("model.dtype=float32").model  # an explicit dtype is never second-guessed
    resolve_dtype(explicit, log=lines.append, native=lambda: "a CUDA device with bf16")
    assert explicit.dtype == "float32" and len(lines) == 2


def test_this_machine_resolves_by_its_own_flags():
    # No number depends on the CPU: whichever CPU runs this, auto means bf16 exactly where
    # /proc/cpuinfo names a native bf16 unit, or a CUDA device has bf16.
    import torch

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cuda = torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] >= 8  # Ampere
    has = cuda or any(f in cpu_flags(text) for f in BF16_CPU_FLAGS)
    cfg = load("model.dtype=auto").model
    resolve_dtype(cfg, log=lambda line: None)
    assert cfg.dtype == ("bfloat16" if has else "float32")


def test_a_misspelt_dtype_names_the_key():
    with pytest.raises(ConfigError, match=r"model.dtype: 'bf16' is not one of \['float32', "):
        load("model.dtype=bf16")


# torch.cuda calls that initialise CUDA in the calling process (a context on GPU 0 for the run)
CUDA_CALLS = ("is_available", "is_bf16_supported", "current_device", "device_count", "init",
              "_lazy_init", "get_device_capability", "get_device_properties", "get_device_name",
              "mem_get_info", "set_device", "synchronize")  # fmt: skip


@pytest.fixture
def cuda_build(monkeypatch):
    """torch as a CUDA build would look to the launching process, with every torch.cuda call
    that initialises CUDA turned into an error: the driver must ask a child process instead."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def refuse(name):
        def call(*args, **kwargs):
            raise AssertionError(f"torch.cuda.{name} called in the driver")

        return call

    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, refuse(name))


def test_auto_on_a_gpu_machine_asks_a_child_process(cuda_build):
    """Issue 62: ``model.dtype=auto`` called torch.cuda in the driver, which then held a CUDA
    context on GPU 0 for the whole run."""
    import subprocess
    import sys

    from launch.models import dtype

    calls = []

    def child(cmd, **kwargs):  # stands in for subprocess.run: an Ampere GPU answers
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="bf16\n", stderr="")

    assert dtype.cuda_bf16(run=child) is True
    assert calls == [[sys.executable, "-c", dtype.CUDA_CHILD]]
    old = lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 0, "none\n", "")  # noqa: E731
    assert dtype.cuda_bf16(run=old) is False  # before Ampere: emulated, so fp32
    cfg = load("model.dtype=auto").model
    lines = []
    resolve_dtype(cfg, log=lines.append, native=lambda: native_bf16(set(), dtype.cuda_bf16(child)))
    assert cfg.dtype == "bfloat16" and lines == [
        "model.dtype auto -> bfloat16 (a CUDA device with bf16)"
    ]


def test_the_child_process_runs_on_this_machine(cuda_build):
    """The child's code itself, run for real (this process's torch.cuda is refused, the child's
    is not): on a machine without a GPU it answers no."""
    import torch

    from launch.models import dtype

    if Path("/dev/nvidia0").exists():
        pytest.skip("a GPU machine: the answer depends on its GPU")
    assert torch.version.cuda == "13.0"  # the parent looks like a CUDA build
    assert dtype.cuda_bf16() is False
    assert native_bf16(set()) is None  # the default path: the child, never torch.cuda here
