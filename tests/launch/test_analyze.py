"""``python -m launch.analyze`` as users run it: reports and plots for three synthetic runs, the
cross-run fit of final accuracy (%) on ACR100, and exit status 2 with the path on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_PNGS = ("reward_accuracy.png", "acr.png", "avspo.png", "wasted_tokens.png")
# (run, ACR100, final accuracy as a fraction)
RUNS = [("low", 0.2, 0.45), ("mid", 0.5, 0.30), ("high", 0.8, 0.27)]


def analyze(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "launch.analyze", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_run(path: Path, acr100: float, final: float, steps: int = 12) -> Path:
    """A small AVSPO-like run: acr/raw constant at ``acr100``, accuracy 0.25 -> ``final``."""
    path.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.25}]
    for t in range(1, steps + 1):
        row = {
            "step": t,
            "reward/mean": 0.3,
            "acr/raw": acr100,
            "acr/high": acr100 / 2,
            "acr/low": acr100 / 2,
            "acr/effective": acr100 / 2,
            "acr/acr100": acr100,
            "acr/wasted_token_frac": acr100 / 2,
            "avspo/triggered": float(t % 2),
            "avspo/tau_adapt": 0.4,
            "timing_s/step": 1.0,
        }
        if t % 4 == 0:
            row["eval/accuracy"] = 0.99 if t < steps else final  # only the last one is final
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text("algorithm:\n  name: avspo\ntrainer:\n  total_steps: 12\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return base, [write_run(base / name, x, y) for name, x, y in RUNS]


def test_three_runs_reports_and_cross_run_fit(runs):
    base, dirs = runs
    out = analyze(*dirs)
    assert out.returncode == 0, out.stderr
    for d in dirs:
        assert str(d / "report.md") in out.stdout
        assert (d / "report.md").is_file()
        for name in RUN_PNGS:
            assert (d / name).read_bytes()[:8] == PNG_MAGIC, name
    assert "low (avspo): accuracy 0.250 -> 0.450" in out.stdout  # one line per run
    # default --out: the runs' common parent
    assert str(base / "cross_run.md") in out.stdout
    assert (base / "acr100_vs_accuracy.png").read_bytes()[:8] == PNG_MAGIC

    # By hand, accuracy in percent: x = 0.2, 0.5, 0.8; y = 45, 30, 27. Means 0.5 and 34;
    # dx = -0.3, 0, 0.3; dy = 11, -4, -7. S_xx = 0.18; S_xy = -3.3 + 0 - 2.1 = -5.4;
    # S_yy = 121 + 16 + 49 = 186. slope = -5.4 / 0.18 = -30; intercept = 34 + 30 * 0.5 = 49;
    # R^2 = 5.4^2 / (0.18 * 186) = 29.16 / 33.48 = 0.870968.
    xs, ys = [x for _, x, _ in RUNS], [100 * y for *_, y in RUNS]
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = np.asarray(ys) - (intercept + slope * np.asarray(xs))
    r2 = 1 - (resid**2).sum() / ((np.asarray(ys) - np.mean(ys)) ** 2).sum()
    assert (intercept, slope, r2) == pytest.approx((49.0, -30.0, 29.16 / 33.48))
    text = (base / "cross_run.md").read_text()
    assert f"intercept = {intercept:.3f}, slope = {slope:.3f}, R^2 = {r2:.3f}" in text
    assert "intercept = 49.000, slope = -30.000, R^2 = 0.871" in text
    assert "51.4 - 29.6 x ACR100" in text and "percent" in text
    for name, _, _ in RUNS:
        assert f"[{name}]({name}/report.md)" in text


def test_out_option_and_single_run(runs, tmp_path):
    _, dirs = runs
    out = analyze(*dirs[:2], "--out", tmp_path / "cross")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "cross" / "cross_run.md").read_text()
    assert "Least squares over 2 runs" in text  # two points: a line through both, R^2 = 1
    assert "R^2 = 1.000" in text and (tmp_path / "cross" / "acr100_vs_accuracy.png").is_file()
    single = analyze(dirs[0], "--out", tmp_path / "single")
    assert single.returncode == 0, single.stderr
    assert "no cross-run analysis" in single.stdout
    assert not (tmp_path / "single").exists()


def test_missing_dir_exits_2_with_the_path(runs, tmp_path):
    _, dirs = runs
    missing = tmp_path / "no_such_run"
    out = analyze(dirs[0], missing)
    assert out.returncode == 2
    assert str(missing) in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_metrics_exit_2_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.1}\n{"step": 1, "acr\n')
    out = analyze(bad)
    assert out.returncode == 2
    assert f"{bad / 'metrics.jsonl'}:2:" in out.stderr and "Traceback" not in out.stderr
    assert not (bad / "report.md").exists()
