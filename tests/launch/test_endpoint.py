"""The harness's primary endpoint (issue 48): a row reads the ``eval/mean@n`` its run's
evaluation wrote (n = ``trainer.eval_samples``, not k), a run whose evaluation lacks it is not an
ok row, and the aggregate refuses ok rows without the experiment's endpoint instead of falling
back to greedy accuracy. Also: which cells a grid runs (``--only``) and the machine in a row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.experiments.aggregate import aggregate
from launch.experiments.experiment import ExperimentError, cell_id, load_experiment, summarize_run
from launch.experiments.grid import host, pending, run_one
from launch.experiments.report import write_report
from launch.experiments.reproduce import main
from tests.launch.experiment_rows import evals_row, experiment_file, row


def write_run(path: Path, rows: list[dict], config: str | None) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (path / "config.yaml").write_text(config)
    return path


def evals(mean_key: str) -> list[dict]:
    """Evaluations at steps 0 and 2 with pass@4 and ``mean_key``; 100 rollout tokens a step."""
    return [
        {"step": 0, "eval/accuracy": 0.5, "eval/pass@4": 0.6, mean_key: 0.25},
        {"step": 1, "rollout/generated_tokens": 100.0, "acr/raw": 0.5},
        {"step": 2, "rollout/generated_tokens": 100.0, "acr/raw": 0.5,
         "eval/accuracy": 0.55, "eval/pass@4": 0.7, mean_key: 0.375},
    ]  # fmt: skip


EIGHT_OF_FOUR = "trainer:\n  eval_pass_k: 4\n  eval_samples: 8\n"  # pass@4 from 8 samples


def test_a_row_reads_the_mean_at_n_its_evaluation_wrote(tmp_path):
    # 8 samples per problem give pass@4 and mean@8 (launch/heldout.py): the old reading looked
    # for mean@4, found none, and the grid's primary endpoint fell back to greedy accuracy
    r = summarize_run(write_run(tmp_path / "run", evals("eval/mean@8"), EIGHT_OF_FOUR))
    assert (r["k"], r["n"]) == (4, 8)
    assert (r["start_mean_at_k"], r["final_mean_at_k"]) == (0.25, 0.375)
    assert [e["mean_at_k"] for e in r["evals"]] == [0.25, 0.375]
    assert [e["generated_tokens"] for e in r["evals"]] == [0.0, 200.0]
    # a run directory without its config: the one mean@n key it logged
    r = summarize_run(write_run(tmp_path / "bare", evals("eval/mean@8"), None))
    assert (r["n"], r["final_mean_at_k"]) == (8, 0.375)


def test_a_row_keeps_the_log_prob_gap_and_the_phase_shares(tmp_path):
    # issue 46's bf16 grid (e7_bf16) compares dtypes by the engine/learner log-prob gap and
    # where the step's time went: steps 1 and 2 logged gaps 0.01 and 0.03 -> mean 0.02; each
    # step 4 s, generate 1 and learner 2 of it -> shares 0.25 and 0.5, the rest 0.25 "other"
    rows = evals("eval/mean@4")
    for r, gap in zip(rows[1:], (0.01, 0.03), strict=True):
        r.update({"rollout/logprob_abs_diff_mean": gap, "timing_s/step": 4.0,
                  "timing_s/generate": 1.0, "timing_s/learner": 2.0})  # fmt: skip
    r = summarize_run(write_run(tmp_path / "run", rows, "trainer:\n  eval_pass_k: 4\n"))
    assert r["logprob_gap"] == pytest.approx(0.02) and r["time_per_step_s"] == pytest.approx(4.0)
    assert r["timing_share"]["generate"] == pytest.approx(0.25)
    assert r["timing_share"]["learner"] == pytest.approx(0.5)
    assert r["timing_share"]["other"] == pytest.approx(0.25)


def test_a_run_without_the_configured_mean_at_n_has_no_row_to_give(tmp_path):
    run = write_run(tmp_path / "run", evals("eval/mean@4"), EIGHT_OF_FOUR)
    with pytest.raises(ValueError, match=r"step 0 .* no eval/mean@8 \(trainer.eval_samples"):
        summarize_run(run)
    # greedy-only evaluation (eval_pass_k 0): no mean@n is expected, none is read
    greedy = [{k: v for k, v in r.items() if "@" not in k} for r in evals("x")]
    r = summarize_run(write_run(tmp_path / "greedy", greedy, "trainer:\n  eval_pass_k: 0\n"))
    assert (r["k"], r["n"], r["final_mean_at_k"], r["final_accuracy"]) == (None, None, None, 0.55)


def test_the_aggregate_refuses_ok_rows_without_the_endpoint(tmp_path, capsys):
    exp = load_experiment(str(experiment_file(tmp_path, endpoint="final_mean_at_k")))
    rows = [evals_row(exp, m, s, 0.3) for m in ("grpo", "avspo") for s in range(3)]
    rows[4] = row(exp, "avspo", 1, 0.4)  # greedy accuracy only: its mean@k never read
    with pytest.raises(ExperimentError, match=r"endpoint: final_mean_at_k is missing from 1 ok "
                       r"row .*method=avspo seed 1"):  # fmt: skip
        aggregate(exp, rows)
    # a failed row has no endpoint to miss; the grid itself goes on (its rows are kept)
    rows[4] = {**rows[4], "status": "failed", "error": "boom"}
    assert [c.figures["final_mean_at_k"].n for c in aggregate(exp, rows)] == [3, 2]
    exp.results.parent.mkdir(parents=True)
    exp.results.write_text(json.dumps(row(exp, "grpo", 0, 0.4)) + "\n")
    assert main([str(exp.path), "--report-only"]) == 2
    assert "endpoint: final_mean_at_k is missing" in capsys.readouterr().err
    assert not exp.report.exists()


def test_greedy_accuracy_is_primary_only_where_the_experiment_names_it(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path, endpoint="final_accuracy")))
    rows = [row(exp, m, 0, acc) for m, acc in (("grpo", 0.4), ("avspo", 0.5))]
    exp.results.parent.mkdir(parents=True)
    exp.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report(exp).read_text()
    assert "the primary one (final greedy accuracy, the experiment's endpoint)" in text
    assert "| avspo | 1 | n/a | 0.500 | n/a | +10.0 |" in text  # 0.5 - 0.4 on seed 0, in points
    with pytest.raises(ExperimentError, match="endpoint: 'pass_at_k' is not one of"):
        load_experiment(str(experiment_file(tmp_path, endpoint="pass_at_k")))
    # the default: mean@k at T = 1
    assert load_experiment(str(experiment_file(tmp_path, endpoint=None))).endpoint == (
        "final_mean_at_k"
    )


def test_only_narrows_the_pending_runs_and_names_a_bad_value(tmp_path, capsys):
    axes = {"method": {m: [f"algorithm={m}"] for m in ("grpo", "avspo", "avspo_release")}}
    exp = load_experiment(str(experiment_file(tmp_path, axes=axes, seeds=[0, 1])))
    rows = [row(exp, m, 0, 0.4) for m in ("grpo", "avspo")]
    only = {"method": {"grpo", "avspo"}}
    left = [(cell_id(c), s) for c, s in pending(exp, rows, False, only=only)]
    # seed-major within the chosen cells: each finished pair is complete before the next seed
    assert left == [("method=grpo", 1), ("method=avspo", 1)]
    rest = [(cell_id(c), s) for c, s in pending(exp, rows, False)]
    assert rest == [("method=avspo_release", 0), *left[:2], ("method=avspo_release", 1)]
    # a typo stops the command before any model or run: exit 2 naming the value
    assert main([str(exp.path), "--only", "method=grpo", "--only", "method=avpso"]) == 2
    assert "--only method=avpso: 'avpso' is not a value of axis method" in capsys.readouterr().err
    assert main([str(exp.path), "--only", "level=L3", "--list"]) == 2
    assert "--only level=L3: no axis level" in capsys.readouterr().err
    assert not exp.results.exists()


def test_host_names_the_cpu_model_of_proc_cpuinfo_and_its_bf16_flags():
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    name = next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    flags = next(x.split(":", 1)[1].split() for x in lines if x.startswith("flags"))
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    assert host().startswith(f"{name} ({' '.join(have) or 'no AVX2'}), ")
    assert host().endswith(" cores")


@pytest.mark.slow
def test_a_failed_run_row_records_the_machine_too(tmp_path):
    """Every row names its machine: a run that fails at once (a bad override) as well."""
    axes = {"method": {"broken": ["trainer.total_steps=-3"]}}
    exp = load_experiment(str(experiment_file(tmp_path, axes=axes, baseline={}, seeds=[0])))
    r = run_one(exp, exp.cells[0], 0)
    assert r["status"] == "failed" and "trainer.total_steps" in r["error"]
    assert r["host"] == host()


def test_a_registered_pair_is_compared_with_its_partner_and_holm_counts_it(tmp_path):
    """``pairs`` (issue 48, point 8): DCPO on recurring prompts is compared with GRPO on the same
    prompts, as e1_pinned.yaml registered, not with the baseline; the Holm family holds that
    comparison, and the table says which partner it had."""
    axes = {"method": {"grpo": ["algorithm=grpo"], "grpo_recur": ["task.num_train=8"],
                       "dcpo_recur": ["algorithm=dcpo", "task.num_train=8"]}}  # fmt: skip
    path = experiment_file(tmp_path, axes=axes, pairs={"method": {"dcpo_recur": "grpo_recur"}})
    exp = load_experiment(str(path))
    acc = {"grpo": [0.5, 0.6, 0.7], "grpo_recur": [0.3, 0.4, 0.5], "dcpo_recur": [0.4, 0.6, 0.6]}
    rows = [row(exp, m, s, a) for m, accs in acc.items() for s, a in enumerate(accs)]
    for r in rows:  # the dose: 1 - effective / raw; DCPO treats 3 of 4 collapsed groups
        r["acr_raw"], r["acr_effective"] = 0.4, 0.1 if r["cell"]["method"] == "dcpo_recur" else 0.4
    cells = {c.cell["method"]: c for c in aggregate(exp, rows)}
    assert cells["dcpo_recur"].figures["dose"].mean == pytest.approx(0.75)
    assert cells["grpo"].figures["dose"].mean == 0.0
    # dcpo_recur - grpo_recur per seed: +0.1, +0.2, +0.1 (against grpo it would be -0.1, 0, -0.1)
    assert cells["dcpo_recur"].versus["final_accuracy"].mean == pytest.approx(0.4 / 3)
    assert cells["dcpo_recur"].partner == "method=grpo_recur"
    assert cells["grpo_recur"].versus["final_accuracy"].mean == pytest.approx(-0.2)  # vs grpo
    assert cells["grpo_recur"].partner is None
    # two comparisons in the family: both adjusted (Holm multiplies the smaller p by 2)
    assert cells["dcpo_recur"].holm_p is not None and cells["grpo_recur"].holm_p is not None
    exp.results.parent.mkdir(parents=True)
    exp.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "(vs method=grpo_recur)" in write_report(exp).read_text()
    with pytest.raises(ExperimentError, match="pairs.method.dcpo_recur"):
        load_experiment(str(experiment_file(tmp_path, axes=axes,
                                            pairs={"method": {"dcpo_recur": "nope"}})))  # fmt: skip


def test_attempts_replaced_by_a_later_row_are_listed_under_the_grid(tmp_path):
    """Issue 48, point 18: a failed attempt stays visible (when, how long, why) beside the row
    that replaced it, whose count alone ("3 of 3 runs") would hide it."""
    exp = load_experiment(str(experiment_file(tmp_path)))
    rows = [row(exp, m, s, 0.4) for m in ("grpo", "avspo") for s in range(3)]
    failed = {**rows[4], "status": "failed", "wall_s": 62.0, "finished": "2026-12-02T13:47",
              "error": "exit status 1: \x1b[36m(LearnerRank)\x1b[0m boom"}  # fmt: skip
    rows = [*rows[:4], failed, {**rows[4], "finished": "2026-12-02T13:54"}, rows[5]]
    exp.results.parent.mkdir(parents=True)
    exp.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report(exp).read_text()
    assert "6 of 6 runs (6 ok)" in text
    assert "- method=avspo seed 1: failed after 62 s, 2026-12-02T13:47: exit status 1: " \
           "(LearnerRank) boom" in text  # fmt: skip


def test_a_finished_run_leaves_its_rows_and_logs_but_not_its_checkpoints(tmp_path, monkeypatch):
    """A grid's finished run deletes its checkpoints (SmolLM2: ~8 GB a run filled a disk); a
    failed one keeps them for its retry to resume; ``keep_checkpoints: true`` keeps them all."""
    import subprocess

    import launch.experiments.grid as grid

    real = subprocess.run

    def fake_train(argv, **kwargs):  # a "run" that writes its metrics and a checkpoint
        if "launch.train" not in argv:
            return real(argv, **kwargs)  # git, for the row's revision
        run_dir = Path(next(a for a in argv if a.startswith("trainer.run_dir=")).split("=", 1)[1])
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                       evals("eval/mean@8")))  # fmt: skip
        (run_dir / "config.yaml").write_text(EIGHT_OF_FOUR)
        (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
        failing = "trainer.seed=1" in argv
        return subprocess.CompletedProcess(argv, 1 if failing else 0)

    monkeypatch.setattr(grid.subprocess, "run", fake_train)
    exp = load_experiment(str(experiment_file(tmp_path, endpoint="final_mean_at_k")))
    ok, failed = run_one(exp, exp.cells[0], 0), run_one(exp, exp.cells[0], 1)
    assert ok["status"] == "ok" and failed["status"] == "failed"
    assert (exp.run_dir(exp.cells[0], 0) / "metrics.jsonl").exists()
    assert not (exp.run_dir(exp.cells[0], 0) / "checkpoints").exists()
    assert (exp.run_dir(exp.cells[0], 1) / "checkpoints" / "step_000002").exists()
    kept = load_experiment(str(experiment_file(tmp_path, endpoint="final_mean_at_k",
                                               keep_checkpoints=True)))  # fmt: skip
    assert run_one(kept, kept.cells[0], 2)["status"] == "ok"
    assert (kept.run_dir(kept.cells[0], 2) / "checkpoints").exists()
