"""Run report (diagnostics/report.py): the line fit against hand-computed numbers, the summary of a
small synthetic run, last-row-wins for resumed runs, clear errors for bad data, and a report that
degrades (skipped plots with a note) when metrics are missing."""

from __future__ import annotations

import json
import math
import random
import re

import numpy as np
import pytest

from diagnostics.report import (
    RunDataError,
    load_run,
    summarize,
    write_cross_run,
    write_report,
)
from diagnostics.stats import fit_line

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path, rows, config=None, prompts=None):
    """A run directory: metrics.jsonl from ``rows`` (dicts or raw strings), optional extras."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if config is not None:
        (path / "config.yaml").write_text(config)
    if prompts is not None:
        (path / "prompt_history.json").write_text(json.dumps(prompts))
    return path


# --- fit_line --------------------------------------------------------------------------------


def test_fit_line_exact_points():
    # (0,1), (1,3), (2,5) lie on y = 1 + 2x: intercept 1, slope 2, R^2 1.
    assert fit_line([0, 1, 2], [1, 3, 5]) == (1.0, 2.0, 1.0)


def test_fit_line_noisy_hand_computed():
    # x = 1, 2, 3, 4; y = 2, 3, 5, 4. mean x = 2.5, mean y = 3.5.
    # dx = -1.5, -0.5, 0.5, 1.5; dy = -1.5, -0.5, 1.5, 0.5.
    # S_xx = 2.25 + 0.25 + 0.25 + 2.25 = 5; S_yy = 2.25 + 0.25 + 2.25 + 0.25 = 5;
    # S_xy = 2.25 + 0.25 + 0.75 + 0.75 = 4.
    # slope = 4 / 5 = 0.8; intercept = 3.5 - 0.8 * 2.5 = 1.5; R^2 = 4^2 / (5 * 5) = 0.64.
    a, b, r2 = fit_line([1, 2, 3, 4], [2, 3, 5, 4])
    assert a == pytest.approx(1.5) and b == pytest.approx(0.8) and r2 == pytest.approx(0.64)
    # The same R^2 as 1 - SS_res / SS_tot: residuals 2 - 2.3, 3 - 3.1, 5 - 3.9, 4 - 4.7
    # = -0.3, -0.1, 1.1, -0.7; SS_res = 0.09 + 0.01 + 1.21 + 0.49 = 1.8; 1 - 1.8 / 5 = 0.64.


def test_fit_line_matches_numpy_polyfit_on_random_points():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(2, 12)
        xs = [rng.uniform(0, 1) for _ in range(n)]
        ys = [rng.uniform(0, 100) for _ in range(n)]
        a, b, r2 = fit_line(xs, ys)
        slope, intercept = np.polyfit(xs, ys, 1)
        resid = np.asarray(ys) - (intercept + slope * np.asarray(xs))
        r2_ref = 1 - (resid**2).sum() / ((np.asarray(ys) - np.mean(ys)) ** 2).sum()
        assert (a, b, r2) == pytest.approx((intercept, slope, r2_ref), rel=1e-9, abs=1e-9)


def test_fit_line_degenerate_inputs():
    with pytest.raises(ValueError, match="all x values equal"):
        fit_line([0.3, 0.3, 0.3], [10, 20, 30])
    with pytest.raises(ValueError, match="at least|>= 2"):
        fit_line([0.3], [10])
    with pytest.raises(ValueError):
        fit_line([0, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        fit_line([0, float("nan")], [1, 2])
    a, b, r2 = fit_line([0, 1, 2], [7, 7, 7])  # flat y: the line is y = 7, R^2 undefined
    assert (a, b) == (7.0, 0.0) and math.isnan(r2)


# --- loading and summary ---------------------------------------------------------------------

T = {"timing_s/generate": 2.0, "timing_s/verify": 0.5, "timing_s/learner": 1.0}
ROWS = [
    {"step": 0, "eval/accuracy": 0.2},
    {"step": 1, "reward/mean": 0.1, "acr/raw": 0.5, "acr/high": 0.25, "acr/low": 0.25,
     "acr/effective": 0.25, "acr/wasted_token_frac": 0.4, "avspo/triggered": 1.0,
     "avspo/augmented_groups": 2.0, "avspo/tau_adapt": 0.4, "acr/early_warning": 0.0,
     "timing_s/step": 4.0, **T},
    {"step": 2, "reward/mean": 0.3, "acr/raw": 0.75, "acr/high": 0.5, "acr/low": 0.25,
     "acr/effective": 0.5, "acr/wasted_token_frac": 0.6, "avspo/triggered": 0.0,
     "avspo/augmented_groups": 0.0, "avspo/tau_adapt": 0.45, "acr/early_warning": 1.0,
     "timing_s/step": 4.0, **T, "eval/accuracy": 0.5},
    {"step": 3, "reward/mean": 0.2, "acr/raw": 1.0, "acr/high": 0.0, "acr/low": 1.0,
     "acr/effective": None, "acr/wasted_token_frac": 0.8, "avspo/triggered": 1.0,
     "avspo/augmented_groups": 0.0, "avspo/tau_adapt": 0.5, "acr/early_warning": 1.0,
     "timing_s/step": 4.0, **T, "eval/accuracy": 0.4},
]  # fmt: skip
CONFIG = "algorithm:\n  name: avspo\ntask:\n  name: arithmetic\ntrainer:\n  seed: 3\n"


def test_summarize_hand_computed(tmp_path):
    s = summarize(load_run(write_run(tmp_path / "run", ROWS, CONFIG)))
    assert (s["algorithm"], s["task"], s["seed"], s["model"]) == ("avspo", "arithmetic", 3, None)
    # accuracy: 0.2 at step 0; evaluated 0.5 at step 2 and 0.4 at step 3 -> final 0.4, best 0.5.
    assert s["start_accuracy"] == 0.2
    assert (s["final_accuracy"], s["final_accuracy_step"]) == (0.4, 3)
    assert (s["best_accuracy"], s["best_accuracy_step"]) == (0.5, 2)
    # no acr/acr100 logged -> mean acr/raw over steps 1..100 = (0.5 + 0.75 + 1.0) / 3 = 0.75.
    assert s["acr100"] == pytest.approx(0.75) and "mean acr/raw" in s["acr100_source"]
    assert s["mean_acr_raw"] == pytest.approx(0.75)
    assert s["mean_acr_high"] == pytest.approx(0.25)  # (0.25 + 0.5 + 0) / 3
    assert s["mean_acr_low"] == pytest.approx(0.5)  # (0.25 + 0.25 + 1) / 3
    assert s["mean_acr_effective"] == pytest.approx(0.375)  # null at step 3: (0.25 + 0.5) / 2
    assert s["mean_acr_wasted_token_frac"] == pytest.approx(0.6)  # (0.4 + 0.6 + 0.8) / 3
    assert s["mean_reward"] == pytest.approx(0.2)  # (0.1 + 0.3 + 0.2) / 3
    # the trigger rate counts augmentations: only step 1 augmented a group (2 of them); step 3
    # decided to trigger (ACR over tau_adapt) but had no group of the stratum to augment
    assert s["trigger_rate"] == pytest.approx(1 / 3) and s["triggers"] == 1
    assert s["decision_rate"] == pytest.approx(2 / 3) and s["decisions"] == 2  # steps 1 and 3
    assert s["final_tau_adapt"] == 0.5
    assert s["early_warning_step"] == 2
    # step time 3 * 4 s = 12 s; generate 3 * 2 = 6 -> 0.5, verify 1.5 -> 0.125, learner 3 -> 0.25,
    # weight_sync not logged; other = 1 - 0.875 = 0.125. Mean step 12 / 3 = 4 s.
    assert s["time_per_step_s"] == pytest.approx(4.0)
    assert s["timing_share"] == pytest.approx(
        {"generate": 0.5, "verify": 0.125, "learner": 0.25, "other": 0.125}
    )
    assert s["mean_verifier_error_frac"] is None  # not logged


def test_trigger_rate_of_a_run_logged_before_augmented_groups_had_its_name(tmp_path):
    # runs before the rename logged avspo/groups_augmented: step 2 augmented, step 1 only decided
    rows = [
        {"step": 1, "avspo/triggered": 1.0, "avspo/groups_augmented": 0.0},
        {"step": 2, "avspo/triggered": 1.0, "avspo/groups_augmented": 3.0},
    ]
    s = summarize(load_run(write_run(tmp_path / "run", rows)))
    assert (s["trigger_rate"], s["triggers"], s["decision_rate"]) == (0.5, 1, 1.0)
    # a log without either count (another trainer's) has no trigger rate to show
    s = summarize(load_run(write_run(tmp_path / "other", [{"step": 1, "avspo/triggered": 1.0}])))
    assert s["trigger_rate"] is None and s["triggers"] == 0 and s["decision_rate"] == 1.0


def test_the_summary_counts_the_prompts_dropped_as_over_the_context(tmp_path):
    from pathlib import Path

    from diagnostics.report import write_report

    rows = [{"step": s, "acr/raw": 0.5, "data/over_long_prompts": 3.0} for s in (1, 2)]
    run_dir = write_run(tmp_path / "run", rows)
    assert summarize(load_run(run_dir))["over_long_prompts"] == 3
    report = Path(write_report(run_dir)).read_text()
    assert "| training prompts dropped as over the context | 3 |" in report
    old = summarize(load_run(write_run(tmp_path / "old", [{"step": 1, "acr/raw": 0.5}])))
    assert old["over_long_prompts"] is None  # a run logged before the count: not shown as 0


def test_acr100_is_the_last_logged_value(tmp_path):
    rows = [
        {"step": 1, "acr/raw": 0.9, "acr/acr100": 0.9},
        {"step": 2, "acr/raw": 0.1, "acr/acr100": 0.5},
        {"step": 3, "acr/raw": 0.1, "acr/acr100": None},  # non-finite, written as null
    ]
    s = summarize(load_run(write_run(tmp_path / "run", rows)))
    assert s["acr100"] == 0.5 and s["acr100_source"] == "logged acr/acr100"


def test_acr100_fallback_uses_only_the_first_early_steps(tmp_path):
    # acr.early_steps = 2 in the config: mean of acr/raw at steps 1 and 2 = (0.2 + 0.4) / 2.
    rows = [{"step": t, "acr/raw": v} for t, v in [(1, 0.2), (2, 0.4), (3, 1.0)]]
    run = load_run(write_run(tmp_path / "run", rows, "acr:\n  early_steps: 2\n"))
    assert summarize(run)["acr100"] == pytest.approx(0.3)


def test_repeated_step_last_row_wins(tmp_path):
    rows = [
        {"step": 0, "eval/accuracy": 0.1},
        {"step": 1, "acr/raw": 1.0, "reward/mean": 0.0},
        {"step": 2, "acr/raw": 1.0},
        {"step": 1, "acr/raw": 0.5},  # resumed from step 0: steps 1 and 2 again
        {"step": 2, "acr/raw": 0.25, "eval/accuracy": 0.3},
    ]
    run = load_run(write_run(tmp_path / "run", rows))
    assert list(run.rows) == [0, 1, 2]
    assert run.rows[1] == {"acr/raw": 0.5}  # the whole row is replaced, not merged
    s = summarize(run)
    assert s["mean_acr_raw"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2
    assert s["mean_reward"] is None and s["final_accuracy"] == 0.3


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"step": 1, "acr/raw": 0.5', "not a valid JSON line"),
        ('[1, 2]', "expected a JSON object"),
        ('{"acr/raw": 0.5}', "'step' must be an integer"),
        ('{"step": -1}', "'step' must be an integer"),
        ('{"step": 1, "acr/raw": "high"}', "'acr/raw' must be a number or null"),
    ],
)  # fmt: skip
def test_bad_line_names_file_and_line(tmp_path, bad, message):
    # Line 1 is fine, line 2 is blank (skipped but counted), line 3 is bad.
    run_dir = write_run(tmp_path / "run", ['{"step": 0, "eval/accuracy": 0.1}', "", bad])
    path = run_dir / "metrics.jsonl"
    with pytest.raises(RunDataError, match=re.escape(f"{path}:3: ") + re.escape(message)):
        load_run(run_dir)


def test_non_finite_json_literals_are_dropped(tmp_path):
    run = load_run(write_run(tmp_path / "run", ['{"step": 1, "acr/raw": NaN, "x": Infinity}']))
    assert run.rows == {1: {}}


def test_missing_and_empty_inputs_name_the_path(tmp_path):
    with pytest.raises(RunDataError, match=re.escape(f"{tmp_path / 'nope'}: no such directory")):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDataError, match=re.escape(str(tmp_path / "empty" / "metrics.jsonl"))):
        load_run(tmp_path / "empty")
    (tmp_path / "empty" / "metrics.jsonl").write_text("\n\n")
    with pytest.raises(RunDataError, match="no metric rows"):
        load_run(tmp_path / "empty")
    bad_cfg = write_run(tmp_path / "cfg", ROWS[:1], config="a: [1, 2\n")
    with pytest.raises(RunDataError, match=re.escape(str(bad_cfg / "config.yaml"))):
        load_run(bad_cfg)
    bad_hist = write_run(tmp_path / "hist", ROWS[:1], prompts={"prompts": {"p": [1, "x", 0]}})
    with pytest.raises(RunDataError, match="prompt 'p'"):
        load_run(bad_hist)


def test_prompt_summary_derived_when_absent(tmp_path):
    # p1 seen 3x, all correct 3x -> always solved; p2 all wrong 2 of 2 -> never; p3 mixed.
    prompts = {"prompts": {"p1": [3, 3, 0], "p2": [2, 0, 2], "p3": [4, 1, 1]}}
    run = load_run(write_run(tmp_path / "run", ROWS[:1], prompts=prompts))
    assert run.prompt_history["summary"] == {
        "prompts_seen": 3,
        "always_solved": 1,
        "never_solved": 1,
    }


# --- reports ---------------------------------------------------------------------------------


def test_report_with_all_metrics(tmp_path):
    prompts = {
        "summary": {"prompts_seen": 3, "always_solved": 1, "never_solved": 1},
        "prompts": {"p1": [3, 3, 0], "p2": [2, 0, 2], "p3": [4, 1, 1]},
    }
    run_dir = write_run(tmp_path / "run", ROWS, CONFIG, prompts)
    path = write_report(run_dir)
    text = path.read_text()
    assert path == run_dir / "report.md"
    for name in ("reward_accuracy.png", "acr.png", "avspo.png", "wasted_tokens.png"):
        assert f"]({name})" in text  # a relative link
        assert (run_dir / name).read_bytes()[:8] == PNG_MAGIC
    assert "Skipped" not in text
    assert "51.4 - 29.6 x ACR100" in text and "0.617" in text
    # the paper's line at this run's ACR100 = 0.75: 51.4 - 29.6 * 0.75 = 29.2 (%)
    assert "its line gives 29.2%" in text
    assert "| 0.400 (40.0%) |" in text  # final accuracy as fraction and percent
    assert "| AVSPO trigger rate: steps with an augmented group | 0.333 (1 steps) |" in text
    assert "| AVSPO trigger decisions (ACR_t > tau_adapt) | 0.667 (2 steps) |" in text
    assert "| 3 | 1 | 1 |" in text and "`p2` (2 visits)" in text


def test_report_without_avspo_keys_skips_that_plot_with_a_note(tmp_path):
    rows = [{k: v for k, v in r.items() if not k.startswith("avspo/")} for r in ROWS]
    del rows[2]["acr/high"]  # a stratum missing on one step: the strata are drawn without it
    run_dir = write_run(tmp_path / "grpo", rows)
    (run_dir / "avspo.png").write_bytes(PNG_MAGIC)  # left over from an earlier report
    text = write_report(run_dir).read_text()
    assert "](avspo.png)" not in text and "_Skipped: no AVSPO activity" in text
    assert not (run_dir / "avspo.png").exists()
    assert (run_dir / "acr.png").read_bytes()[:8] == PNG_MAGIC
    assert "no config.yaml" in text and "No prompt_history.json" in text


def test_report_of_a_run_with_only_step_0(tmp_path):
    run_dir = write_run(tmp_path / "run", [{"step": 0, "eval/accuracy": 0.3}])
    text = write_report(run_dir).read_text()
    assert text.count("_Skipped:") == 3  # acr, avspo, wasted tokens; accuracy is still plotted
    assert "](reward_accuracy.png)" in text
    assert "final held-out accuracy (step None) | n/a" in text


def test_cross_run_needs_two_runs_and_distinct_acr100(tmp_path):
    one = write_run(tmp_path / "a", ROWS)
    text = write_cross_run([one], tmp_path / "out").read_text()
    assert "No fit" in text and "got 1" in text
    assert (tmp_path / "out" / "acr100_vs_accuracy.png").read_bytes()[:8] == PNG_MAGIC
    two = write_run(tmp_path / "b", ROWS)  # the same ACR100 (0.75) as run a
    text = write_cross_run([one, two], tmp_path / "out").read_text()
    assert "No fit: all x values equal 0.75" in text and "R^2" in text


def test_cross_run_lists_runs_without_a_final_accuracy(tmp_path):
    a = write_run(tmp_path / "a", ROWS)
    b = write_run(tmp_path / "b", [{"step": 0, "eval/accuracy": 0.3}])
    text = write_cross_run([a, b], tmp_path).read_text()
    assert "Not in the fit: b (no ACR100)" in text and "got 1" in text


# --- ACR100 coverage -------------------------------------------------------------------------


def acr_rows(steps: int, *, log_steps: bool = True, final: float = 0.4) -> list[dict]:
    """``steps`` training steps with acr/raw 0.5 and the monitor's acr/acr100 (and, if
    ``log_steps``, acr/acr100_steps = min(t, 100)); an evaluation at step 0 and at the end."""
    rows = [{"step": 0, "eval/accuracy": 0.2}]
    for t in range(1, steps + 1):
        row = {"step": t, "acr/raw": 0.5, "acr/acr100": 0.5}
        if log_steps:
            row["acr/acr100_steps"] = min(t, 100)
        rows.append(row)
    rows[-1]["eval/accuracy"] = final
    return rows


@pytest.mark.parametrize("log_steps", [True, False])
def test_acr100_of_a_short_run_says_how_many_steps_it_covers(tmp_path, log_steps):
    # 40 steps: ACR100 averages 40 steps (logged acr/acr100_steps, else counted acr/raw steps).
    run_dir = write_run(tmp_path / "short", acr_rows(40, log_steps=log_steps))
    s = summarize(load_run(run_dir))
    assert s["acr100_steps"] == 40 and s["acr100_window"] == 100
    text = write_report(run_dir).read_text()
    assert "| ACR100 | 0.500 (over 40 steps, run shorter than 100;" in text
    assert "At this run's ACR100 = 0.500 (over 40 steps, run shorter than 100)" in text


@pytest.mark.parametrize("log_steps", [True, False])
def test_acr100_of_a_long_run_is_not_flagged(tmp_path, log_steps):
    # 120 steps: ACR100 covers the full 100 (the logged count stops at 100; counting stops too).
    run_dir = write_run(tmp_path / "long", acr_rows(120, log_steps=log_steps))
    s = summarize(load_run(run_dir))
    assert s["acr100_steps"] == 100
    text = write_report(run_dir).read_text()
    assert "| ACR100 | 0.500 (over 100 steps;" in text
    assert "shorter than" not in text and "40 steps" not in text


def test_acr100_coverage_uses_the_last_logged_count(tmp_path):
    # a resumed run whose monitor counted 7 steps (acr/raw at 3 steps here): the log wins.
    rows = [{"step": t, "acr/raw": 0.5, "acr/acr100_steps": c} for t, c in [(1, 5), (2, 6), (3, 7)]]
    assert summarize(load_run(write_run(tmp_path / "run", rows)))["acr100_steps"] == 7
    no_acr = summarize(load_run(write_run(tmp_path / "none", [{"step": 0, "eval/accuracy": 0.1}])))
    assert no_acr["acr100"] is None and no_acr["acr100_steps"] is None


def test_cross_run_table_shows_acr100_steps_and_flags_short_runs(tmp_path):
    short = write_run(tmp_path / "short", acr_rows(40, final=0.4))
    long = write_run(tmp_path / "long", acr_rows(120, final=0.3))
    text = write_cross_run([short, long], tmp_path / "out").read_text()
    assert "| ACR100 | ACR100 steps |" in text
    assert re.search(r"\| short \| n/a \| 0\.500 \| 40 \|", text)
    assert re.search(r"\| long \| n/a \| 0\.500 \| 100 \|", text)
    assert "ACR100 covers fewer than 100 steps: short (40 steps)." in text
    assert "long (" not in text


def test_analyze_line_flags_a_short_acr100(tmp_path):
    from launch.analyze import one_line

    short = summarize(load_run(write_run(tmp_path / "short", acr_rows(40))))
    long = summarize(load_run(write_run(tmp_path / "long", acr_rows(120))))
    assert "ACR100 0.500 (over 40 steps, run shorter than 100)," in one_line(short)
    assert "ACR100 0.500, " in one_line(long)
