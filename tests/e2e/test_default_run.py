"""The embedded default run, end to end: ``python -m launch.train`` at its defaults (the shipped
default model, level 3 with 256 held-out problems, the vllm engine, AVSPO's fast preset, 2 ZeRO-2
ranks, the verifier pool, 64 prompts x 8 samples, evaluations every 10 steps, reports and
checkpoints), shortened to 20 of its 40 steps: it learns, it logs every documented metric,
checkpoints, evaluates and reports, and the whole run stays on loopback. As root it runs from a
copy of the checkout nobody else can read (a clone under the 0700 /root, the default on GPU
clouds and in containers: every verifier worker once died there), with that copy's own
interpreter path and no PYTHONPATH back here."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.e2e.runs import (
    ROOT,
    is_loopback,
    listening,
    private_copy,
    private_env,
    rows,
    start_train,
    train_cmd,
    watch_listening,
)
from tests.metric_names import STEP_KEYS

# The learning bounds come from the spread across seeds, not from one machine's trajectory (each
# CPU family trains its own trajectory from the same shipped weights, as each seed does): the
# default run at seeds 0-6 on an AMD EPYC with AVX-512 (2026-12-04), figures at step 20.
#   training reward (512 samples a step), mean of steps 11-20 minus mean of steps 1-10:
#     +0.038 +0.036 +0.041 +0.036 +0.040 +0.024 +0.038: mean +0.036, std 0.0056
#   held-out mean@8 (pass@1 at T = 1, 8 samples on each of 256 problems), step 20 minus step 0:
#     +0.053 +0.044 +0.068 +0.058 +0.077 +0.055 +0.050: mean +0.058, std 0.011
#   held-out greedy accuracy (256 problems), step 20 minus step 0 (it does not rise in 20 steps):
#     +0.004 -0.035 +0.008 -0.020 -0.004 -0.004 -0.020: mean -0.010, std 0.015
# Each bound sits ~3.3-3.7 stds below the seeds' mean (a trajectory that learns as these did
# fails it about once in a thousand), and the two rises stay positive: a run that does not learn
# fails them. (Windows of 5 steps were too noisy: 16-20 minus 1-5 had std 0.017 and a seed at
# +0.017; the 64 prompts of a step vary in difficulty.)
REWARD_RISE = 0.015  # +0.036 - 3.7 x 0.0056
MEAN8_RISE = 0.02  # +0.058 - 3.4 x 0.011
GREEDY_FALL = 0.06  # -(-0.010 - 3.3 x 0.015)


@pytest.mark.slow
def test_default_run_learns_logs_checkpoints_and_listens_on_loopback_only(tmp_path):
    """20 steps instead of 40, with checkpoints every 10 steps and the weights synced over the
    collective (gloo) group (the object store is the default: both deliver the same bits,
    tests/e2e/test_train_cli.py). Learning: the bounds above, derived from seven seeds.

    Loopback: every socket the run opens (Ray's GCS, raylet, workers and agents, DeepSpeed's
    store and gloo pairs, the weight-sync store, vLLM's own) listens on 127.0.0.1 only
    (``cluster.listen=loopback``, the default; the control with ``node`` is in
    tests/e2e/test_closed_and_multirun.py)."""
    overrides = (
        "rollout.weight_sync=collective",
        "trainer.total_steps=20",
        "trainer.save_every=10",
    )
    if os.geteuid() == 0:  # from a 0700 copy (the module's docstring)
        checkout = private_copy(tmp_path)
        run_dir = checkout / "outputs" / "default-run"
        argv = [str(checkout / ".venv" / "bin" / "python"), *train_cmd(run_dir, *overrides)[1:]]
        where = dict(cwd=checkout, argv=argv, env=private_env())
    else:
        run_dir, where = tmp_path / "run", dict(cwd=ROOT)
    before = listening()
    proc = start_train(run_dir, *overrides, **where)
    seen, stdout, stderr = watch_listening(proc, before, time.monotonic() + 1800)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert len(seen) >= 5, seen  # Ray alone opens ~10 listening sockets: the run was seen
    beyond = sorted((a, p) for a, p, _ in seen if not is_loopback(a))
    assert not beyond, f"listening beyond loopback: {beyond}"

    got = rows(run_dir)
    assert sorted(got) == list(range(21))
    start, end = got[0], got[20]
    early = sum(got[s]["reward/mean"] for s in range(1, 11)) / 10
    late = sum(got[s]["reward/mean"] for s in range(11, 21)) / 10
    print(f"training reward {early:.3f} -> {late:.3f}; held-out mean@8 "
          f"{start['eval/mean@8']:.3f} -> {end['eval/mean@8']:.3f}, greedy "
          f"{start['eval/accuracy']:.3f} -> {end['eval/accuracy']:.3f}")  # fmt: skip
    assert "weights id: 4aa8613f (shipped: " in stdout  # the shipped default, no build
    assert f"(shipped: {where['cwd'] / 'launch'}" in stdout  # the copy's own, as root
    assert late - early >= REWARD_RISE, (early, late)
    assert end["eval/mean@8"] - start["eval/mean@8"] >= MEAN8_RISE, (start, end)
    assert end["eval/accuracy"] - start["eval/accuracy"] >= -GREEDY_FALL, (start, end)
    for step in (0, 10, 20):  # evaluation at 0, every 10 steps and at the end
        assert {"eval/accuracy", "eval/pass@8"} <= set(got[step])
        assert got[step]["eval/pass@8"] >= got[step]["eval/mean@8"]
    for step in range(1, 21):
        assert not STEP_KEYS - set(got[step]), (step, STEP_KEYS - set(got[step]))

    ckpts = run_dir / "checkpoints"  # at step 10 and at the end; latest points at the end
    assert (ckpts / "latest").read_text().strip() == "step_000020"
    assert (ckpts / "step_000010" / "model" / "model.safetensors").exists()
    report = (run_dir / "report.md").read_text()
    assert "acr.png" in report and (run_dir / "acr.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((run_dir / "prompt_history.json").read_text())["summary"]["prompts_seen"]
    assert (run_dir / "config.yaml").exists() and "held-out accuracy" in stdout
