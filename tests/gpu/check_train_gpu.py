"""GPU check, Part C: a whole ``launch.train`` on one GPU, saved and resumed, on a bare PyTorch
machine (torch, transformers, numpy) with the wheels of tests/gpu/pack_wheels.py installed
(Ray, DeepSpeed, Hydra), within ~3 minutes on one H200 (``--timeout``), nothing downloaded:

    python tests/gpu/check_train_gpu.py [--out FILE] [--timeout 190]
    python tests/gpu/check_train_gpu.py --device cpu   # the same runs on the CPU (CI)

Two runs of the shipped FAST_TINY model (launch/models/tiny_model.py, launch/assets/tiny-fast),
colocated on the device (the hf engine and one ZeRO-2 DeepSpeed rank share one bundle: one
GPU), bf16, the verifier pool, the collective weight sync (over gloo: NCCL refuses two ranks of
one group on one GPU) and the learner's recomputed old log-probs, as the GPU presets:

1. ``train``: 3 steps with checkpoints at steps 2 and 3; exit 0, 3 finite rows, both
   checkpoints, and the engine on the reserved device (the run logs ``HFEngine on cuda``).
2. ``resume``: a second run from the first's step-2 checkpoint (its own run folder) to step 3;
   exit 0, it says it resumed at step 2, one row.
3. ``resume_matches``: its step 3 against the first run's: every logged figure but the timings
   and the held-out evaluation (run after the update) within 1e-3 relative (the samples, their
   rewards and the learner's forward are the same computation; on the CPU the rows are equal,
   evaluation included), and the weights both saved at step 3 equal but
   for at most 0.1% of the elements the step changed (bf16 rounding of an update that a
   non-deterministic GPU reduction moved by an ulp). A resume that lost the optimizer state,
   the sampler's position or the engine's weights changes far more.

One PASS/FAIL line per item, the figures in ``--out`` (JSON); exit 1 if any fails or the
global timeout ends a run (its processes are killed with their process group).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TOLERANCE = 1e-3  # relative, per logged figure of the resumed step
SHOWN = ("reward/mean", "acr/raw", "actor/pg_loss", "actor/grad_norm",
         "rollout/logprob_abs_diff_mean", "rollout/is_weight_mean", "timing_s/step",
         "timing_s/generate", "timing_s/update", "timing_s/weight_sync")  # fmt: skip
WEIGHTS_SHARE = 1e-3  # of the elements step 3 changed, at most this share may differ


def overrides(device: str) -> list[str]:
    from launch.models.tiny_model import FAST_TINY, tiny_overrides

    gpus = "1" if device == "cuda" else "0"
    return [
        *tiny_overrides(FAST_TINY),  # the shipped launch/assets/tiny-fast
        "rollout=hf",
        f"rollout.num_gpus_per_worker={gpus}",
        f"learner.num_gpus_per_rank={gpus}",
        "learner.num_ranks=1",  # one GPU: NCCL refuses two ranks of one group on it
        "learner.old_logprobs=recompute",  # as the GPU presets: bf16 on different kernels
        "rollout.weight_sync=collective",
        "rollout.weight_sync_backend=gloo",
        "model.dtype=bfloat16",
        "task.difficulty=1",  # the levels FAST_TINY handles: mixed groups, so updates move it
        "task.num_test=32",
        "trainer.prompts_per_step=8",
        "trainer.eval_every=0",  # held-out greedy accuracy at steps 0 and 3 only
        "trainer.eval_pass_k=0",
        "logger.report=false",
        "cluster.ready_timeout_s=60",  # a bundle that cannot be placed fails within the budget
    ]


def run(run_dir: Path, args: list[str], deadline: float) -> dict:
    """``launch.train`` in its own process group; killed with its processes at ``deadline``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    cmd = [sys.executable, "-m", "launch.train", f"trainer.run_dir={run_dir}",
           f"hydra.run.dir={run_dir}/hydra", *args]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = "timeout"
    (run_dir.parent / f"{run_dir.name}.log").write_text(output)
    return {"exit": code, "seconds": time.monotonic() - t0, "output": output}


def rows(run_dir: Path) -> dict[int, dict]:
    """The training steps' rows (step 0's holds only the evaluation before training)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {r["step"]: r for r in map(json.loads, lines) if "actor/pg_loss" in r}


def figures_of(row: dict) -> dict:
    """A row's figures without its wall-clock ones."""
    return {k: v for k, v in row.items() if not k.startswith(("timing_s/", "perf/"))}


def compare_rows(a: dict, b: dict) -> dict:
    """Keys missing on one side, and those beyond :data:`TOLERANCE` (with both values). The
    held-out evaluation (``eval/``) runs after the step's update, on weights the weights
    comparison judges (an ulp there can flip a greedy token): its differences are shown apart."""
    fa, fb = figures_of(a), figures_of(b)
    off = {}
    for k in fa.keys() & fb.keys():
        x, y = fa[k], fb[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y and not (
            isinstance(x, (int, float)) and isinstance(y, (int, float))
            and abs(x - y) <= TOLERANCE * max(abs(x), abs(y)) + 1e-9
        ):  # fmt: skip
            off[k] = [x, y]
    after = {k: v for k, v in off.items() if k.startswith("eval/")}
    beyond = {k: v for k, v in off.items() if k not in after}
    return {"missing": sorted(fa.keys() ^ fb.keys()), "beyond": beyond, "eval_beyond": after,
            "equal": fa == fb, "compared": len(fa)}  # fmt: skip


def saved_weights(run_dir: Path, step: int) -> dict:
    from safetensors.torch import load_file

    folder = run_dir / "checkpoints" / f"step_{step:06d}" / "model"
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out |= load_file(f)
    return out


def compare_weights(a2: dict, a3: dict, b3: dict) -> dict:
    """Elements that differ between the two step-3 checkpoints, against those step 3 changed."""
    same_keys = a3.keys() == b3.keys() == a2.keys()
    differ = sum(int((a3[k] != b3[k]).sum()) for k in a3) if same_keys else -1
    changed = sum(int((a3[k] != a2[k]).sum()) for k in a3) if same_keys else 0
    ok = same_keys and changed > 0 and differ <= WEIGHTS_SHARE * changed
    return {"ok": ok, "elements_differing": differ, "elements_step3_changed": changed}


def check(device: str, tmp: Path, deadline: float, extra: list[str] | tuple = ()) -> dict:
    common = [*overrides(device), *extra]
    a, b = tmp / "a", tmp / "b"
    first = run(a, [*common, "trainer.total_steps=3", "trainer.save_every=2"], deadline)
    got = rows(a)
    ckpts = [a / "checkpoints" / f"step_{s:06d}" for s in (2, 3)]
    engine = f"HFEngine on {device}"
    finite = all(math.isfinite(r["actor/pg_loss"]) for r in got.values())
    out = {"train": {
        "ok": first["exit"] == 0 and sorted(got) == [1, 2, 3] and finite
        and all(c.is_dir() for c in ckpts) and engine in first["output"],
        "exit": first["exit"], "seconds": first["seconds"], "steps": sorted(got),
        "engine_on_device": engine in first["output"],
        **{k: [got[s].get(k) for s in sorted(got)] for k in SHOWN},
    }}  # fmt: skip
    if not out["train"]["ok"]:
        out["train"]["tail"] = first["output"][-3000:]
        return out
    resume = [*common, "trainer.total_steps=3", f"trainer.resume={ckpts[0]}"]
    second = run(b, resume, deadline)
    again = rows(b)
    said = "at step 2" in second["output"] and "resumed from" in second["output"]
    out["resume"] = {"ok": second["exit"] == 0 and sorted(again) == [3] and said,
                     "exit": second["exit"], "seconds": second["seconds"],
                     "steps": sorted(again), "resumed_at_step_2": said}  # fmt: skip
    if not out["resume"]["ok"]:
        out["resume"]["tail"] = second["output"][-3000:]
        return out
    row = compare_rows(got[3], again[3])
    weights = compare_weights(saved_weights(a, 2), saved_weights(a, 3), saved_weights(b, 3))
    out["resume_matches"] = {"ok": not row["missing"] and not row["beyond"] and weights["ok"],
                             "rows": row, "weights": weights}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="the figures (JSON)")
    ap.add_argument("--timeout", type=float, default=190.0, help="global, seconds")
    # not for the GPU run: the CPU test's runs join its Ray (cluster.address=...), ~14 core-s
    # of Ray's start and stop less each (tests/conftest.py joined_ray)
    ap.add_argument("--override", action="append", default=[],
                    help="one more Hydra override for both runs (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch

    figures: dict = {"device": args.device, "torch": torch.__version__}
    if args.device == "cuda":
        # the GPUs a local Ray will offer its placement groups (its own count, through NVML):
        # none, and the run would wait cluster.ready_timeout_s for a bundle that never fits
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as Nvidia

        figures["ray_gpus"] = Nvidia.get_current_node_num_accelerators()
        if not torch.cuda.is_available() or figures["ray_gpus"] < 1:
            print(f"FAIL setup: CUDA {torch.cuda.is_available()}, Ray sees "
                  f"{figures['ray_gpus']} GPUs", flush=True)  # fmt: skip
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        figures |= check(args.device, Path(tmp), t0 + args.timeout, args.override)
        if args.out:  # the runs' logs beside the figures
            for log in Path(tmp).glob("*.log"):
                log.replace(args.out.with_name(f"{args.out.stem}_{log.name}"))
    figures["seconds"] = time.monotonic() - t0
    items = {k: v for k, v in figures.items() if isinstance(v, dict) and "ok" in v}
    for name, result in items.items():
        shown = {k: v for k, v in result.items() if k not in ("ok", "tail")}
        print(f"{'PASS' if result['ok'] else 'FAIL'} {name}: {json.dumps(shown)[:800]}")
        if "tail" in result:
            print(result["tail"])
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    failed = [k for k, v in items.items() if not v["ok"]] + (["incomplete"] * (len(items) < 3))
    print(f"{'FAIL' if failed else 'PASS'} all: {figures['seconds']:.0f} s, failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
