"""The embedded default run, end to end (``python -m launch.train`` at its defaults: the vllm
engine, AVSPO's fast preset, 2 ZeRO-2 ranks, the verifier pool, 64 prompts x 8 samples, reports
and checkpoints) on the session's small tiny model (FAST_TINY, tests/conftest.py) instead of the
default one, shortened to 20 steps: it learns, it logs every documented metric, checkpoints,
evaluates and reports, and the whole run stays on loopback.

The default model's own build (500 warm-start steps under MKL's slow reproducible path: ~9 min
alone on the AMD EPYC, 13 min alone and 20-25 min inside a CI run on the Intel Xeon) would take
most or all of the CI's budget; it is tests/launch/test_default_build.py, left out of
``make test``."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import fast_tiny_overrides
from tests.e2e.runs import is_loopback, listening, rows, start_train, watch_listening
from tests.metric_names import STEP_KEYS


@pytest.mark.slow
def test_default_run_learns_logs_checkpoints_and_listens_on_loopback_only(tmp_path, tiny_model_dir):
    """20 steps instead of 40, with evaluations and checkpoints every 10 steps and the weights
    synced over the collective (gloo) group (the object store is the default: both deliver the
    same bits, tests/e2e/test_train_cli.py). FAST_TINY at the level it half-solves (L1; the
    default's L3 is beyond it) with a learning rate that suits its size (3e-4: at the default
    model's 1e-4 it moved little in 20 steps, at 1e-3 its reward fell, measured 2026-12-03).

    Learning, measured on the Intel Xeon (FAST_TINY 9438f709): the training reward
    (``reward/mean``, 512 samples a step) averaged 0.399 over steps 1-5 and 0.513 over steps
    16-20. One binomial std of a 5-step mean near 0.45 is sqrt(0.45 * 0.55 / 2560) = 1.0 point,
    1.4 points for the difference: the rise must be at least 4 points (~3 stds above none, ~5
    below what was measured). Held-out pass@1 at temperature 1 (``eval/mean@8``, 8 samples on
    each of L1's 56 test problems) went 0.250 -> 0.313 (one std of the difference ~2.9 points):
    it must not fall. Greedy ``eval/accuracy`` (56 problems, one std ~6 points) must not fall by
    more than 12.

    Loopback: every socket the run opens (Ray's GCS, raylet, workers and agents, DeepSpeed's
    store and gloo pairs, the weight-sync store, vLLM's own) listens on 127.0.0.1 only
    (``cluster.listen=loopback``, the default; the control with ``node`` is in
    tests/e2e/test_closed_and_multirun.py)."""
    run_dir = tmp_path / "run"
    before = listening()
    proc = start_train(
        run_dir,
        *fast_tiny_overrides(tiny_model_dir),
        "task.num_test=256",
        "learner.lr=3e-4",
        "rollout.weight_sync=collective",
        "trainer.total_steps=20",
        "trainer.eval_every=10",
        "trainer.save_every=10",
    )
    seen, stdout, stderr = watch_listening(proc, before, time.monotonic() + 1800)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert len(seen) >= 5, seen  # Ray alone opens ~10 listening sockets: the run was seen
    beyond = sorted((a, p) for a, p, _ in seen if not is_loopback(a))
    assert not beyond, f"listening beyond loopback: {beyond}"

    got = rows(run_dir)
    assert sorted(got) == list(range(21))
    start, end = got[0], got[20]
    early = sum(got[s]["reward/mean"] for s in range(1, 6)) / 5
    late = sum(got[s]["reward/mean"] for s in range(16, 21)) / 5
    print(f"training reward {early:.3f} -> {late:.3f}; held-out pass@1 (T=1): "
          f"{start['eval/mean@8']:.3f} -> {end['eval/mean@8']:.3f}")  # fmt: skip
    assert late >= early + 0.04, (early, late)
    assert end["eval/mean@8"] >= start["eval/mean@8"], (start, end)
    assert end["eval/accuracy"] >= start["eval/accuracy"] - 0.12
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
