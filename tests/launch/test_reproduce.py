"""``python -m launch.reproduce``: the experiment file's validation, the aggregate on hand-made
rows (means, t intervals, paired differences, equal-token accuracy), the report section between
its markers, and a real 2-cell grid of 2-step ``launch.train`` runs whose rows are appended once
and skipped on a rerun, with a failing cell recorded with its error and not retried."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from launch.experiments.aggregate import (
    aggregate,
    at_tokens,
    equal_token_difference,
    identical_cells,
)
from launch.experiments.experiment import ExperimentError, cell_id, load_experiment
from launch.experiments.grid import append_row, command, pending, read_rows
from launch.experiments.report import fit_markdown, write_report
from tests.conftest import fast_tiny_overrides
from tests.launch.experiment_rows import evals_row, experiment_file, row

ROOT = Path(__file__).resolve().parents[2]


def test_bad_experiment_files_name_the_key(tmp_path):
    with pytest.raises(ExperimentError, match="seedz: unknown key"):
        load_experiment(str(experiment_file(tmp_path, seedz=[1])))
    with pytest.raises(ExperimentError, match=r"baseline.method: 'ppo' is not a value"):
        load_experiment(str(experiment_file(tmp_path, baseline={"method": "ppo"})))
    with pytest.raises(ExperimentError, match="axes.method.grpo: must be a list"):
        load_experiment(str(experiment_file(tmp_path, axes={"method": {"grpo": "x=1"}})))
    with pytest.raises(ExperimentError, match="no such experiment file"):
        load_experiment("no_such_experiment")


def test_every_cell_of_the_shipped_experiments_composes_and_validates():
    """Each run's overrides compose into a valid config (a typo would fail its run hours in)."""
    from tests.helpers import load

    paths = sorted((ROOT / "conf" / "reproduce").glob("*.yaml"))
    assert {"e1_methods", "e2_early_acr", "e3_ablations"} <= {p.stem for p in paths}
    for path in paths:
        exp = load_experiment(str(path))
        for cell in exp.cells:
            cfg = load(*exp.overrides(cell, exp.seeds[-1]))
            assert cfg.trainer.seed == exp.seeds[-1], (path, cell)


def test_aggregate_means_intervals_and_paired_differences(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path)))
    rows = [
        row(exp, "grpo", 0, 0.40),
        row(exp, "grpo", 1, 0.50),
        row(exp, "grpo", 2, 0.60),
        row(exp, "avspo", 0, 0.45),
        row(exp, "avspo", 1, 0.60),
        row(exp, "avspo", 2, 0.60),
        {**row(exp, "avspo", 2, 0.99), "status": "failed", "error": "boom"},  # the latest row wins
    ]
    grpo, avspo = aggregate(exp, rows)
    # grpo: mean 0.5, sd 0.1, ci = t(2) 4.302653 * 0.1 / sqrt(3) = 0.248414
    g = grpo.figures["final_accuracy"]
    assert (g.n, round(g.mean, 9), round(g.sd, 9), round(g.ci, 5)) == (3, 0.5, 0.1, 0.24841)
    assert grpo.versus == {}  # the baseline itself
    # avspo seed 2 failed last: seeds 0, 1 -> mean 0.525, sd = 0.075 * sqrt(2) = 0.106066,
    # ci = t(1) 12.706205 * 0.106066 / sqrt(2) = 0.952965
    a = avspo.figures["final_accuracy"]
    assert (a.n, round(a.mean, 9), round(a.sd, 6), round(a.ci, 5)) == (2, 0.525, 0.106066, 0.95297)
    assert avspo.failed == [(2, "boom")]
    # paired: seed 0 +0.05, seed 1 +0.10 -> mean 0.075, sd 0.035355, ci 12.706205 * 0.025
    # = 0.317655; t = 0.075 / 0.025 = 3 on 1 dof: p = 1 - 2 atan(3) / pi = 0.204833
    d = avspo.versus["final_accuracy"]
    assert (d.n, round(d.mean, 9), round(d.ci, 5), round(d.p, 5)) == (2, 0.075, 0.31766, 0.20483)
    # greedy accuracy is the primary endpoint here (the experiment names it): its p is Holm's
    # over a family of one comparison, unchanged
    assert avspo.holm_p == d.p


def test_differences_at_equal_rollout_tokens_interpolate_both_curves():
    # the arm generated 200 tokens, the baseline 150: both read at 150 tokens. The arm's curve
    # (0, 0.1) (100, 0.3) (200, 0.9) at 150 is 0.3 + 0.5 * 0.6 = 0.6; the baseline's last point
    # is at 150 (0.5): +0.1. The old reading took the arm's last evaluation within 150 tokens
    # (0.3 at 100 tokens) and called it "at equal tokens".
    arm = {
        "generated_tokens": 200,
        "evals": [
            {"step": 0, "accuracy": 0.1, "generated_tokens": 0},
            {"step": 1, "accuracy": 0.3, "generated_tokens": 100},
            {"step": 2, "accuracy": 0.9, "generated_tokens": 200},
        ],
    }
    base = {
        "generated_tokens": 150,
        "evals": [
            {"step": 0, "accuracy": 0.1, "generated_tokens": 0},
            {"step": 2, "accuracy": 0.5, "generated_tokens": 150},
        ],
    }
    assert round(at_tokens(arm, 150, "accuracy"), 9) == 0.6
    assert round(equal_token_difference(arm, base, "accuracy"), 9) == 0.1
    assert round(equal_token_difference(base, arm, "accuracy"), 9) == -0.1  # symmetric
    assert at_tokens(arm, 250, "accuracy") is None  # beyond the curve: no extrapolation
    assert equal_token_difference(arm, base, "mean_at_k") is None  # no such curve


def test_mean_at_k_is_primary_holm_counts_identical_arms_once_and_shares_the_gain(tmp_path):
    axes = {"method": {m: [f"algorithm={m}"] for m in ("grpo", "a", "b", "c")}}
    exp = load_experiment(str(experiment_file(tmp_path, axes=axes, endpoint="final_mean_at_k")))
    rows = []
    for s in range(3):
        rows.append(evals_row(exp, "grpo", s, 0.30 + 0.01 * s))  # gains 0.10, 0.11, 0.12
        rows.append(evals_row(exp, "a", s, 0.35 + 0.01 * s + 0.001 * s * s))  # +0.05..+0.054
        rows.append(evals_row(exp, "b", s, 0.30 + 0.02 * s))  # 0, +0.01, +0.02
        rows.append(evals_row(exp, "c", s, 0.35 + 0.01 * s + 0.001 * s * s))  # = a exactly
    grpo, a, b, c = aggregate(exp, rows)
    assert c.same_as == "method=a" and a.same_as is None
    # the family is {a, b} (c counted once, as a): Holm multiplies the smaller p by 2, the larger
    # by 1, keeping them monotone
    pa, pb = a.versus["final_mean_at_k"].p, b.versus["final_mean_at_k"].p
    assert pa < pb
    assert (round(a.holm_p, 12), round(b.holm_p, 12)) == (
        round(min(1.0, 2 * pa), 12), round(max(min(1.0, 2 * pa), pb), 12))  # fmt: skip
    assert c.holm_p is None
    # b's paired differences 0, 0.01, 0.02: mean 0.01; grpo's mean gain 0.11: share 9%
    assert round(b.versus["final_mean_at_k"].mean, 9) == 0.01 and round(b.base_gain, 9) == 0.11
    exp.results.parent.mkdir(parents=True)
    exp.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report(exp).read_text()
    # b: 0.30, 0.32, 0.34 -> 0.320, gain 0.120; differences 0, 0.01, 0.02: sd 0.01, ci
    # 4.302653 * 0.01 / sqrt(3) = 0.0248 -> "+1.0 +- 2.5" points, 1 / 11 = 9% of grpo's gain
    assert (
        "| b | 3 | n/a | 0.320 +- 0.050 | 0.120 +- 0.050 | +1.0 +- 2.5 | +9% (-13..+32%) |" in text
    )
    assert "(counted once)" in text and "| method=a |" in text


def test_identical_cells_across_experiments(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path)))
    mine = {("method=grpo", s): evals_row(exp, "grpo", s, 0.3 + 0.01 * s) for s in range(2)}
    mine[("method=avspo", 0)] = evals_row(exp, "avspo", 0, 0.4)
    other = [{**r, "cell_id": "method=grpo,level=L3"} for r in mine.values()][:2]
    got = identical_cells(exp, mine, {"e1": other})
    assert got == {"method=grpo": "e1 method=grpo,level=L3"}
    # one seed that differs: not identical
    other[1] = {**other[1], "acr_raw": 0.5}
    assert identical_cells(exp, mine, {"e1": other}) == {}


def test_a_fit_reports_what_the_predictor_adds_to_the_starting_accuracy(tmp_path):
    """final = start + 0.1 * x (x not a function of start): x's own line explains little, but
    given the start it explains the rest (added R^2 = 1 - R^2 of the start alone)."""
    exp = load_experiment(str(experiment_file(tmp_path, baseline={})))
    xs, starts = [0.1, 0.5, 0.2, 0.9, 0.4, 0.7], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    rows = [
        row(exp, "grpo", s, st + 0.1 * x, early_acr=x, start_accuracy=st)
        for s, (x, st) in enumerate(zip(xs, starts, strict=True))
    ]
    exp.seeds = list(range(6))
    text = fit_markdown(exp, rows, {"x": "early_acr", "y": "final_accuracy"}, paper=False)[0]
    assert "Given the starting accuracy (R^2 " in text and "(to 1.000;" in text
    assert "coefficient +10.0 points per unit of early_acr" in text


def test_pending_skips_rows_and_failed_runs_unless_retried(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path, seeds=[0, 1])))
    rows = [
        row(exp, "grpo", 0, 0.4),
        {**row(exp, "avspo", 0, 0.0), "status": "failed", "error": "x"},
    ]
    left = [(cell_id(c), s) for c, s in pending(exp, rows, retry_failed=False)]
    # seed-major: seed 0's cells first (both have rows), then seed 1's
    assert left == [("method=grpo", 1), ("method=avspo", 1)]
    again = [(cell_id(c), s) for c, s in pending(exp, rows, retry_failed=True)]
    assert again == [("method=avspo", 0), ("method=grpo", 1), ("method=avspo", 1)]
    # the grpo cell edited (another lr): its row is another experiment's, so it runs again
    edited = load_experiment(
        str(experiment_file(tmp_path, seeds=[0, 1], axes={"method": {
            "grpo": ["algorithm=grpo", "learner.lr=3e-5"], "avspo": ["algorithm=avspo"]}}))
    )  # fmt: skip
    assert [(cell_id(c), s) for c, s in pending(edited, rows, retry_failed=False)][0] == (
        "method=grpo",
        0,
    )


def test_the_report_section_is_replaced_between_its_markers(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path)))
    exp.report.write_text("# Results\n\nhand-written before\n")
    exp.results.parent.mkdir(parents=True)
    rows = [row(exp, "grpo", s, 0.4 + 0.1 * s) for s in range(3)] + [row(exp, "avspo", 0, 0.5)]
    exp.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(exp)
    text = exp.report.read_text()
    assert text.count("<!-- reproduce:demo begin -->") == 1
    # greedy accuracy is the experiment's primary endpoint
    assert "| grpo | 3 | n/a | 0.500 +- 0.248 | n/a | (baseline) |" in text
    # avspo has one seed (0.5) paired with grpo's seed 0 (0.4): +10.0 points, no interval
    assert "| avspo | 1 | n/a | 0.500 | n/a | +10.0 |" in text
    assert (exp.results.parent / "demo_final_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    (exp.report).write_text(text + "\nhand-written after\n")
    write_report(exp)
    again = exp.report.read_text()
    assert again.count("reproduce:demo begin") == 1
    assert "hand-written before" in again and "hand-written after" in again


@pytest.mark.slow
def test_a_two_cell_grid_appends_rows_and_a_rerun_skips_them(tmp_path, tiny_model_dir, joined_ray):
    """avspo, 2 steps (seed 0), and a cell whose override is bad: 2 rows; the rerun runs
    nothing; the report has the table and each cell's command. (One real run: the aggregate over
    several cells is tested on hand-made rows above.)"""
    base = [
        "rollout=hf",
        *fast_tiny_overrides(tiny_model_dir),
        "trainer.total_steps=2",
        "trainer.prompts_per_step=8",
        "trainer.eval_every=2",
        "trainer.eval_pass_k=2",
        "logger.report=false",
        "learner.num_ranks=1",  # the harness is tested, not the learner
        *joined_ray,
    ]
    axes = {
        "method": {
            "avspo": ["algorithm=avspo"],
            "broken": ["trainer.total_steps=-3"],
        }
    }
    path = experiment_file(tmp_path, seeds=[0], base=base, axes=axes, baseline={})

    def reproduce():
        return subprocess.run(
            [sys.executable, "-m", "launch.reproduce", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1200,
        )

    out = reproduce()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    exp = load_experiment(str(path))
    rows = read_rows(exp.results)
    assert [(r["cell_id"], r["status"]) for r in rows] == [
        ("method=avspo", "ok"),
        ("method=broken", "failed"),
    ]
    assert "trainer.total_steps" in rows[1]["error"]
    for r in rows[:1]:  # the ok row
        assert r["steps"] == 2 and r["k"] == 2
        assert [e["step"] for e in r["evals"]] == [0, 2]
        assert 0.0 <= r["final_accuracy"] <= 1.0 and math.isfinite(r["gain"])
        # 8 prompts x 8 samples x >= 1 token, over 2 steps
        assert r["generated_tokens"] >= 128
        assert 0.0 <= r["grad_tokens"] <= r["generated_tokens"]
        assert r["early_acr"] is not None and r["acr100"] is None  # 2 < 100 steps
        assert r["command"].endswith("algorithm=" + r["cell"]["method"] + " trainer.seed=0")
    # each row names the weights it started from; the broken config never got to a model
    from launch.models.bootstrap import weights_id

    assert rows[0]["model"] == weights_id(tiny_model_dir)
    assert rows[1]["model"] is None

    again = reproduce()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 of 2 runs have rows from model weights " in again.stdout
    assert any(line.endswith("; 0 to run") for line in again.stdout.splitlines())
    assert len(read_rows(exp.results)) == 2
    report = exp.report.read_text()
    assert "- method=avspo: `python -m launch.train rollout=hf" in report
    assert "method=broken seed 0: exit status" in report

    # --refresh: a figure a row lacks (rows older than the figure) comes back from its run dir
    before = read_rows(exp.results)
    assert all(0.0 <= r["early_acr_low"] <= r["early_acr"] for r in before[:1])
    exp.results.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "early_acr_low"}) + "\n"
                for r in before)
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "launch.reproduce", str(path), "--refresh"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 rows recomputed" in out.stdout  # the ok row; the failed one has no run
    assert read_rows(exp.results) == [
        before[0], {k: v for k, v in before[1].items() if k != "early_acr_low"}
    ]  # fmt: skip


def test_commit_rows_commits_the_results_file_alone(tmp_path):
    """``--commit``: after each run the results file is committed by itself; what else was
    staged stays staged (the results folder is a git repository here, made by the test)."""
    from launch.experiments.grid import commit_rows, git_rev

    exp = load_experiment(str(experiment_file(tmp_path)))
    repo = exp.results.parent
    repo.mkdir(parents=True)

    def git(*argv):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    git("init", "-q")
    git("config", "user.name", "t")
    git("config", "user.email", "t@t")
    exp.results.write_text("")
    git("add", exp.results.name)
    git("commit", "-q", "-m", "start")
    rev = git("rev-parse", "--short", "HEAD").strip()
    exp.results.write_text('{"row": 0}\n')  # a grid appending: not a dirty tree for its rows
    assert git_rev(ignore=exp.results, repo=repo) == rev
    assert git_rev(repo=repo) == rev + "+dirty"
    (repo / "other.txt").write_text("work in progress\n")
    git("add", "other.txt")
    exp.results.write_text('{"row": 1}\n')
    commit_rows(exp, "results: demo")
    assert git("log", "--format=%s") == "results: demo\nstart\n"
    assert git("show", "--name-only", "--format=").split() == ["demo.jsonl"]
    assert git("diff", "--cached", "--name-only").split() == ["other.txt"]


def test_rows_written_with_sorted_keys_still_match_a_two_axis_grid(tmp_path):
    """append_row sorts keys: a cell {"setting", "method"} comes back as {"method", "setting"};
    it is still that cell (once every row of a real grid was treated as pending)."""
    axes = {"setting": {"a": [], "b": ["task.difficulty=4"]}, "method": {"grpo": ["x=1"]}}
    exp = load_experiment(str(experiment_file(tmp_path, axes=axes, baseline={}, seeds=[0])))
    cell = {"setting": "b", "method": "grpo"}
    r = {"cell_id": cell_id(cell), "cell": cell, "seed": 0, "status": "ok"}
    append_row(exp.results, {**r, "command": command(exp, cell, 0), "final_accuracy": 0.5})
    rows = read_rows(exp.results)
    assert list(rows[0]["cell"]) == ["method", "setting"]
    assert [(cell_id(c), s) for c, s in pending(exp, rows, False)] == [("setting=a,method=grpo", 0)]
    assert aggregate(exp, rows)[1].figures["final_accuracy"].mean == 0.5


def test_rows_of_another_model_neither_count_as_done_nor_mix_into_the_aggregate(tmp_path):
    """The tiny model's warm start depends on the CPU (docs/NOTES.md): a grid continued on a
    machine that builds other weights must not skip cells done with the old ones, and the
    aggregate keeps each model's rows apart (one block of tables per model)."""
    exp = load_experiment(str(experiment_file(tmp_path, seeds=[0, 1])))
    rows = [
        row(exp, "grpo", 0, 0.20, model="aaaa0000", host="AMD"),
        row(exp, "avspo", 0, 0.30, model="aaaa0000", host="AMD"),
        row(exp, "grpo", 0, 0.40, model="bbbb1111", host="Intel"),
        row(exp, "grpo", 1, 0.50, model="bbbb1111", host="Intel"),
    ]
    here = {"method=grpo": "bbbb1111", "method=avspo": "bbbb1111"}
    left = [(cell_id(c), s) for c, s in pending(exp, rows, False, models=here)]
    # only the Intel rows count here: avspo has none on this model, grpo has both seeds
    assert left == [("method=avspo", 0), ("method=avspo", 1)]
    amd = {c: "aaaa0000" for c in here}
    assert [(cell_id(c), s) for c, s in pending(exp, rows, False, models=amd)] == [
        ("method=grpo", 1),
        ("method=avspo", 1),
    ]
    grpo_b, _ = aggregate(exp, rows, model="bbbb1111")
    assert grpo_b.figures["final_accuracy"].mean == 0.45  # (0.40 + 0.50) / 2, AMD row left out
    grpo_a, avspo_a = aggregate(exp, rows, model="aaaa0000")
    assert grpo_a.figures["final_accuracy"].mean == 0.20
    assert round(avspo_a.versus["final_accuracy"].mean, 9) == 0.1  # 0.30 - 0.20 on seed 0
    for r in rows:
        append_row(exp.results, r)
    # later Intel runs of both AMD (cell, seed)s do not hide the AMD rows from the report
    append_row(exp.results, row(exp, "grpo", 0, 0.42, model="bbbb1111", host="Intel"))
    append_row(exp.results, row(exp, "avspo", 0, 0.33, model="bbbb1111", host="Intel"))
    report = write_report(exp).read_text()
    # one block per model, the one with more rows first, each naming its hosts
    a, b = report.index("model weights aaaa0000"), report.index("model weights bbbb1111")
    assert b < a
    assert "model weights bbbb1111 (Intel): 3 of 4 runs" in report
    assert "model weights aaaa0000 (AMD): 2 of 4 runs" in report


def test_weights_id_names_the_weights_with_or_without_a_manifest(tmp_path, tiny_model_dir):
    import hashlib
    import shutil

    from launch.models.bootstrap import weights_id

    blob = (Path(tiny_model_dir) / "model.safetensors").read_bytes()
    want = hashlib.sha256(blob).hexdigest()[:8]  # one weights file: its own hash's prefix
    assert weights_id(tiny_model_dir) == want
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(tiny_model_dir) / "model.safetensors", bare)  # no build.json: hashed
    assert weights_id(bare) == want
    (bare / "model-00002.safetensors").write_bytes(b"x")
    assert weights_id(bare) not in (want, None)  # two files: a hash over both
    with pytest.raises(ValueError, match="no weights"):
        weights_id(tmp_path / "res")


def test_several_fits_each_get_their_line_in_the_report(tmp_path):
    """E2 fits final accuracy on early ACR (the paper's predictor) and on its all-incorrect
    stratum: ``fit`` takes a list. Points on exact lines give exact coefficients."""
    fits = [
        {"x": "early_acr", "y": "final_accuracy"},
        {"x": "early_acr_low", "y": "final_accuracy"},
    ]
    exp = load_experiment(str(experiment_file(tmp_path, fit=fits)))
    assert [f["x"] for f in exp.fits] == ["early_acr", "early_acr_low"]
    # accuracy = 0.5 - 0.3 x early_acr (in %: 50 - 30 x): 0.47, 0.35, 0.23 at x = 0.1, 0.5, 0.9;
    # the same accuracies are 0.6 - 0.5 x early_acr_low at xl = (0.6 - acc) / 0.5 = 0.26, 0.5, 0.74
    pts = [(0, "grpo", 0.1, 0.26), (1, "grpo", 0.5, 0.5), (2, "avspo", 0.9, 0.74)]
    for seed, method, x, xl in pts:
        r = row(exp, method, seed, 0.5 - 0.3 * x, early_acr=x, early_acr_low=xl)
        assert abs(r["final_accuracy"] - (0.6 - 0.5 * xl)) < 1e-12
        append_row(exp.results, r)
    report = write_report(exp).read_text()
    assert "final_accuracy (%) = 50.0 - 30.0 x early_acr, R^2 = 1.000" in report
    assert "final_accuracy (%) = 60.0 - 50.0 x early_acr_low, R^2 = 1.000" in report
    assert (exp.results.parent / "demo_fit.png").exists()
    assert (exp.results.parent / "demo_fit_final_accuracy_vs_early_acr_low.png").exists()
    with pytest.raises(ExperimentError, match=r"fit\[1\]: must be \{x: <row key>"):
        load_experiment(str(experiment_file(tmp_path, fit=[fits[0], {"x": "early_acr"}])))


def test_cell_models_names_bad_configs_none_but_stops_on_a_failed_build(tmp_path, monkeypatch):
    """A cell whose config does not compose fails the same way on any machine, so it has no
    model (``None``); a model build that fails (a full disk, a broken cache) is this machine's
    problem and must stop the grid, not be recorded as a model-less row shown in every block."""
    import launch.models.bootstrap
    from launch.experiments.grid import cell_models

    spec = {"bad": ["algorithm=no_such_preset"], "grpo": ["algorithm=grpo"]}
    exp = load_experiment(str(experiment_file(tmp_path, axes={"method": spec})))
    built = []

    def fake_build(cfg, log=print):
        built.append(cfg.source)
        folder = tmp_path / "model"
        folder.mkdir(exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"w")
        return str(folder)

    monkeypatch.setattr(launch.models.bootstrap, "ensure_model", fake_build)
    models = cell_models(exp, log=lambda *a: None)
    assert models["method=bad"] is None and models["method=grpo"] is not None
    assert len(built) == 1  # the bad cell never got to a model

    def full_disk(cfg, log=print):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(launch.models.bootstrap, "ensure_model", full_disk)
    with pytest.raises(OSError, match="No space"):
        cell_models(exp, log=lambda *a: None)


def test_a_cell_whose_model_folder_is_missing_stops_the_grid_with_the_key(
    tmp_path, capsys, monkeypatch
):
    """The paper's model preset pointed at a folder this machine lacks: one message naming
    model.path, exit 2, before any run starts and without a row."""
    from launch.experiments.reproduce import main

    missing = tmp_path / "no_such_model"
    monkeypatch.setenv("AVSPO_QWEN_MATH_1_5B", str(missing))
    path = experiment_file(tmp_path, base=["rollout=hf", "model=qwen2.5-math-1.5b"])
    assert main([str(path), "--list"]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and str(missing) in err
    assert main([str(path), "--max-runs", "1"]) == 2
    assert not (tmp_path / "res" / "demo.jsonl").exists()


def test_figures_of_ten_or_more_get_one_decimal_fractions_three():
    """Wall seconds of 69.7 read '69.7 +- 10.5', not '69.700 +- 10.460'; accuracies keep 3."""
    from diagnostics.stats import estimate
    from launch.experiments.report import _fmt

    assert _fmt(estimate([59.24, 80.16]), 1.0).startswith("69.7 +- ")  # mean (59.24+80.16)/2
    assert _fmt(estimate([0.4, 0.5, 0.6]), 1.0) == "0.500 +- 0.248"  # t975(2) * 0.1 / sqrt(3)
    assert _fmt(estimate([1500.0]), 1e-3) == "1.5"  # tokens shown in thousands, one seed
