"""The paper's other baselines end to end with real actors (hf engine, verifier pool, one DeepSpeed
rank), 3 steps each, on the test run's tiny model: their metrics are there and finite and their
own state reaches the checkpoint. One rank: what these runs test is the algorithm's wiring, which
the driver and its stages carry; two ranks are tested by the default run, the fault tests and the
learner tests (a rank is ~8 core-s to start)."""

from __future__ import annotations

import json
import math

import pytest

from learner import checkpoint
from reward.arithmetic import sample_problems
from tests.conftest import fast_tiny_overrides
from tests.e2e.runs import rows, run_train
from tests.hub_server import FakeHub

SHORT = [
    "rollout=hf",
    "trainer.total_steps=3",
    "trainer.prompts_per_step=8",
    "trainer.eval_every=0",
    "trainer.eval_pass_k=0",
    "logger.report=false",
    "learner.num_ranks=1",
]


@pytest.mark.slow
def test_dcpo_three_steps_keeps_per_prompt_history_in_the_checkpoint(
    tmp_path, tiny_model_dir, joined_ray
):
    """algorithm=dcpo with task.num_train=8: the 8 prompts come back every step, so steps 2-4
    standardise against history (visit counts 1-4 in the stage state)."""
    run_dir = tmp_path / "dcpo"
    run_train(
        run_dir,
        *fast_tiny_overrides(tiny_model_dir),
        *SHORT,
        "algorithm=dcpo",
        "task.num_train=8",
        "task.difficulty=2",  # mixed groups that sometimes collapse: where history matters
        "trainer.total_steps=4",
        *joined_ray,
    )
    got = rows(run_dir)
    for step in (1, 2, 3, 4):
        r = got[step]
        for key in ("actor/pg_loss", "actor/pg_clipfrac", "acr/raw", "acr/effective"):
            assert math.isfinite(r[key]), (step, key)
        # a collapsed group with a mixed history gets a signal: effective <= raw
        assert r["acr/effective"] <= r["acr/raw"]
    # every group of steps 2-4 standardised against its prompt's earlier visits
    assert [got[s]["dcpo/history_groups"] for s in (1, 2, 3, 4)] == [0.0, 8.0, 8.0, 8.0]
    # ... and that history rescued a collapsed group somewhere (issue 24: it never ran before;
    # deterministic on the pinned FAST_TINY: seeded hf engine on CPU)
    assert any(got[s]["acr/effective"] < got[s]["acr/raw"] for s in (2, 3, 4)), got
    last = checkpoint.checkpoints(run_dir / "checkpoints")[-1]
    history = checkpoint.read_state(last)["advantage_stage"]["prompt_history"]
    # each of the 8 prompts visited once per step: visits 4
    assert len(history) == 8
    assert {v[0] for v in history.values()} == {4}


@pytest.mark.slow
def test_release_rule_fires_on_collapsed_groups_with_the_model_from_the_hub(
    tmp_path, tiny_model_dir, joined_ray
):
    """algorithm=avspo_release at 8 prompts per step: the rule is applied per group, so the
    collapsed groups of a mixed step get their opposite-label sample (before issue 24 it tested
    the whole step and never fired: acr/effective == acr/raw in every row).

    The step is mixed by construction, whatever weights this CPU built (an Intel AVX-512 CPU's
    FAST_TINY collapsed no group of 24 at L1, docs/NOTES.md): the train file holds 8 L1 problems
    (all 8 come every step), 4 of them with an answer no response can reach (-99999: the tiny
    model writes 1-3 digits), so those 4 groups are all-incorrect every step, while the other
    4 hold correct samples (reward/mean 0.41-0.53 at L1 with the real answers: no correct one
    among 32 samples has probability ~0.5^32), so the step always holds both labels: a rule
    applied to the whole step would not fire.

    The model is a hub id (``model.path=avspo-test/tiny-fast``) served by a local fake of the
    hub (tests/hub_server.py; it stands in for the network only): the driver resolves ``main``
    to its commit, downloads it into ``$HF_HOME`` and writes the commit into config.yaml; the
    actors load that snapshot."""
    with FakeHub() as hub:
        sha = hub.add_repo("avspo-test/tiny-fast", tiny_model_dir)
        env = {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(tmp_path / "hf_home"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        run_dir = tmp_path / "release"
        data = tmp_path / "l1.jsonl"
        problems = sample_problems(1, 8, split="train", seed=0)
        data.write_text("".join(
            json.dumps({"question": expr, "answer": str(value if i % 2 else -99999)}) + "\n"
            for i, (expr, value) in enumerate(problems)
        ))  # fmt: skip
        task = [
            "task=gsm8k", f"task.train_file={data}", f"task.test_file={data}",
            "task.answer_format=plain", "task.prompt_template='{question}='",
        ]  # fmt: skip
        stdout = run_train(
            run_dir, *SHORT, *task, "algorithm=avspo_release",
            "model.source=path", "model.path=avspo-test/tiny-fast",
            # a model by path with the tiny model's own limits and lr is refused (meant for
            # real models): one token and one position more (its answers are ~4 tokens), lr /2
            "rollout.max_model_len=65", "rollout.sampling.max_new_tokens=9", "learner.lr=5e-5",
            *joined_ray,
            env=env,
        )  # fmt: skip
    assert f"model avspo-test/tiny-fast at main: commit {sha}" in stdout
    assert f"revision: {sha}" in (run_dir / "config.yaml").read_text()
    assert any("/resolve/" in path for _, path in hub.requests)  # downloaded, not found locally
    got = rows(run_dir)
    for s in (1, 2, 3):
        r = got[s]
        assert r["acr/low"] >= 4 / 8 and r["reward/mean"] > 0, r  # both labels in the step
        # binary rewards: every collapsed group has one label, and each gets one virtual sample
        assert r["avspo/augmented_groups"] == round(r["acr/raw"] * 8), r
        assert r["avspo/virtual_samples"] == r["avspo/augmented_groups"]
        assert r["acr/effective"] < r["acr/raw"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["intuitor", "rent"])
def test_intrinsic_reward_presets_three_steps(tmp_path, tiny_model_dir, joined_ray, algorithm):
    """algorithm=intuitor / rent: the learner scores every sample before the update, the
    step's reward is that score alone (verifier weight 0), ACR uses the preset's tau, and the
    held-out accuracy is still the verifier's (evaluated at the end)."""
    run_dir = tmp_path / algorithm
    tiny = fast_tiny_overrides(tiny_model_dir)
    run_train(run_dir, *tiny, *SHORT, f"algorithm={algorithm}", *joined_ray)
    got = rows(run_dir)
    for step in (1, 2, 3):
        r = got[step]
        cert, ent = r["reward/self_certainty_mean"], r["reward/entropy_mean"]
        assert cert > 0 and ent > 0  # KL(U || p) > 0 and H > 0 for a non-degenerate policy
        # the reward is the intrinsic score alone (float32 rewards vs float64 means)
        want = cert if algorithm == "intuitor" else -ent
        assert r["reward/mean"] == pytest.approx(want, rel=1e-5)
        assert 0.0 <= r["reward/verifier_mean"] <= 1.0
        assert math.isfinite(r["actor/pg_loss"]) and 0.0 <= r["acr/raw"] <= 1.0
    assert 0.0 <= got[3]["eval/accuracy"] <= 1.0
