"""Files and folders named after the process that made them (``<prefix><pid>-...``), found once
that process is gone: what an actor killed with SIGKILL leaves behind (the verifier pool's
scratch folders, the private folders of the weight files: comm/weight_file.py). Imports no Ray."""

from __future__ import annotations

import os
from pathlib import Path


def orphans(folder: str, prefix: str) -> list[Path]:
    """The entries of ``folder`` named ``<prefix><pid>-...`` whose process ``pid`` is gone (a live
    process of another user counts as alive; this process's own entries are never orphans)."""
    found = []
    for path in Path(folder).glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and _gone(int(pid)):
            found.append(path)
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        return False
    return False
