"""What crosses between the verifier pool (reward/pool.py) and a worker process
(reward/verifier_worker.py): how a worker is started (its environment and import path: model
output runs there) and the one form of answer the pool takes from it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from reward.verifier_worker import BOOT
from reward.verifiers import REASONS, Verdict

_PROJECT_ROOT = str(Path(__file__).resolve().parents[1])

MAX_MESSAGE = 64 * 2**10
"""The longest message a worker may send (a result is ~100 bytes, its report ~2 KiB): a longer
one kills it."""
KNOWN_REASONS = frozenset(REASONS) - {"timeout"}
"""Reasons a worker may give (a timeout is the pool's to declare)."""


@dataclass
class Worker:
    """A worker process as the pool sees it."""

    process: subprocess.Popen
    inbox: Connection  # results from the worker
    outbox: Connection  # items to the worker
    scratch: str  # its sandbox's folder (HOME, cwd), made by the worker, removed with it
    ready: bool = False
    started: float = field(default_factory=time.monotonic)
    item: int | None = None  # index being verified
    deadline: float = 0.0
    done: int = 0  # items it verified
    warmed: set[str] = field(default_factory=set)  # verifiers whose warm-up ran here
    warming: str | None = None  # the verifier warming up now


def checked(msg, idx: int, lowest: float, highest: float) -> tuple[Verdict | None, str]:
    """A worker's answer to item ``idx``: ``(verdict, "")``; ``(verdict, text)`` when the
    verifier raised (reason ``error``); ``(None, what was wrong)`` for anything but exactly
    ``[idx, a float in [lowest, highest], a known reason, a string]``.

    >>> checked([3, 1.0, "ok", ""], 3, 0.0, 1.0)
    (Verdict(score=1.0, reason='ok'), '')
    >>> checked([4, 1.0, "ok", ""], 3, 0.0, 1.0)[1]  # another item's verdict
    'a verdict for item 4 while verifying item 3'
    >>> checked([3, 1e39, "ok", ""], 3, 0.0, 1.0)[1]  # would be inf in float32
    'a score 1e+39 outside the reward range [0.0, 1.0]'
    """
    if not (type(msg) is list and len(msg) in (4, 5)):
        return None, f"a malformed result ({str(msg)[:80]!r})"
    got, score, reason, error = msg[:4]
    extra = msg[4] if len(msg) == 5 else None
    if extra is not None and not _numbers(extra):
        return None, "extra numbers that are not at most 16 short names of finite floats"
    if type(got) is not int or got != idx:
        return None, f"a verdict for item {str(got)[:20]} while verifying item {idx}"
    if type(score) is not float or not lowest <= score <= highest:  # NaN fails both
        return None, f"a score {str(score)[:20]} outside the reward range [{lowest}, {highest}]"
    if reason not in KNOWN_REASONS or type(error) is not str or (reason == "error") != bool(error):
        return None, f"an unknown reason or error text ({str(reason)[:20]!r})"
    return Verdict(score, reason, extra), error[:300]


def _numbers(extra) -> bool:
    return (
        type(extra) is dict
        and len(extra) <= 16
        and all(type(k) is str and len(k) <= 64 for k in extra)
        and all(type(v) is float and math.isfinite(v) for v in extra.values())
    )


ENV_ALLOWED = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "PYTHONHASHSEED",
    "AVSPO_VERIFIER_MODULES", "AVSPO_REWARD_FUNCTIONS",
)  # fmt: skip
"""Environment variables a verifier worker gets: model output runs there, so no key, token or
password of the parent's environment does (Ray's token included), nor the user's home (the
worker sets HOME and TMPDIR to its scratch folder once it has made it)."""


def worker_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed environment of a verifier worker.

    >>> parent = {"PATH": "/b", "WANDB_API_KEY": "k", "HOME": "/root", "RAY_AUTH_TOKEN": "t"}
    >>> " ".join(sorted(worker_env(parent)))
    'OMP_NUM_THREADS PATH PYTHONDONTWRITEBYTECODE PYTHONNOUSERSITE'
    """
    env = {k: parent[k] for k in ENV_ALLOWED if k in parent}
    env["OMP_NUM_THREADS"] = "1"  # a verifier is single-threaded; CPU time is per process
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc writes outside the scratch folder
    env["PYTHONNOUSERSITE"] = "1"  # as -I: no user site, whatever HOME is
    return env


def import_path(parent: Mapping[str, str]) -> list[str]:
    """The folders a worker imports from before its interpreter's own (it runs ``python -I``,
    which ignores PYTHONPATH): the project, then the parent's PYTHONPATH entries that are
    absolute (an empty or relative one would mean the worker's working directory).

    >>> import_path({"PYTHONPATH": ":/opt/pack:rel:/opt/pack"})[1:]
    ['/opt/pack']
    """
    extra = parent.get("PYTHONPATH", "").split(os.pathsep)
    return list(dict.fromkeys([_PROJECT_ROOT, *(p for p in extra if os.path.isabs(p))]))


def worker_limits(cfg) -> tuple[int, int, int]:
    """A worker's ``(address-space bytes, hard CPU seconds, CPU seconds per item)`` from the
    pool config (reward/pool.py ``PoolConfig``): ``memory_mb``; ``cpu_time_s``, null = 2 x
    ``timeout_s`` rounded up; the hard limit, ``start_timeout_s`` + ``max_items_per_worker`` x
    the per-item one, is what a worker may use over its whole life.

    >>> from reward.pool import PoolConfig
    >>> cfg = PoolConfig(memory_mb=1024, timeout_s=2.5, start_timeout_s=9.5, max_items_per_worker=3)
    >>> worker_limits(cfg)  # 1024 MiB; ceil(9.5) + 3 x ceil(2 x 2.5) = 10 + 15
    (1073741824, 25, 5)
    """
    cpu = cfg.cpu_time_s or math.ceil(2 * cfg.timeout_s)
    hard = math.ceil(cfg.start_timeout_s) + cfg.max_items_per_worker * cpu
    return cfg.memory_mb * 2**20, hard, cpu


def start_worker(
    pool_dir: str, name: str, limits: tuple[int, int, int], ids: tuple, audit_hook: bool
) -> tuple[subprocess.Popen, Connection, Connection]:
    """Start a worker (``python -I``, in ``pool_dir``; ``limits``: address-space bytes, hard CPU
    seconds, CPU seconds per item; ``ids``: the uid/gid it switches to, or None) and return
    it with the pipes it answers on and reads from."""
    to_worker_r, to_worker_w = os.pipe()
    from_worker_r, from_worker_w = os.pipe()
    args = [to_worker_r, from_worker_w, *limits, pool_dir, name]
    args += ["-" if i is None else i for i in ids] + [int(audit_hook)]
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", BOOT, json.dumps(import_path(os.environ))]
        + [str(a) for a in args],
        pass_fds=(to_worker_r, from_worker_w),
        env=worker_env(os.environ),
        cwd=pool_dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    os.close(to_worker_r)
    os.close(from_worker_w)
    inbox = Connection(from_worker_r, writable=False)
    return proc, inbox, Connection(to_worker_w, readable=False)
