"""Other trainers' run logs as :class:`~diagnostics.runs.Run` objects, for the ACR report.

``diagnostics.report.load_run`` calls :func:`find_format` and, for a TRL or verl log,
:func:`load_external`; what comes back is the structure our own ``metrics.jsonl`` gives (step ->
metrics under *our* names, docs/ARCHITECTURE.md section 5), so ``summarize``, the run report and the
cross-run fit treat these runs like ours. Only the names below are read; everything else in the
log is ignored. A value that is null or non-finite is dropped; any other non-number in a key that
is read is an error. Bad input raises :class:`RunDataError` naming the file and the entry
(``log_history[i]``) or line (``file:n``); on a step logged twice the later value wins.

**TRL** (huggingface/trl at f2cd577, 2026-07-24): a ``trainer_state.json`` given as the file, a
directory holding it (``Trainer.save_state``), or an output directory whose latest
``checkpoint-N/trainer_state.json`` is read (``Trainer._save_checkpoint``). The file is
transformers' ``TrainerState.save_to_json`` (``transformers/trainer_callback.py``): ``max_steps``
(-> ``trainer.total_steps``) and ``log_history``, a list of dicts that ``Trainer.log``
(``transformers/trainer.py``) appends as ``{**logs, "step": global_step}``. ``GRPOTrainer``
(``trl/trainer/grpo_trainer.py``) collects per-generation metrics in
``_generate_and_score_completions`` and ``GRPOTrainer.log`` averages them over the logging
interval (every ``logging_steps`` = 10 steps by default), with an ``eval_`` prefix in evaluation:

- ``step``: the step (the optimizer step, ``global_step``);
- ``frac_reward_zero_std`` -> ``acr/raw`` (required): the share of groups whose rewards have
  zero std;
- ``reward`` -> ``reward/mean``: the mean of the weighted sum of the reward functions;
- ``eval_rewards/accuracy_reward/mean``, else ``eval_rewards/reasoning_accuracy_reward/mean``
  -> ``eval/accuracy``: the mean of TRL's ``accuracy_reward`` / ``reasoning_accuracy_reward``
  (``trl/rewards/accuracy_rewards.py``; a reward function logs under its function name) over
  the eval completions, i.e. pass@1.

**The authors' AVSPO fork** (hexixiang/ACR, ``trl_scope/trainer/grpo_trainer.py``) is a TRL
``GRPOTrainer`` whose ``frac_reward_zero_std`` is computed from the std *after* its virtual
sample joined each group, i.e. an effective rate: a log that holds the fork's own
``metrics/collapse_rate/general_batch`` (raw: groups with zero reward std / groups) is read as
the fork's, with ``general_batch`` -> ``acr/raw``, ``ones_batch`` -> ``acr/high``,
``zeros_batch`` -> ``acr/low`` and ``frac_reward_zero_std`` -> ``acr/effective``.

An entry's training figures average the steps since the previous entry that logs
``frac_reward_zero_std`` (10 for ``logging_steps=10``); that count is stored as
``log/steps_averaged``, and the report weights each entry by it in ACR100 and the run means.
``frac_reward_zero_std`` is ACR_t only with TRL's defaults ``scale_rewards`` "group" (or "none")
and ``multi_objective_aggregation`` "sum_then_normalize": with "batch" or "normalize_then_sum"
TRL tests the std of the whole batch, so the figure is 0 or 1 (trainer_state.json does not record
which; check the run's arguments). TRL tests zero std with ``torch.isclose(std, 0)``
(|std| <= 1e-8; ours is 1e-6) and logs no all-correct / all-incorrect split, so ``acr/high`` and
``acr/low`` stay absent. Without an accuracy key (any other reward function's name) the run is
reported without accuracy and left out of the accuracy fit with that reason; with several eval
datasets the last one logged at a step wins.

**verl** (volcengine/verl at b178a3c, 2026-01-29): the ``.jsonl`` of the "file" logger,
``FileLogger`` in ``verl/utils/tracking.py``: one line per ``Tracking.log`` call,
``{"step": step, "data": {metric: value}}`` (orjson; NaN is written as null), at
``$VERL_FILE_LOGGER_PATH`` or ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``.
``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py``) logs the validation before training
at step 0 and each training step's metrics at steps 1, 2, ...; repeated steps are merged.

- ``step``: the step;
- ``acr/raw``, else ``frac_reward_zero_std`` -> ``acr/raw`` (required; see below);
- ``acr/high``, ``acr/low``: the all-correct / all-incorrect split, where logged;
- ``critic/score/mean`` -> ``reward/mean`` (``compute_data_metrics``,
  ``verl/trainer/ppo/metric_utils.py``);
- ``val-core/<data_source>/acc/mean@<n>``, else ``val-core/<data_source>/reward/mean@<n>`` ->
  ``eval/accuracy``: the unweighted mean over data sources (of the largest n each).

verl logs no collapse figure of its own: neither verl's core (``metric_utils.py``,
``ray_trainer.py``) nor the recipes of verl-project/verl-recipe at 48ea0a7 (DAPO's
``dapo/dapo_ray_trainer.py`` drops zero-std groups but logs only ``train/num_gen_batches``, from
which the share cannot be recovered; PRIME logs a training ``acc``). A verl run is readable when
its trainer adds ``acr/raw`` (collapsed groups / groups over the batch's ``uid`` groups, e.g.
``diagnostics.acr.collapse_stats``) or TRL's name for it to the metrics it logs; a file without
either is an error naming the file. The accuracy is the validation metric verl itself ranks
first (``RayPPOTrainer._val_metrics_update``): ``acc`` when the reward function returns one,
else ``reward``, which is used only when every value lies in [0, 1] (0/1 rule rewards such as
verl's gsm8k and math scorers; a -1/1 reward is not an accuracy) - otherwise the run is left out
of the accuracy fit with that reason.

**OpenRLHF** (OpenRLHF/OpenRLHF at 3c3be62) is not supported: it logs only to wandb and
TensorBoard (``openrlhf/utils/logging_utils.py``), and no per-step collapse figure; with
``--algo.dynamic_filtering_enable`` it logs ``dynamic_filtering_pass_rate``
(``openrlhf/trainer/ppo_utils/samples_generator.py``), samples kept per prompt drawn (in %) under
a configurable reward range, which is not a share of collapsed groups. A directory holding
TensorBoard event files gets an error saying so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from diagnostics.runs import Run

TRL_STATE = "trainer_state.json"
TRL_KEYS = {"frac_reward_zero_std": "acr/raw", "reward": "reward/mean"}
# The authors' AVSPO fork of TRL (hexixiang/ACR): frac_reward_zero_std is taken after its virtual
# sample joined the statistics (an effective rate); its raw rate and strata have their own keys.
FORK_RAW = "metrics/collapse_rate/general_batch"
FORK_KEYS = {
    "frac_reward_zero_std": "acr/effective",
    FORK_RAW: "acr/raw",
    "metrics/collapse_rate/zeros_batch": "acr/low",
    "metrics/collapse_rate/ones_batch": "acr/high",
    "reward": "reward/mean",
}
TRL_ACCURACY = (
    "eval_rewards/accuracy_reward/mean",
    "eval_rewards/reasoning_accuracy_reward/mean",
)
VERL_ACR = ("acr/raw", "frac_reward_zero_std")
VERL_KEYS = {"acr/high": "acr/high", "acr/low": "acr/low", "critic/score/mean": "reward/mean"}
VERL_VAL = re.compile(r"val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)")
UNSUPPORTED_TB = (
    "no metrics.jsonl nor trainer_state.json, only TensorBoard event files: not supported "
    "(OpenRLHF, for one, logs only to wandb and TensorBoard, and no per-step share of collapsed "
    "groups; see diagnostics/external.py)"
)


class RunDataError(ValueError):
    """A run whose data cannot be read; the message names the file (and line or entry).

    Defined here, below report.py, so that our reader (report.py, which re-exports it) and these
    readers raise one error without importing each other in a circle."""


@dataclass
class ExternalRun(Run):
    """A run read from another trainer's log; ``path`` is where its report is written."""

    source: str = ""  # "trl" or "verl"
    source_file: Path | None = None
    origin: Path | None = None  # what the name shows: TRL's run directory, verl's file sans .jsonl
    # "acr", "accuracy": which keys were read; "no_accuracy": why there is no eval accuracy
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.source}:{self.origin.name if self.origin else '?'}"


# --- format detection ------------------------------------------------------------------------


def find_format(path: Path) -> str | None:
    """``"trl"`` or ``"verl"`` for another trainer's log; None for anything else (our run
    directory, or nothing readable: our reader names what is missing). Raises
    :class:`RunDataError` for logs known to be unsupported (TensorBoard event files)."""
    if path.is_file():
        return "trl" if path.suffix == ".json" else "verl" if path.suffix == ".jsonl" else None
    if not path.is_dir() or (path / "metrics.jsonl").is_file():
        return None
    if (path / TRL_STATE).is_file() or _latest_checkpoint(path) is not None:
        return "trl"
    if any(path.glob("events.out.tfevents.*")) or any(path.glob("*/events.out.tfevents.*")):
        raise RunDataError(f"{path}: {UNSUPPORTED_TB}")
    return None


def load_external(path: str | Path) -> ExternalRun:
    """Read a TRL or verl log (module docstring); raise :class:`RunDataError` on bad data."""
    path = Path(path)
    fmt = find_format(path)
    if fmt == "trl":
        return read_trl(path)
    if fmt == "verl":
        return read_verl(path)
    raise RunDataError(
        f"{path}: not a TRL trainer_state.json (or a directory holding one) nor a verl "
        "file-logger .jsonl"
    )


def _latest_checkpoint(path: Path) -> Path | None:
    found = [
        (int(p.parent.name.removeprefix("checkpoint-")), p)
        for p in path.glob(f"checkpoint-*/{TRL_STATE}")
        if p.parent.name.removeprefix("checkpoint-").isdigit()
    ]
    return max(found)[1] if found else None


# --- values ----------------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """``path``'s bytes, or :class:`RunDataError` naming it (the run directory's files too)."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise RunDataError(f"{path}: cannot read ({err.strerror or err})") from None


def _json(raw: bytes, where: str, what: str):
    try:
        return json.loads(raw)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise RunDataError(f"{where}: not valid {what} ({getattr(err, 'msg', err)})") from None


def _step(value, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunDataError(f"{where}: 'step' must be an integer >= 0, got {value!r}")
    return value


def _number(value, where: str, key: str) -> float | None:
    """``value`` as a finite float; None for null and non-finite values; else an error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunDataError(f"{where}: {key!r} must be a number or null, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _pick(entry: dict, keys: dict[str, str], where: str) -> dict[str, float]:
    """``entry``'s finite values under ``keys`` (theirs -> ours), renamed to ours."""
    picked = {
        ours: _number(entry[theirs], where, theirs)
        for theirs, ours in keys.items()
        if theirs in entry
    }
    return {k: v for k, v in picked.items() if v is not None}


# --- TRL -------------------------------------------------------------------------------------


def _trl_file(path: Path) -> tuple[Path | None, Path, Path]:
    """(trainer_state.json to read, the run's directory, its report directory)."""
    if path.is_file():
        run_dir = path.parent
        if run_dir.name.startswith("checkpoint-"):
            return path, run_dir.parent, run_dir
        return path, run_dir, run_dir
    file = path / TRL_STATE
    return (file if file.is_file() else _latest_checkpoint(path)), path, path


def read_trl(path: Path) -> ExternalRun:
    """A TRL run (module docstring): ``trainer_state.json``, or a directory holding it or its
    ``checkpoint-N/`` folders (the latest is read)."""
    file, origin, run_dir = _trl_file(path)
    if file is None:
        raise RunDataError(f"{path}: no {TRL_STATE} (nor checkpoint-N/{TRL_STATE})")
    state = _json(read_bytes(file), str(file), "JSON")
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise RunDataError(f"{file}: expected a JSON object with a 'log_history' list (TRL)")
    has = {k for e in history if isinstance(e, dict) for k in e}
    acc_key = next((k for k in TRL_ACCURACY if k in has), None)
    fork = FORK_RAW in has
    keys = {**(FORK_KEYS if fork else TRL_KEYS), **({acc_key: "eval/accuracy"} if acc_key else {})}
    rows: dict[int, dict[str, float]] = {}
    for i, entry in enumerate(history):
        where = f"{file}: log_history[{i}]"
        if not isinstance(entry, dict):
            raise RunDataError(f"{where}: expected a JSON object, got {type(entry).__name__}")
        step = _step(entry.get("step"), where)
        rows.setdefault(step, {}).update(_pick(entry, keys, where))
    if not any("acr/raw" in r for r in rows.values()):
        raise RunDataError(
            f"{file}: no log_history entry has 'frac_reward_zero_std' (TRL's GRPOTrainer logs it "
            "each logging step): no per-step collapse figure to analyse"
        )
    prev = 0  # each value averages the steps since the previous log
    for step in sorted(s for s, r in rows.items() if "acr/raw" in r):
        rows[step]["log/steps_averaged"] = float(step - prev)
        prev = step
    max_steps = state.get("max_steps")
    total = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) else None
    notes = {
        "acr": "acr/raw = frac_reward_zero_std, each entry the mean over the steps since the "
        "previous log; no all-correct / all-incorrect split",
    }
    if fork:
        notes["acr"] = (
            f"the AVSPO fork: acr/raw = {FORK_RAW} (high/low: ones_batch/zeros_batch), "
            "acr/effective = frac_reward_zero_std (after its virtual sample), each entry the "
            "mean over the steps since the previous log"
        )
    if acc_key:
        notes["accuracy"] = f"eval/accuracy = {acc_key}"
    else:
        notes["no_accuracy"] = f"no eval accuracy: log_history has no {' or '.join(TRL_ACCURACY)}"
    return ExternalRun(
        path=run_dir,
        rows=_nonempty(rows, file),
        config={"trainer": {"total_steps": total}} if total else {},
        source="trl",
        source_file=file,
        origin=origin,
        notes=notes,
    )


def _nonempty(rows: dict[int, dict[str, float]], file: Path) -> dict[int, dict[str, float]]:
    rows = {s: r for s, r in sorted(rows.items()) if r}
    if not rows:
        raise RunDataError(f"{file}: no metric rows")
    return rows


# --- verl ------------------------------------------------------------------------------------


def read_verl(file: Path) -> ExternalRun:
    """A verl run (module docstring): its file logger's ``.jsonl``. The report goes to
    ``<stem>_report/`` beside the file (verl keeps a project's experiments in one folder)."""
    rows: dict[int, dict[str, float]] = {}
    val: dict[int, dict[str, dict[str, tuple[int, float]]]] = {}  # step -> var -> source
    acr_keys: set[str] = set()
    for lineno, raw in enumerate(read_bytes(file).splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{file}:{lineno}"
        line = _json(raw, where, "JSON line")
        if not isinstance(line, dict) or not isinstance(line.get("data"), dict):
            hint = "; for this project's metrics.jsonl give its run directory"
            raise RunDataError(
                f"{where}: expected a verl file-logger line {{'step': ..., 'data': {{...}}}}"
                + (hint if file.name == "metrics.jsonl" else "")
            )
        step, data = _step(line.get("step"), where), line["data"]
        acr = next((k for k in VERL_ACR if k in data), None)
        keys = {**VERL_KEYS, **({acr: "acr/raw"} if acr else {})}
        acr_keys.update([acr] if acr else [])
        rows.setdefault(step, {}).update(_pick(data, keys, where))
        for key, value in data.items():
            m = VERL_VAL.fullmatch(key)
            v = _number(value, where, key) if m else None
            if v is not None:
                by_source = val.setdefault(step, {}).setdefault(m["var"], {})
                n = int(m["n"])
                if n >= by_source.get(m["source"], (-1, 0.0))[0]:
                    by_source[m["source"]] = (n, v)
    if not acr_keys:
        raise RunDataError(
            f"{file}: no per-step collapse metric: none of {', '.join(VERL_ACR)} is logged. verl "
            "logs no share of zero-std groups of its own; log acr/raw from the trainer to "
            "analyse its runs (diagnostics/external.py)"
        )
    notes = {"acr": f"acr/raw = {' / '.join(sorted(acr_keys))}", **_verl_accuracy(val, rows)}
    return ExternalRun(
        path=file.parent / f"{file.stem}_report",
        rows=_nonempty(rows, file),
        source="verl",
        source_file=file,
        origin=file.with_suffix(""),
        notes=notes,
    )


def _verl_accuracy(val: dict, rows: dict[int, dict[str, float]]) -> dict[str, str]:
    """Set ``eval/accuracy`` per step from the val-core means; return the accuracy note."""
    var = next((v for v in ("acc", "reward") if any(v in by_var for by_var in val.values())), None)
    if var is None:
        return {"no_accuracy": "no eval accuracy: no val-core/<data_source>/acc or reward/mean@<n>"}
    key = f"val-core/<data_source>/{var}/mean@<n>"
    values = [v for by_var in val.values() for _, v in by_var.get(var, {}).values()]
    if var == "reward" and not all(0.0 <= v <= 1.0 for v in values):
        return {"no_accuracy": f"no eval accuracy: {key} leaves [0, 1], a reward, not an accuracy"}
    means = {
        step: math.fsum(v for _, v in by_var[var].values()) / len(by_var[var])
        for step, by_var in val.items()
        if var in by_var
    }
    for step, mean in means.items():
        rows.setdefault(step, {})["eval/accuracy"] = mean
    sources = sorted({s for by_var in val.values() for s in by_var.get(var, {})})
    return {"accuracy": f"eval/accuracy = {key}, mean over data sources {', '.join(sources)}"}
