"""Verifiers that try, from inside a pool worker, what its sandbox must stop (loaded in workers
via AVSPO_VERIFIER_MODULES, before the sandbox: as a scorer bug that runs code would be). Each
returns ``ok`` when it was stopped and raises (an ``error`` verdict, its text in
``pool.last_errors``) when it got through. ``response`` names the attempt; ``reference``
carries what the test knows (a path outside, a sibling's pid, the parent's network namespace).

``PREOPENED``: every folder ``/tmp/avspo-sandbox-test-*`` there is when the module loads, opened
as a directory (a descriptor a worker could hold)."""

from __future__ import annotations

import glob
import json
import os
import resource
import socket
import subprocess
import sys
import types

from reward import verifiers
from reward.verifiers import Verdict, register_verifier

OK = Verdict(1.0, "ok")
PREOPENED = {
    p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in glob.glob("/tmp/avspo-sandbox-test-*")
}


def _refused(attempt) -> Verdict:
    try:
        attempt()
    except OSError:  # PermissionError from the hook or seccomp; EACCES from Landlock or DAC
        return OK
    raise RuntimeError("NOT STOPPED")


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write("x")


def _fork() -> None:
    if os.fork() == 0:  # got through: the child leaves at once
        os._exit(0)


def _read(path: str) -> None:
    with open(path) as f:
        f.read()


def _ctypes_system() -> None:
    import ctypes

    ctypes.CDLL(None).system(b"true")


def _unaudited_subprocess() -> None:
    """``_posixsubprocess.fork_exec`` raises no audit event: subprocess's own ``sys.audit``
    call replaced (a module attribute: unaudited), a program runs unless the kernel stops it."""
    subprocess.sys = types.SimpleNamespace(**{**vars(sys), "audit": lambda *a: None})
    try:
        subprocess.run(["/bin/true"], check=True)
    finally:
        subprocess.sys = sys


def _dir_fd_write(folder: str) -> None:
    fd = os.open("made-through-dir-fd", os.O_WRONLY | os.O_CREAT, 0o666, dir_fd=PREOPENED[folder])
    os.close(fd)


def _patch_hook_helper(path: str) -> None:
    from reward import sandbox

    sandbox._inside.__code__ = (lambda path, roots, *a: True).__code__
    _read(path)


def _system() -> None:
    if os.system("true") != 0:  # os.system says a failed fork in its status, not by raising
        raise OSError("os.system could not run")


def _write_through_link(path: str) -> None:
    os.symlink(path, "link")
    _write("link")


ATTEMPTS = {
    "os.system": lambda ref: _system(),
    "subprocess": lambda ref: subprocess.run(["true"], check=False),
    "unaudited_subprocess": lambda ref: _unaudited_subprocess(),
    "exec": lambda ref: os.execv("/bin/true", ["true"]),
    "fork": lambda ref: _fork(),
    "socket": lambda ref: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
    "unix_socket": lambda ref: socket.socket(socket.AF_UNIX).connect(ref),
    "ctypes": lambda ref: _ctypes_system(),
    "write_outside": _write,
    "remove_outside": os.remove,
    "symlink": _write_through_link,
    "read_outside": _read,
    "list_outside": os.listdir,
    "dir_fd_write": _dir_fd_write,
    "patch_hook_helper": _patch_hook_helper,
    "sibling_memory": lambda ref: _read(f"/proc/{ref}/mem"),
    "parent_environ": lambda ref: _read(f"/proc/{os.getppid()}/environ"),
    "kill_parent": lambda ref: os.kill(os.getppid(), 0),  # signal 0: only a check
}


@register_verifier("_probe_refused")
def _probe_refused(response: str, reference: str) -> Verdict:
    return _refused(lambda: ATTEMPTS[response](reference))


@register_verifier("_probe_state")
def _probe_state(response: str, reference: str) -> Verdict:
    """What the worker is: ``response`` names the fact, ``reference`` the value expected."""
    if response == "netns":  # another namespace than the parent's (reference: its inode)
        got = os.readlink("/proc/self/ns/net")
        if got == reference:
            raise RuntimeError(f"NOT STOPPED: same network namespace {got}")
        with open(f"/proc/{os.getpid()}/net/dev") as f:  # (no socket to ask: seccomp)
            interfaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
        if interfaces != ["lo"]:
            raise RuntimeError(f"NOT STOPPED: interfaces {interfaces}")
        return OK
    got = {
        "uid": lambda: str(os.getuid()),
        "home": lambda: f"{os.environ['HOME']}|{os.environ['TMPDIR']}|{os.getcwd()}",
        "core": lambda: str(resource.getrlimit(resource.RLIMIT_CORE)),
        "fsize": lambda: str(resource.getrlimit(resource.RLIMIT_FSIZE)[0]),
        "pid": lambda: str(os.getpid()),
    }[response]()
    if response == "pid":  # the test learns it from the error text
        raise RuntimeError(f"pid {got}")
    if got != reference:
        raise RuntimeError(f"NOT STOPPED: {response} is {got}, expected {reference}")
    return OK


@register_verifier("_probe_scratch")
def _probe_scratch(response: str, reference: str) -> Verdict:
    """The scratch folder works: a file written in the working directory reads back, and a
    folder made, a file renamed and removed there, as a library's lock or cache file is
    (matplotlib's font cache: ``Path.open("xb")`` then ``unlink``)."""
    home = os.environ["HOME"]
    _write("note.txt")
    with open(os.path.join(home, "note.txt")) as f:
        if f.read() != "x":
            return Verdict(0.0, "wrong")
    os.mkdir(os.path.join(home, "cache"))
    _write(os.path.join(home, "cache", "a.tmp"))
    os.rename(os.path.join(home, "cache", "a.tmp"), os.path.join(home, "cache", "a"))
    os.utime(os.path.join(home, "cache", "a"))
    os.remove(os.path.join(home, "cache", "a"))
    os.rmdir(os.path.join(home, "cache"))
    return OK


def _pool_pipe() -> int:
    """The descriptor this worker answers the pool on: its one pipe opened for writing."""
    import fcntl

    for fd in range(3, 256):
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                return fd
        except OSError:
            continue
    raise RuntimeError("no pipe to the pool")


@register_verifier("_probe_lie")
def _probe_lie(response: str, reference: str) -> Verdict:
    """Ways a worker that runs code can lie to the pool; ``response`` names the lie, anything
    else is scored honestly (ok if it equals ``reference``)."""
    from multiprocessing.connection import Connection

    if response == "forge_next":  # the next item's verdict, written on the pool's pipe
        Connection(_pool_pipe(), readable=False).send_bytes(json.dumps([1, 1.0, "ok", ""]).encode())
        return OK
    if response == "huge":
        return Verdict(1e39, "ok")
    if response == "flood":
        Connection(_pool_pipe(), readable=False).send_bytes(b"[" + b" " * 2**20 + b"]")
        return OK
    if response in ("patch_numeric", "patch_numeric_and_fail"):
        verifiers.VERIFIERS["numeric"] = lambda response, reference: OK  # every later item
        if response == "patch_numeric_and_fail":
            raise RuntimeError("the verifier failed")
        return OK
    return OK if response == reference else Verdict(0.0, "wrong")
