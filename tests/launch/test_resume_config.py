"""Which config changes a resume accepts (``launch/resume.py``): a checkpoint written before a key
was renamed, or with a section only another estimator reads, continues without an allow-list,
and a change that does alter the run is still refused by name."""

import dataclasses
import json

from launch.config import TrainConfig
from launch.resume import resume_problem
from tests.helpers import load


def _as_saved(cfg, **edit) -> dict:
    """``cfg``'s run record as a checkpoint holds it; ``edit`` maps a dotted key to a new value
    (None deletes it), to write the record an older trainer or another preset wrote."""
    config = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    for key, value in edit.items():
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return {"config": config, "train_data_sha256": "x"}


DEFAULTS = json.loads(json.dumps(dataclasses.asdict(TrainConfig()), default=str))


def test_a_checkpoint_from_before_the_sampler_rename_resumes_under_the_new_name():
    """Before the rename the weight was p ** (1/T) under ``trainer.sampler_temperature``; it is
    now p ** exponent. A run saved with T = 2 continues with exponent 1/2 = 0.5 (the same
    weights) and is refused with exponent 1 (p ** 1 is not p ** 0.5), naming the new key."""
    now = load("trainer.sampler_exponent=0.5")
    saved = _as_saved(now, **{"trainer.sampler_exponent": None, "trainer.sampler_temperature": 2.0})
    assert resume_problem(saved, _as_saved(now), [], DEFAULTS) is None
    other = _as_saved(load("trainer.sampler_exponent=1.0"))
    problem = resume_problem(saved, other, [], DEFAULTS)
    assert problem is not None and "trainer.sampler_exponent (0.5 -> 1.0)" in problem


def test_the_trigger_is_free_on_resume_for_estimators_that_have_none():
    """Only ``avspo`` reads ``algorithm.trigger``: a release-rule or GRPO run saved when its preset
    said ``policy: never`` continues under a preset that leaves the default ``adaptive``; an
    AVSPO run with the same change is refused (its trigger decides which steps augment)."""
    for preset in ("avspo_release", "grpo"):
        now = load(f"algorithm={preset}")
        saved = _as_saved(now, **{"algorithm.trigger.policy": "never"})
        assert now.algorithm.trigger.policy != "never"
        assert (
            resume_problem(saved, _as_saved(now), [], DEFAULTS, estimator=now.algorithm.estimator)
            is None
        )
    now = load("algorithm=avspo")
    saved = _as_saved(now, **{"algorithm.trigger.policy": "never"})
    problem = resume_problem(saved, _as_saved(now), [], DEFAULTS, estimator="avspo")
    assert problem is not None and "algorithm.trigger.policy" in problem


def test_a_section_another_estimator_reads_still_counts_when_the_estimator_changed():
    """Switching the estimator is refused by its own key, whatever else is free."""
    now = load("algorithm=avspo_release")
    saved = _as_saved(now, **{"algorithm.estimator": "avspo", "algorithm.trigger.policy": "never"})
    problem = resume_problem(saved, _as_saved(now), [], DEFAULTS, estimator="avspo_release")
    assert problem is not None and "algorithm.estimator" in problem
    assert "algorithm.trigger.policy" in problem  # avspo read it: the saved run depended on it
