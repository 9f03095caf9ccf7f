"""Your own reward function, named by config: ``task.verifier=pkg.module:function`` or
``task.verifier=path/to/file.py:function`` (a path is resolved against the folder the run starts
in, as verl's ``custom_reward_function.path`` is).

Two signatures are taken as they are:

- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, returning a
  float (a bool counts as 0/1) or a dict with ``score``. It is given the row's ``data_source``
  (verl's column; None where the data has none), the response text, the reference answer and
  ``extra_info=None`` (the row's ``extra_info`` is not kept). Verdict: ``ok`` when the score
  is above 0, else ``wrong``.
- the project's own ``fn(response, reference) -> Verdict`` (a float is taken as the score).

It runs inside the verifier pool like the built-in verifiers: each worker imports it before its
sandbox closes (model text never reaches an import), every call has the item's timeout, and an
exception scores the task's lowest reward with the verdict ``error``. A score outside the task's
reward range (``task.reward_lo``, ``task.reward_hi``) is an error too: set the range to what the
function returns (verl's GSM8K rule gives 0 / 0.1 / 1: inside the default [0, 1]).

>>> spec = "reward.custom:_example"
>>> fn = adapt(load(spec))
>>> fn("... so 12", reference_for("12", "openai/gsm8k")), fn("so 13", "12").reason
(Verdict(score=1.0, reason='ok'), 'wrong')
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
from collections.abc import Callable

from reward.verifiers import VERIFIERS, Verdict

ENV = "AVSPO_REWARD_FUNCTIONS"
"""The specs a verifier actor and its workers register (JSON list), set by the actor."""
VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")


def is_spec(name: str) -> bool:
    """Whether ``task.verifier`` names a function (``module:function`` or ``file.py:function``)
    rather than a built-in verifier."""
    return ":" in name


def resolve(spec: str) -> str:
    """``spec`` with a file path made absolute (workers start in a folder of their own)."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py") or os.sep in where:
        return f"{os.path.abspath(where)}:{name}"
    return spec


def load(spec: str) -> Callable:
    """The function ``spec`` names (its module imported, or its file executed as a module)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"{spec!r}: expected module:function or path/to/file.py:function")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise ValueError(f"{where}: no such file")
        # one module per file, run once per process (validation, make_task and the pool all
        # load it): named after the file's absolute path
        digest = hashlib.sha256(os.path.abspath(where).encode()).hexdigest()[:16]
        module_name = f"avspo_reward_{digest}"
        module = sys.modules.get(module_name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(module_name, where)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]  # a broken file is tried again, not half-kept
                raise
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {where} has no function {name!r}")
    return fn


def _form(fn: Callable) -> str:
    """``verl`` or ``pair``, from the signature; a TypeError for anything else."""
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params]
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    if names[:3] == list(VERL_PARAMS[:3]) or len(required) in (3, 4):
        return "verl"
    if len(required) == 2:
        return "pair"
    raise TypeError(
        f"{getattr(fn, '__name__', fn)}{inspect.signature(fn)}: expected verl's "
        "compute_score(data_source, solution_str, ground_truth, extra_info=None) or "
        "fn(response, reference) -> Verdict"
    )


def reference_for(answer: str, data_source: str | None) -> str:
    """The reference a custom verifier is given in the pool: the answer and its row's
    ``data_source`` (JSON)."""
    return json.dumps({"ground_truth": answer, "data_source": data_source})


def _unwrap(reference: str) -> tuple[str, str | None]:
    try:
        ref = json.loads(reference)
    except ValueError:
        return reference, None
    if isinstance(ref, dict) and set(ref) == {"ground_truth", "data_source"}:
        return str(ref["ground_truth"]), ref["data_source"]
    return reference, None


MAX_EXTRA = 16  # other numbers of a returned dict that are kept (reward/extra/<key>)


def _extra(out) -> dict[str, float] | None:
    """The other numbers of verl's returned dict (at most MAX_EXTRA, finite, short names)."""
    if not isinstance(out, dict):
        return None
    extra = {
        str(k)[:64]: float(v)
        for k, v in out.items()
        if k != "score" and isinstance(v, (int, float)) and math.isfinite(v)
    }
    return dict(list(extra.items())[:MAX_EXTRA]) or None


def _score(out) -> float:
    score = out.get("score") if isinstance(out, dict) else out
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise TypeError(f"the reward function returned {type(score).__name__}, not a number")
    if not math.isfinite(score):
        raise ValueError(f"the reward function returned {score}")
    return float(score)


def adapt(fn: Callable) -> Callable[[str, str], Verdict]:
    """``fn`` as a verifier ``(response, reference) -> Verdict``."""
    form = _form(fn)

    def verdict(response: str, reference: str) -> Verdict:
        answer, source = _unwrap(reference)
        if form == "verl":
            out = fn(source, response, answer, None)
            score = _score(out)
            return Verdict(score, "ok" if score > 0 else "wrong", _extra(out))
        out = fn(response, answer)
        if isinstance(out, Verdict):
            return out
        score = _score(out)
        return Verdict(score, "ok" if score > 0 else "wrong")

    return verdict


def check(spec: str) -> str | None:
    """Why ``spec`` cannot be used (it does not import, or its signature is neither form), in
    one line, or None."""
    try:
        _form(load(spec))
    except Exception as exc:  # noqa: BLE001  (the user's module may raise anything)
        return f"{spec}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return None


def verifier_problem(
    verifier: str, task: str, answer_extraction: str, builtin: tuple[str, ...]
) -> str | None:
    """Why ``task.verifier`` cannot score task ``task`` (an unknown name, a function that does
    not import or has neither signature, reasoning_gym's scorer for another task), or None."""
    if is_spec(verifier):
        if answer_extraction != "auto":
            return "answer_extraction: a reward function of your own finds the answer itself"
        problem = check(resolve(verifier))
        if problem:
            return f"verifier={problem}"
    elif verifier not in builtin:
        return (
            f"verifier={verifier!r}: expected one of {list(builtin)} or a function "
            "(module:function or path/to/file.py:function)"
        )
    if verifier == "reasoning_gym" and task != "reasoning_gym":
        return (
            "verifier=reasoning_gym scores only task=reasoning_gym's own generated entries (a "
            "data file's reference would reach the dataset's scorer, and some scorers evaluate "
            "their reference fields)"
        )
    return None


def register_from_env() -> None:
    """Register the functions named in ``AVSPO_REWARD_FUNCTIONS`` under their specs (the
    parent and every worker; reward/verifiers.py load_verifier_modules)."""
    for spec in json.loads(os.environ.get(ENV) or "[]"):
        if spec not in VERIFIERS:
            VERIFIERS[spec] = adapt(load(spec))


def _example(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """A verl-form rule: the last word of the response equals the answer."""
    words = solution_str.split()
    return float(bool(words) and words[-1] == ground_truth)
