"""What a finished run's ``samples.jsonl`` (``logger.samples``) must hold, checked against its own
metrics.jsonl and, independently, against the loop-over-groups references of tests/reference.py:
the run of tests/e2e/test_train_cli.py's ``whole_run`` (GRPO advantages, or AVSPO's for the
collapsed groups it augmented)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.metric_names import SAMPLE_FIELDS
from tests.reference import ref_avspo, ref_grpo

REASONS = {"ok", "wrong", "no_answer", "refused", "timeout", "error"}


def logged(run_dir: Path, name: str = "samples.jsonl") -> dict[int, list[dict]]:
    """A run's logged rollouts by step (read here, not with diagnostics/samples.py's reader)."""
    out: dict[int, list[dict]] = {}
    for line in (Path(run_dir) / name).read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record["step"], []).append(record)
    return out


def _collapsed(rewards: list[float], tau: float = 1e-6) -> bool:
    return len(rewards) == 1 or statistics.pstdev(rewards) < tau


def check_samples(run_dir: Path, n: int, groups: int, group_size: int) -> None:
    """Every training step logged ``n`` records with every field, evenly spread (``n`` >=
    ``groups``: each group is seen, so the records' ``group_rewards`` hold the whole step); the
    rewards agree with ``reward/mean`` and ``acr/raw``; each advantage is what the run's
    estimator (``algorithm=avspo_fast``: GRPO for a mixed group; a collapsed group gets 0, or
    AVSPO's stratified virtual samples with the step's ``avspo/k`` when the step augmented) gives
    its group's rewards; lengths and advantages lie within the step's logged spreads."""
    metrics = {
        r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }
    samples = logged(run_dir)
    assert sorted(samples) == [s for s in sorted(metrics) if s > 0]
    step_samples = groups * group_size
    spread = [(k * step_samples // n) for k in range(n)]
    for step, records in samples.items():
        m = metrics[step]
        assert [list(r) for r in records] == [SAMPLE_FIELDS] * n, step
        assert [(r["group_id"], r["sample"]) for r in records] == [
            (i // group_size, i % group_size) for i in spread
        ]
        by_group = {r["group_id"]: r["group_rewards"] for r in records}
        assert sorted(by_group) == list(range(groups))  # every group seen
        every = [x for g in sorted(by_group) for x in by_group[g]]
        assert statistics.fmean(every) == pytest.approx(m["reward/mean"], abs=1e-6), step
        collapsed = sum(_collapsed(by_group[g]) for g in by_group) / groups
        if m["verifier/faulted_groups"] == 0:
            assert collapsed == pytest.approx(m["acr/raw"]), step
        for r in records:
            assert r["verdict"] in REASONS and r["trained"] and r["prompt"] and r["reference"]
            assert r["reward"] == r["group_rewards"][r["sample"]] == r["score"]  # no shaping
            assert r["correct"] == (r["score"] >= 1.0)
            assert m["response_length/min"] <= r["response_tokens"] <= m["response_length/max"]
            assert m["advantage/min"] - 1e-6 <= r["advantage"] <= m["advantage/max"] + 1e-6
            if m["verifier/faulted_groups"] == 0:
                assert r["advantage"] == pytest.approx(_expected(r, m), rel=1e-5, abs=1e-6)


def _expected(record: dict, m: dict) -> float:
    """The advantage the run's AVSPO gives the record's sample, from its group's rewards."""
    rewards = record["group_rewards"]
    ids = [0] * len(rewards)
    if not _collapsed(rewards):
        return ref_grpo(rewards, ids)[record["sample"]]
    if m["avspo/augmented_groups"] == 0:
        return 0.0
    k = round(m["avspo/k"])  # every group of the step has G samples: one K for all
    return ref_avspo(rewards, ids, tau_adapt=-1.0, k=k)[0][record["sample"]]
