"""A private temp dir for each local Ray a run starts: Ray makes every folder under its temp
dir mode 0777 without the sticky bit, so it goes inside a folder only this user may enter, and
is removed when the run ends. Imports Ray only inside functions."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

SOCKET_PATH_MAX = 107  # Ray's validate_socket_filepath on Linux: AF_UNIX's 108 bytes, NUL included
SOCKET_TAIL = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store.99")
"""What a local Ray adds to its temp dir in its longest socket path: its session folder (a
date, microseconds and the pid, at most 4,194,304 on Linux), then ``sockets/plasma_store``
(numbered from ``.1`` if taken)."""

_ray_parents: list[str] = []  # the private folders of the local Rays this process started


def private_ray_temp_dir(base: str | None = None) -> str:
    """A temp dir for a local Ray (``ray.init(_temp_dir=...)``): ``ray`` inside a new folder of
    mode 0700 (``avspo-ray-<random>``). Ray makes every folder under its temp dir mode 0777
    without the sticky bit; inside a private folder only this user can reach them. The folder
    goes in ``base`` (default: the temp folder Ray itself uses, ``$RAY_TMPDIR``, ``$TMPDIR`` or
    /tmp), or in /tmp when ``base`` is too long for Ray's socket paths."""
    from ray._common.utils import get_default_system_temp_dir

    for where in (base or get_default_system_temp_dir(), "/tmp"):
        # mkdtemp's name: the prefix and 8 random characters
        path = os.path.join(where, "avspo-ray-" + "x" * 8, "ray")
        if len(path.encode()) + SOCKET_TAIL <= SOCKET_PATH_MAX:
            os.makedirs(where, exist_ok=True)
            return os.path.join(tempfile.mkdtemp(prefix="avspo-ray-", dir=where), "ray")
    raise AssertionError("unreachable: /tmp is short")


def shutdown_ray() -> None:
    """``ray.shutdown()``, then remove the private folders of the local Rays this process
    started (:func:`private_ray_temp_dir`), as far as their processes are gone. Also run at
    exit."""
    import ray

    ray.shutdown()
    while _ray_parents:
        shutil.rmtree(_ray_parents.pop(), ignore_errors=True)


def run_ray_temp_dir() -> str:
    """A private temp dir for the local Ray this process is about to start, removed by
    :func:`shutdown_ray` (also at exit)."""
    temp_dir = private_ray_temp_dir()
    atexit.unregister(shutdown_ray)  # once: before Ray's own (registered at its import)
    atexit.register(shutdown_ray)
    _ray_parents.append(os.path.dirname(temp_dir))
    return temp_dir
