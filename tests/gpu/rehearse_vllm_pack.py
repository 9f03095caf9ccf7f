"""Rehearse on a CPU machine the imports the GPU machine will make with the vLLM pack
(tests/gpu/pack_vllm.py): install the pack into a folder of its own, then import, with only the
GPU image's packages (pack_vllm.IMAGE), the pack and the standard library visible, what
``from vllm import LLM, SamplingParams``, this project's engine (rollout/vllm_engine.py) and its
worker extension (rollout/collective.py) reach, and the modules an engine on a Hopper GPU loads
(:data:`HOPPER`).

    python tests/gpu/pack_vllm.py --python 3.11 --out /tmp/vllm_pack   # for this machine's Python
    python tests/gpu/rehearse_vllm_pack.py --pack /tmp/vllm_pack [--json FILE]
    python tests/gpu/rehearse_vllm_pack.py --site DIR   # a pack already installed in DIR

Two passes, each in a child process:

- ``plain``: the imports as they run here, on this machine's own vLLM platform (no GPU: CPU);
- ``hopper``: first each native library of the pack is loaded for real (on a machine without
  CUDA they fail: recorded, expected), then stand-ins (empty modules) take the place of those
  that failed, vLLM's platform is set to its CUDA platform, and :data:`HOPPER` is imported.

A module outside the image and the pack is refused (``ModuleNotFoundError``) and noted, also
where vLLM catches the error and goes on. Exit 0 when every import of both passes succeeds, 1
if one fails, with the chain where it stopped. What a pass on CPU cannot show: whether the
native libraries load with torch 2.11 and CUDA 13 (this torch differs: 2.13 CPU here), and
imports made only on branches taken with a GPU present (``torch.cuda.is_available()``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gpu import pack_vllm  # noqa: E402

# what the project's engine imports (rollout/vllm_engine.py, rollout/collective.py)
ENGINE = [
    "vllm:LLM", "vllm:SamplingParams", "vllm.inputs:TokensPrompt",
    "rollout.vllm_engine", "rollout.collective:VLLMWeightSyncExtension",
]  # fmt: skip
# what an engine on one Hopper GPU imports: its core and executor, the GPU worker and model
# runner (sleep mode's allocator, CUDA graphs' compilation), FlashAttention 3 (bf16), the
# Triton and Flex attention backends (fp32: check_gpu.py's engine_gap_fp32), the models of the
# GPU checks (SmolLM2: Llama; Qwen2.5), the loader, the sampler, the weight transfer engine.
# Two model runners: vLLM 0.26 runs a dense model (not MoE, not hybrid) on its V2 runner
# (vllm/v1/worker/gpu/; config/vllm.py use_v2_model_runner, when Triton is there: the image has
# it), the rest on V1 (gpu_model_runner); V2's model state is imported when the model loads.
HOPPER = [
    "vllm.platforms.cuda",
    "vllm.v1.engine.llm_engine", "vllm.v1.engine.core", "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu.model_states.default",
    "vllm.v1.worker.gpu.attn_utils", "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.input_batch", "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.worker.gpu.sample.prompt_logprob", "vllm.v1.worker.gpu.warmup",
    "vllm.device_allocator.cumem", "vllm.compilation.backends", "vllm.compilation.decorators",
    "vllm.vllm_flash_attn", "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.backends.flex_attention",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen2",
    "vllm.model_executor.model_loader.default_loader", "vllm.v1.sample.sampler",
    "vllm.distributed.weight_transfer.base", "vllm.distributed.parallel_state",
    *ENGINE,
]  # fmt: skip
NATIVE = ["vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C", "vllm.cumem_allocator"]

NATIVE_OPS = ("_C", "_C_cache_ops", "_C_custom_ar", "_C_utils", "_C_cuda_utils", "_vllm_fa3_C")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def child(site: str, mode: str, allow: bool) -> dict:
    """One pass, in this (child) process; returns its report."""
    import importlib.abc
    import importlib.machinery
    import importlib.metadata
    import importlib.util
    import traceback

    root = str(ROOT)
    sys.path[:0] = [site, root]
    owners = importlib.metadata.packages_distributions()
    refused: dict[str, dict] = {}

    def ours(filename: str) -> bool:
        return filename.startswith((site + "/", root + "/")) and "/.venv/" not in filename

    def short(filename: str) -> str:
        return os.path.relpath(filename, site) if filename.startswith(site) else filename

    def importer() -> str:
        """The first frame outside the import machinery: who asked for the module."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if "importlib" not in name and name != __file__:
                return f"{name}:{f.f_lineno}"
            f = f.f_back
        return "the rehearsal's list"

    class ImageOnly(importlib.abc.MetaPathFinder):
        """A top-level module that the pack or the project asks for must come from the pack,
        the project, the standard library or a distribution of the GPU image (a folder inside
        one, such as setuptools/_vendor, counts as its own); what a package of the image asks
        for is that package's own need, met there."""

        def find_spec(self, name, path=None, target=None):
            if "." in name or name in sys.stdlib_module_names or name.startswith("_sysconfig"):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
            if spec is None:
                return None
            where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
            if ours(where):
                return None
            dists = owners.get(name) or [Path(where).parent.parent.name]
            if any(_norm(d) in pack_vllm.IMAGE for d in dists):
                return None
            by = importer()
            if not (ours(by) or by.startswith(("the rehearsal", __file__))):
                return None
            refused.setdefault(name, {"distributions": dists, "first_by": short(by)})
            if allow:
                return None
            raise ModuleNotFoundError(f"No module named {name!r} (not in the GPU image or the "
                                      "pack)", name=name)  # fmt: skip

    sys.meta_path.insert(0, ImageOnly())
    report: dict = {"mode": mode, "natives": {}, "imports": {}}
    targets = ENGINE if mode == "plain" else HOPPER
    if mode == "hopper":
        _stand_in_natives(site, report)
        import vllm.platforms as platforms

        platforms._current_platform = _hopper()()
        report["platform"] = "CudaPlatform, answering as an H100 (compute capability 9.0)"
    for target in targets:
        module, _, attr = target.partition(":")
        try:
            m = importlib.import_module(module)
            if attr:
                getattr(m, attr)
            where = getattr(m, "__file__", "") or ""
            report["imports"][target] = "ok" if "/.venv/" not in where else f"ok, from {where}"
        except BaseException as e:  # noqa: BLE001 - every failure is a finding
            frames = traceback.extract_tb(e.__traceback__)
            chain = [f"{short(f.filename)}:{f.lineno}" for f in frames
                     if "importlib" not in f.filename and f.filename != __file__]  # fmt: skip
            report["imports"][target] = {"error": f"{type(e).__name__}: {e}"[:400],
                                         "chain": chain[-6:]}  # fmt: skip
    import vllm
    import vllm.platforms as platforms

    report.setdefault("platform", type(platforms.current_platform).__name__)
    report["vllm"] = [vllm.__version__, vllm.__file__]
    report["refused"] = dict(sorted(refused.items()))
    return report


def _stand_in_natives(site: str, report: dict) -> None:
    """Load each native library of the pack from its file, as its package would (after torch,
    which they link against); where one fails (no CUDA here) an empty module takes its place and
    the torch.ops namespaces it would register answer every name with a no-op (and fake
    implementations registered for those ops are accepted and dropped)."""
    import importlib.machinery
    import importlib.util
    import types

    import torch

    class StandIn(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *a, **k: None

    class Op:
        def __call__(self, *args, **kwargs):
            return None

        def __getattr__(self, name):  # .default, .overloads ...
            if name.startswith("__"):
                raise AttributeError(name)
            return self

    class Namespace:
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Op()

    failed = False
    for name in NATIVE:
        path = os.path.join(site, *name.split(".")) + ".abi3.so"
        try:
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            report["natives"][name] = "loaded"
        except Exception as e:
            report["natives"][name] = f"{type(e).__name__}: {e}"[:300]
            module, failed = StandIn(name), True
            module.__file__ = "stand-in"
        sys.modules[name] = module
    if failed:
        for ns in NATIVE_OPS:
            setattr(torch.ops, ns, Namespace())
        # fake implementations are registered for the real ops, which are not there
        torch.library.register_fake = lambda *a, **k: lambda fn: fn


def _hopper():
    """vLLM's CUDA platform answering the hardware queries as an H100 would."""
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Hopper(CudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(major=9, minor=0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 80 * 2**30

        @classmethod
        def is_fully_connected(cls, physical_device_ids):
            return True

    return Hopper


def rehearse(site: Path, mode: str, allow: bool = False, python: str = sys.executable) -> dict:
    """One pass (``plain`` or ``hopper``) in a child process; its report. ``allow``: modules
    outside the image and the pack are noted but not refused (to find what a pack lacks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [python, __file__, "--child", mode, "--site", str(site)] + (["--allow"] if allow else [])
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")]
    if not lines:
        return {"mode": mode, "crashed": out.returncode, "stderr": out.stderr[-4000:]}
    return json.loads(lines[-1][len("REPORT ") :])


def missing(result) -> bool:
    """A failed import that is a module not found (the pack lacks it), not a stop for want of
    CUDA (a native library, libcudart, a device)."""
    return isinstance(result, dict) and result["error"].startswith("ModuleNotFoundError")


def failures(report: dict) -> list[str]:
    if "crashed" in report:
        return [f"{report['mode']}: the child exited {report['crashed']}"]
    return [f"{report['mode']}: {t}: {r['error']}" for t, r in report["imports"].items()
            if missing(r)]  # fmt: skip


def show(report: dict) -> None:
    print(f"== {report['mode']} (platform {report.get('platform', '?')})")
    if "crashed" in report:
        print(report["stderr"])
        return
    for name, result in report.get("natives", {}).items():
        print(f"  native {name}: {result}")
    for target, result in report["imports"].items():
        if isinstance(result, dict):
            word = "FAIL" if missing(result) else "STOP"
            print(f"  {word} {target}: {result['error']}\n       at {' <- '.join(result['chain'])}")
        else:
            note = "" if result == "ok" else ": " + result
            print(f"  {'ok  ' if result == 'ok' else 'WARN'} {target}{note}")
    for name, why in report.get("refused", {}).items():
        print(f"  refused {name} ({', '.join(why['distributions'])}), first from {why['first_by']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--pack", type=Path, help="a pack folder (parts and manifest.json)")
    src.add_argument("--site", type=Path, help="a folder the pack is installed in")
    ap.add_argument("--json", type=Path, help="write both reports here")
    ap.add_argument(
        "--allow",
        action="store_true",
        help="note modules outside the image and the pack instead of refusing them",
    )
    ap.add_argument("--child", choices=("plain", "hopper"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        report = child(str(args.site.resolve()), args.child, args.allow)
        print("REPORT " + json.dumps(report))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            if pack_vllm.install(args.pack, site) != 0:
                return 1
        reports = [rehearse(site.resolve(), mode, args.allow) for mode in ("plain", "hopper")]
    for report in reports:
        show(report)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1) + "\n")
    bad = [line for report in reports for line in failures(report)]
    results = [r for report in reports for r in report.get("imports", {}).values()]
    stops = sum(isinstance(r, dict) for r in results)
    print(
        f"{'FAIL' if bad else 'PASS'}: {len(bad)} modules not found; {stops - len(bad)} "
        "imports stopped for want of CUDA (expected here)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
