"""Running ``launch.train`` from the end-to-end tests: the command, a run with its own sid
(``setsid``), its metrics rows, and what is left of it."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_cmd(run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.train",
        f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={run_dir}/hydra",
        *overrides,
    ]


TIMED_OUT: list[str] = []  # runs of this pytest run that hit the limit


def run_train(run_dir: Path, *overrides: str, env: dict | None = None) -> str:
    """``launch.train`` in a subprocess (900 s at most). After one run of this pytest run timed out,
    the next fail at once: a machine that slow would take the CI past its own limit, and then no
    failure is reported at all."""
    if TIMED_OUT:
        pytest.fail(f"not run: an earlier launch.train run timed out ({TIMED_OUT[0]})")
    start = time.monotonic()
    try:
        out = subprocess.run(
            train_cmd(run_dir, *overrides),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired as e:
        tail = str(e.stdout or "")[-3000:] + str(e.stderr or "")[-3000:]
        echo_failure(run_dir, f"timed out after {e.timeout:.0f} s", tail)
        TIMED_OUT.append(str(run_dir))
        raise
    tail = out.stdout[-3000:] + out.stderr[-3000:]
    if out.returncode != 0:
        echo_failure(run_dir, f"exit {out.returncode} after {time.monotonic() - start:.0f} s", tail)
    assert out.returncode == 0, tail
    return out.stdout


def echo_failure(run_dir: Path, what: str, tail: str) -> None:
    """A failed run's tail, on the terminal at once: pytest shows captured output only in its
    final summary, which a CI run that hits its time limit never prints."""
    print(f"\n--- launch.train in {run_dir}: {what} ---\n{tail[-2000:]}\n---", file=sys.__stderr__)


def rows(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def deterministic(row: dict) -> dict:
    """A row without wall-clock figures."""
    return {k: v for k, v in row.items() if not k.startswith(("timing_s/", "perf/"))}


STARTED: list[subprocess.Popen] = []  # start_train's runs: stopped at the end if still going


def start_train(
    run_dir: Path | None,
    *overrides: str,
    cwd: Path = ROOT,
    argv: list[str] | None = None,
    env: dict | None = None,
) -> subprocess.Popen:
    """A training run with its own sid (``setsid``: its processes are findable and killable;
    one still going when the pytest run ends, e.g. on Ctrl-C, is killed: tests/conftest.py).
    ``run_dir`` None: Hydra's default, a timestamped folder under ``cwd``/outputs, as a user's
    run without ``trainer.run_dir``; ``argv``: the whole command instead; ``env``: the whole
    environment (default: this one with PYTHONPATH the checkout)."""
    if argv is None:
        argv = train_cmd(run_dir, *overrides) if run_dir else [*train_cmd(Path())[:3], *overrides]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def wait_for_row(
    proc: subprocess.Popen, run_dir: Path, step: int, deadline: float, stale: int | None = None
) -> None:
    """Until ``step``'s metrics row is written (or the run ended, or the deadline passed).
    ``stale``: the inode of the metrics file an earlier run left, whose rows do not count (a
    resumed run replaces that file when it restores: launch/resume.py ``truncate_metrics``)."""
    path = run_dir / "metrics.jsonl"
    while proc.poll() is None and time.monotonic() < deadline:
        if path.exists() and path.stat().st_ino != stale and step in rows(run_dir):
            return
        time.sleep(0.05)


def sid_processes(sid: int) -> list[str]:
    """Live processes whose sid (``os.getsid``) is ``sid`` (a run started with
    ``start_new_session=True``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                found.append(f"{entry.name} {stat.split(')')[0].split('(', 1)[1]}")
        except (OSError, IndexError):
            continue
    return found


def processes_left(sid: int, within_s: float = 30.0) -> list[str]:
    """The processes with sid ``sid`` still alive after waiting up to ``within_s`` for them
    to exit (Ray's daemons exit within moments of ray.shutdown())."""
    deadline = time.monotonic() + within_s
    while sid_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sid_processes(sid)


def listening() -> set[tuple[str, int, str]]:
    """``(address, port, inode)`` of every listening TCP socket of this network namespace
    (/proc/net/tcp{,6}: state 0A; addresses in the kernel's byte order, 4-byte words)."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(raw)), int(port_hex, 16), fields[9]))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def socket_sids() -> dict[str, int]:
    """Socket inode -> the sid (``os.getsid``) of a process holding it (/proc/*/fd:
    ``socket:[inode]``)."""
    found = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            sid = os.getsid(int(fd_dir.parent.name))
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(fd_dir / name)
            except OSError:
                continue
            if target.startswith("socket:["):
                found[target[8:-1]] = sid
    return found


def watch_listening(proc: subprocess.Popen, before: set, deadline: float):
    """The listening sockets that appeared (beyond ``before``) while ``proc`` ran and that a
    process with its sid (``start_new_session``: the driver, Ray, the actors) held, and its
    stdout and stderr (read meanwhile: a full pipe would stall the run). Sockets of any other
    process on the machine are not counted."""
    import threading

    out: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f.read()), daemon=True)
        for k, f in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for t in readers:
        t.start()
    seen: set[tuple[str, int, str]] = set()
    checked = set(before)
    while proc.poll() is None and time.monotonic() < deadline:
        new = listening() - checked
        if new:
            owners = socket_sids()
            seen |= {s for s in new if owners.get(s[2]) == proc.pid}
            checked |= new
        # every 0.5 s: each look reads /proc/net/tcp{,6} (~5 ms of kernel time each here; at
        # 0.2 s the default run's watch cost 13 core-s). What a run listens on lives for the
        # run or a phase of it (Ray, DeepSpeed's store and gloo pairs, the sync store, vLLM).
        time.sleep(0.5)
    proc.wait(timeout=60)
    for t in readers:
        t.join(timeout=60)
    return seen, out.get("stdout", ""), out.get("stderr", "")


def private_copy(base: Path) -> Path:
    """The tracked files copied into ``base/outer/inner/checkout`` (outer and inner 0700, the
    caller's: as root, a clone under the 0700 /root, the default on GPU clouds and in
    containers), with ``.venv`` a link to this checkout's, so the interpreter too sits under
    the 0700 folders. Run it with :func:`private_env` (no PYTHONPATH back to this checkout)."""
    outer = base / "outer"
    inner = outer / "inner"
    checkout = inner / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, files.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    for folder in (outer, inner):
        folder.chmod(0o700)
    return checkout


def private_env() -> dict[str, str]:
    """This environment without PYTHONPATH: a run from :func:`private_copy` imports its own
    copy of the project, as a clone's does."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
