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
import signal
import sys
from pathlib import Path
from signal import SIGINT, SIGTERM

import hydra
from omegaconf import DictConfig, OmegaConf

from launch.validation import exit_on_config_error, to_train_config


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

    resume = " ".join(["python -m launch.train", *sys.argv[1:], "trainer.resume=auto"])
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
    start = final["eval/accuracy_start"]
    print(
        f"held-out accuracy: {start:.3f} at step 0 -> "
        f"{final['eval/accuracy']:.3f} at step {cfg.trainer.total_steps}; "
        f"metrics in {run_dir / 'metrics.jsonl'}"
        + (f"; report in {run_dir / 'report.md'}" if cfg.logger.report else "")
    )


VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path",
               "-cp", "--config-dir", "-cd", "--info", "-i")  # fmt: skip
"""Hydra's flags that take a value (never an override)."""


def overrides_of(argv: list[str]) -> list[str]:
    """The Hydra overrides among command-line arguments.

    >>> overrides_of(["--cfg", "job", "algorithm=grpo", "-p", "trainer", "--validate", "x=1"])
    ['algorithm=grpo', 'x=1']
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in VALUE_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def validate(overrides: list[str], *, data: bool = True) -> list[str]:
    """Compose, check every key, value and cross-field rule, read the tasks' data files (bad rows
    named) and find ``model.path`` (a folder, or a hub id in the cache or on the hub: nothing is
    downloaded); exit 2 with one line on the first problem. No actor, no model loaded, no Ray.
    ``data=False`` (``--cfg`` and a plain run's first check) reads no file and asks no hub, and
    returns the data files that are not there, each once."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from launch.models.bootstrap import check_model_path
    from launch.schema_keys import renamed
    from launch.validation import ConfigError
    from reward.data import data_paths
    from reward.tasks import data_files, make_task

    conf = Path(__file__).resolve().parents[1] / "conf"
    with exit_on_config_error():
        for override in overrides:  # before Hydra, whose error would not name the new key
            if renamed(override.split("=", 1)[0]):
                raise ConfigError(renamed(override.split("=", 1)[0]))
        try:
            with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
                cfg = to_train_config(compose("config", overrides=overrides))
        except (HydraException, OmegaConfBaseException) as err:
            cause = f" ({str(err.__cause__).splitlines()[0]})" if err.__cause__ else ""
            raise ConfigError(str(err).splitlines()[0] + cause) from None
        tasks = (cfg.task, *cfg.trainer.eval_tasks.values())
        if not data:
            missing = [f for t in tasks for f in data_files(t) if not data_paths(f)]
            return list(dict.fromkeys(missing))  # a file two tasks read, once
        for task in tasks:
            make_task(task)
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
