"""Metric sinks: jsonl in the run directory (always), console (a line per step, or a progress
bar with ETA on a terminal), TensorBoard and wandb, selected by the ``logger`` config; the
step's logged rollouts (``logger.samples``) go to the sinks with ``log_samples`` (wandb's
table here, samples.jsonl: diagnostics/samples.py).

Values are plain floats; non-finite ones are written as null (JSON has no NaN). Nothing here
reads or writes secrets.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _clean(float(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


CONSOLE_KEYS = (
    ("reward/mean", "reward {:.3f}"),
    ("eval/accuracy", "eval {:.3f}"),
    ("acr/raw", "acr {:.2f}"),
    ("acr/effective", "eff {:.2f}"),
    ("avspo/triggered", "trig {:.0f}"),
    ("avspo/tau_adapt", "tau {:.3f}"),
    ("actor/grad_norm", "gnorm {:.3f}"),
    ("timing_s/step", "{:.1f}s"),
)


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}/{total}"]
    for key, fmt in CONSOLE_KEYS:
        if key in metrics and metrics[key] is not None:
            parts.append(fmt.format(metrics[key]))
        if key == "eval/accuracy":  # eval/pass@k beside it, whatever k is
            parts += [f"{k[5:]} {v:.3f}" for k, v in metrics.items() if k.startswith("eval/pass@")]
    return " | ".join(parts)


class TensorBoardSink:
    """Scalars under ``<run_dir>/tensorboard`` (one tag per metric name)."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            value = _clean(float(value))
            if value is not None:
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def wandb_logged_in(env: dict[str, str]) -> bool:
    """Whether wandb has an API key to go online with: ``$WANDB_API_KEY``, or the entry ``wandb
    login`` wrote into the netrc file (``$NETRC``, else ``$HOME/.netrc``) for the server of
    ``$WANDB_BASE_URL`` (default ``api.wandb.ai``). Only whether one is there is looked at:
    the key is never kept, logged or written.

    >>> wandb_logged_in({}), wandb_logged_in({"WANDB_API_KEY": "x"})
    (False, True)
    """
    import netrc
    from urllib.parse import urlsplit

    if env.get("WANDB_API_KEY"):
        return True
    host = urlsplit(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = env.get("NETRC") or (str(Path(env["HOME"]) / ".netrc") if env.get("HOME") else None)
    if not path or not host:
        return False
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(configured: str | None, env: dict[str, str]) -> str:
    """The wandb mode: the configured one, else ``$WANDB_MODE``, else online when wandb has a
    key (:func:`wandb_logged_in`: the environment's, or ``wandb login``'s), offline otherwise,
    so that a run without credentials never blocks.

    >>> wandb_mode(None, {}), wandb_mode(None, {"WANDB_API_KEY": "x"}), wandb_mode("disabled", {})
    ('offline', 'online', 'disabled')
    """
    if configured:
        return configured
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if wandb_logged_in(env) else "offline"


class WandbSink:
    """A wandb run in ``<run_dir>/wandb``. The API key is read by wandb from the environment or
    its login; this class never reads, logs or writes it (the run's config is passed as a plain
    dict). ``run_id``: the run to continue (a resumed training run keeps its wandb run: the id
    is in its checkpoints); None starts a new one. ``run_id`` after init: the run's id."""

    def __init__(
        self,
        run_dir: Path,
        *,
        project: str,
        entity: str | None,
        mode: str,
        config: dict,
        name: str,
        group: str | None = None,
        tags: list[str] | None = None,
        run_id: str | None = None,
    ):
        import wandb

        self._run = wandb.init(
            project=project,
            entity=entity,
            mode=mode,
            dir=str(run_dir),
            name=name,
            group=group,
            tags=tags,
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run_id: str = self._run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {k: _clean(float(v)) for k, v in metrics.items()}
        self._run.log({k: v for k, v in row.items() if v is not None}, step=step)

    def log_samples(self, step: int, records: list[dict]) -> None:
        """A step's logged rollouts (diagnostics/samples.py) as a ``wandb.Table`` under
        ``samples``, one row each (a group's rewards as text), before the step's metrics."""
        import wandb

        if not records:
            return
        columns = list(records[0])
        data = [[json.dumps(v) if isinstance(v, list) else v for v in r.values()] for r in records]
        self._run.log({"samples": wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()


class ConsoleSink:
    """One readable line per step; on a terminal (or ``progress="always"``) a progress bar with
    ETA instead, with the line written above it."""

    def __init__(self, total: int, *, progress: str = "auto", write=print, start: int = 0):
        import sys

        self.total, self.write, self.bar = total, write, None
        if progress == "always" or (progress == "auto" and sys.stdout.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
            self.write = self.bar.write

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.write(console_line(step, self.total, metrics))
        if self.bar is not None and step > 0:
            self.bar.update(step - self.bar.n)

    def phase(self, text: str | None) -> None:
        """A long phase in progress (evaluation, a checkpoint) shown on the bar; None clears
        it. Off a terminal nothing: the step lines say what happened."""
        if self.bar is not None:
            self.bar.set_postfix_str(text or "", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class MultiSink:
    """Fans each step's metrics out to every configured sink."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_samples(self, step: int, records: list[dict]) -> None:
        """A step's logged rollouts to the sinks that keep them (``samples.jsonl``, wandb)."""
        for sink in self.sinks:
            if records and hasattr(sink, "log_samples"):
                sink.log_samples(step, records)

    @contextlib.contextmanager
    def phase(self, text: str):
        """``text`` on the sinks that show phases (the console's bar) while the block runs; the
        block gets a function that replaces it (progress within the phase)."""
        shown = [sink for sink in self.sinks if hasattr(sink, "phase")]

        def show(now: str | None) -> None:
            for sink in shown:
                sink.phase(now)

        show(text)
        try:
            yield show
        finally:
            show(None)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
