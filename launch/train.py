"""``python -m launch.train [hydra overrides]``: the main job (docs/ARCHITECTURE.md section 9).

Composes and validates the whole config first (an unknown key or bad value stops it with one
message naming the key, before any actor starts), then runs the driver loop (launch/loop.py):
rollout workers -> verifier pool -> learner group (advantage stage + ACR monitor + DeepSpeed
update) -> weight sync, with held-out evaluation at step 0, every ``trainer.eval_every`` steps
and at the end. The run directory (``trainer.run_dir``, default Hydra's output directory) gets
the resolved ``config.yaml`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from pathlib import Path
from signal import SIGINT, SIGTERM

import hydra
from omegaconf import DictConfig, OmegaConf

from launch.validation import exit_on_config_error, overrides_of, to_train_config


class stop_on_signals(contextlib.AbstractContextManager):
    """SIGINT/SIGTERM while it is active: the first asks the trainer (once ``trainer`` is set)
    to stop at the next step boundary with a checkpoint; a second one, or one before the
    trainer exists, interrupts at once (KeyboardInterrupt: actors are still shut down)."""

    def __enter__(self):
        self.trainer = None
        self.previous = {s: signal.signal(s, self._handle) for s in (SIGINT, SIGTERM)}
        return self

    def arm(self, trainer) -> None:
        """From now on a first signal stops ``trainer`` at a step boundary. Re-installs the
        handlers: ``ray.init`` (inside the trainer) put its own SIGTERM handler in place, which
        aborts the driver (exit -6) without shutting anything down."""
        self.trainer = trainer
        for s in self.previous:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.trainer is None or self.trainer.stop_reason is not None:
            raise KeyboardInterrupt(name)
        self.trainer.request_stop(name)
        print(
            f"{name}: finishing this step, then a checkpoint and exit (again to abort now)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from launch.models.bootstrap import pin_revision
    from launch.models.dtype import resolve_dtype

    with exit_on_config_error():
        cfg = to_train_config(raw)
        check_unread(cfg, HydraConfig.get())
        pin_revision(cfg.model)  # a hub id: the commit its revision names now, in config.yaml
        resolve_dtype(cfg.model)  # auto: this machine's choice, in config.yaml
    run_dir = Path(cfg.trainer.run_dir or HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    print(f"run directory: {run_dir}", flush=True)

    from launch.loop import Trainer
    from launch.resume import CheckpointFailed, Stopped, emergency_note
    from launch.stages import build_stages
    from launch.validation import ConfigError

    resume = resume_command(sys.argv[1:], run_dir)
    log = lambda line: print(line, flush=True)  # noqa: E731
    with exit_on_config_error(), stop_on_signals() as stop:
        stages = build_stages(cfg, run_dir, log=log)  # a bad config or file: exit 2, no actor
        trainer = Trainer(cfg, stages, run_dir, log=log)
        stop.arm(trainer)
        try:
            final = trainer.run()
        except Stopped as err:
            where = f"checkpoint {err.folder}" if err.folder else "no checkpoint (no step done)"
            print(f"{err}; {where}; continue with: {resume}", file=sys.stderr, flush=True)
            sys.exit(128 + signal.Signals[err.reason].value)
        except CheckpointFailed as err:
            print(f"error: {err}\nfree space, then continue with: {resume}", file=sys.stderr)
            sys.exit(1)
        except ConfigError:
            raise  # a refused resume: one line, exit 2 (exit_on_config_error)
        except Exception as err:  # noqa: BLE001 - e.g. a learner rank died: nothing to restart
            import traceback

            traceback.print_exc()
            print(emergency_note(run_dir, err, resume), file=sys.stderr, flush=True)
            sys.exit(1)
        finally:
            trainer.shutdown()
            stages.shutdown()
            # Each job of a --multirun starts its own Ray (its listen mode, its resources) and
            # leaves nothing behind (its private temp dir: launch/ray_dirs.py); a joined
            # cluster is only disconnected from.
            from launch.ray_dirs import shutdown_ray

            shutdown_ray()
    print_end(cfg, final, run_dir)


def check_unread(cfg, hydra_cfg) -> None:
    """A key of this run's overrides that it never reads (launch/unread_keys.py): refused, except
    in a ``--multirun`` job, where an override shared by the sweep may be read by other jobs
    (``algorithm=grpo,avspo algorithm.trigger.policy=always``): there it is one note line."""
    from hydra.types import RunMode

    from launch.unread_keys import unread_problem
    from launch.validation import ConfigError

    problem = unread_problem(cfg, list(hydra_cfg.overrides.task))
    if problem and hydra_cfg.mode == RunMode.MULTIRUN:
        print(f"note: {problem}", flush=True)
    elif problem:
        raise ConfigError(problem)


def print_end(cfg, final: dict, run_dir: Path) -> None:
    """The run's last lines: held-out accuracy, where its files are, the trained model's Hugging
    Face folder and the command that evaluates it."""
    start = final["eval/accuracy_start"]
    print(
        f"held-out accuracy: {start:.3f} at step 0 -> "
        f"{final['eval/accuracy']:.3f} at step {cfg.trainer.total_steps}; "
        f"metrics in {run_dir / 'metrics.jsonl'}"
        + (f"; report in {run_dir / 'report.md'}" if cfg.logger.report else "")
    )
    latest = run_dir / "checkpoints" / "latest"
    if latest.exists():
        ckpt = (latest.parent / latest.read_text().strip()).resolve()
        print(f"trained model (a Hugging Face folder): {ckpt / 'model'}")
        print(f"evaluate it: {command_with('launch.evaluate', sys.argv[1:], ckpt)}", flush=True)


def resume_command(argv: list[str], run_dir: Path) -> str:
    """The command that continues this run, shell-quoted: its own arguments with the run
    directory pinned (the default is a new timestamped folder per start) and ``resume=auto``.

    >>> resume_command(["model.path=/m x", "trainer.resume=null"], Path("/r/out 1"))
    "python -m launch.train 'model.path=/m x' 'trainer.run_dir=/r/out 1' trainer.resume=auto"
    """
    return command_with("launch.train", argv, "auto", run_dir)


def command_with(module: str, argv: list[str], resume: Path | str, run_dir: Path | None = None):
    """``python -m <module>`` with this run's arguments, ``trainer.resume`` (and the run dir)
    replaced, shell-quoted."""
    replaced = ("trainer.run_dir=", "+trainer.run_dir=", "trainer.resume=", "+trainer.resume=")
    kept = [a for a in argv if not a.startswith(replaced)]
    pinned = [f"trainer.run_dir={run_dir.resolve()}"] if run_dir else []
    return shlex.join(["python", "-m", module, *kept, *pinned, f"trainer.resume={resume}"])


def validate(overrides: list[str], *, data: bool = True) -> list[str]:
    """Compose, check every key, value and cross-field rule, read the tasks' data files (bad rows
    named) and find ``model.path`` (a folder, or a hub id in the cache or on the hub: nothing is
    downloaded); exit 2 with one line on the first problem. No actor, no model loaded, no Ray.
    ``data=False`` (``--cfg`` and a plain run's first check) reads no file and asks no hub, and
    returns the data files that are not there, each once."""
    from launch.models.bootstrap import check_model_path
    from launch.validation import compose_config, task_configs
    from reward.data import data_paths
    from reward.tasks import data_files, make_task

    with exit_on_config_error():
        cfg = compose_config(overrides)  # one line per problem, unread keys too (validation.py)
        tasks = task_configs(cfg)  # key -> task: errors name an eval task's own key
        if not data:
            missing = [f for t in tasks.values() for f in data_files(t) if not data_paths(f)]
            return list(dict.fromkeys(missing))  # a file two tasks read, once
        for key, task in tasks.items():
            make_task(task, key)
        check_model_path(cfg.model)
    return []


HYDRA_PAGES = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc")
"""Hydra's flags that print something and run nothing (no config to check first)."""


def cli(main=main) -> None:
    """``python -m launch.train``: ``--validate`` checks the whole config (the data files and
    ``model.path`` too) and exits 0 or 2 without starting anything; otherwise the config (not
    the data) is checked first, so a bad key or value exits 2 with one line before Hydra runs
    ``main`` or prints the config (``--cfg job|all``, which then says which data files are
    missing). ``--multirun`` jobs are each checked as they start (sweeps are Hydra's to
    expand). ``launch.evaluate`` shares this with its own ``main``."""
    argv = sys.argv[1:]
    if "--validate" in argv:
        validate(overrides_of(argv))
        print("config ok")
        return
    skip = {"--multirun", "-m", *HYDRA_PAGES} & set(argv)
    missing = [] if skip else validate(overrides_of(argv), data=False)
    main()
    if missing and {"--cfg", "-c"} & set(argv):  # after Hydra's printout: the last line
        print(
            f"note: {len(missing)} data file(s) not found (--validate and the run read them): "
            + ", ".join(missing),
            file=sys.stderr,
        )


if __name__ == "__main__":
    cli()
