"""The project as an installed package: a wheel built from the source files (a copy, so the
checkout gets no build/ or egg-info), installed with ``--no-deps`` into a fresh virtual environment
whose dependencies are this environment's, seen through one plain path line in a .pth file (the
.pth files in that folder are then not processed, so the checkout's editable-install finder cannot
shadow the wheel). The console scripts run from an empty directory, where only the wheel's own
``conf`` package can supply Hydra's presets. No network: no build isolation, no index."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launch.submit import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("avspo-train", "avspo-evaluate", "avspo-analyze", "avspo-submit")
TIMEOUT_S = 300

pytestmark = pytest.mark.slow


@dataclass
class Installed:
    wheel: Path
    bin: Path  # the fresh environment's scripts
    site: Path  # its site-packages, where the wheel went
    cwd: Path  # an empty directory

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "VIRTUAL_ENV", "RAY_", "WANDB_"))
        }
        return subprocess.run(
            [str(self.bin / program), *args],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )


def pip(python: Path | str, *args: str | Path) -> None:
    out = subprocess.run(
        [str(python), "-m", "pip", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip(
        sys.executable,
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        tmp / "dist",
        src,
    )
    (wheel,) = (tmp / "dist").glob("avspo-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    Path(site, "_avspo_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    # --ignore-installed: this environment's editable avspo is visible through that path line
    pip(python, "install", "--no-deps", "--no-index", "--ignore-installed", wheel)

    cwd = tmp / "empty"
    cwd.mkdir()
    return Installed(wheel=wheel, bin=env_dir / "bin", site=Path(site), cwd=cwd)


def printed_config(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return yaml.safe_load(out.stdout)


def composed(*overrides: str) -> dict:
    """What the checkout composes from its own conf/ (as tests/unit/test_config.py does)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import launch.config  # noqa: F401  (registers the schema with Hydra's ConfigStore)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_wheel_ships_every_module_preset_and_script(installed):
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = whl.read(entry_points).decode()
    want = {
        p.relative_to(ROOT).as_posix()
        for name in PACKAGES
        for p in (ROOT / name).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "conf/config.yaml" in want and "conf/algorithm/grpo.yaml" in want
    assert not want - names, f"not in the wheel: {sorted(want - names)}"
    assert not {n for n in names if n.startswith(("tests/", "docs/", "docker/"))}
    for script in SCRIPTS:  # avspo-train enters through cli (--validate, then Hydra's main)
        entry = "cli" if script in ("avspo-train", "avspo-evaluate") else "main"
        assert f"{script} = launch.{script.removeprefix('avspo-')}:{entry}" in scripts


def test_the_wheel_is_imported_not_the_checkout(installed):
    code = "; ".join(f"import {name}; print({name}.__file__)" for name in PACKAGES)
    out = installed.run("python", "-c", code)
    assert out.returncode == 0, out.stderr
    files = [Path(line) for line in out.stdout.split()]
    assert len(files) == len(PACKAGES)
    for f in files:
        assert f.is_relative_to(installed.site), f
        assert not f.is_relative_to(ROOT), f


def test_the_wheel_loads_the_shipped_default_model_with_no_build(installed, tmp_path):
    """The default model's weights travel in the wheel (launch/assets/) and load from there,
    their id checked: an empty model cache stays empty."""
    code = ("from launch.models.bootstrap import ModelConfig, ensure_model; "
            f"ensure_model(ModelConfig(cache_dir={str(tmp_path)!r}))")  # fmt: skip
    out = installed.run("python", "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("weights id: 4aa8613f (shipped: "), out.stdout
    assert Path(out.stdout.split("shipped: ")[1].rstrip(")\n")).is_relative_to(installed.site)
    assert not any(tmp_path.iterdir())


def test_train_prints_the_default_config_from_an_empty_directory(installed):
    """``avspo-train --cfg job`` = ``python -m launch.train --cfg job`` in the checkout; before
    conf was shipped it failed with "Primary config directory not found"."""
    cfg = printed_config(installed.run("avspo-train", "--cfg", "job"))
    assert cfg["algorithm"]["name"] == "avspo_fast"
    assert {"total_steps", "prompts_per_step", "seed", "run_dir"} <= set(cfg["trainer"])
    assert cfg == composed()
    assert not any(installed.cwd.iterdir()), "--cfg job wrote files"


def test_evaluate_passes_hydra_overrides_through(installed):
    out = installed.run("avspo-evaluate", "--cfg", "job", "algorithm=grpo", "trainer.seed=7")
    cfg = printed_config(out)
    assert cfg["algorithm"]["name"] == "grpo"
    assert cfg["trainer"]["seed"] == 7
    assert cfg == composed("algorithm=grpo", "trainer.seed=7")


def test_analyze_runs_from_the_wheel(installed):
    out = installed.run("avspo-analyze", "--help")
    assert out.returncode == 0 and "RUN_DIR" in out.stdout, out.stderr
    out = installed.run("avspo-analyze", "no_such_run")
    assert out.returncode == 2 and "no_such_run: no such directory" in out.stderr, out.stderr


def test_submit_validates_against_the_shipped_presets(installed):
    out = installed.run("avspo-submit", "--help")
    assert out.returncode == 0 and "--address" in out.stdout, out.stderr
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = installed.run("avspo-submit", "--address", address, "trainer.bogus=1")
    assert out.returncode == 2, out.stderr
    assert "trainer.bogus" in out.stderr and "nothing was submitted" in out.stderr
    # valid overrides compose from the wheel's conf; then the (missing) cluster is the stop
    out = installed.run(
        "avspo-submit", "--address", address, "algorithm=grpo", "trainer.run_dir=/tmp/unused"
    )
    assert out.returncode == 2 and "cannot reach" in out.stderr, out.stderr
    assert "config error" not in out.stderr


def test_submit_from_an_installed_copy_uploads_only_the_project_packages(installed):
    """Installed, ``launch.submit``'s ROOT is site-packages: the job's working_dir is a temporary
    folder with the project's packages, never site-packages itself."""
    code = (
        "import os; from launch.submit import job_working_dir\n"
        "with job_working_dir() as d:\n"
        "    print(d); print(' '.join(sorted(os.listdir(d))))\n"
        "    print(os.path.isfile(os.path.join(d, 'conf', 'config.yaml')))\n"
        "print(os.path.exists(d))"
    )
    out = installed.run("python", "-c", code)
    assert out.returncode == 0, out.stderr
    folder, listing, has_config, still_there = out.stdout.splitlines()
    assert not Path(folder).is_relative_to(installed.site)
    assert listing.split() == sorted(PACKAGES)
    assert has_config == "True" and still_there == "False"
