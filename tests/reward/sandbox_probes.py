"""Verifiers that try, from inside a pool worker, what its sandbox must stop (loaded in workers
via AVSPO_VERIFIER_MODULES). Each returns ``ok`` when it was stopped and raises (an ``error``
verdict, its text in ``pool.last_errors``) when it got through. ``response`` names the attempt;
``reference`` carries what the test knows (a path outside, the parent's network namespace)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess

from reward.verifiers import Verdict, register_verifier

OK = Verdict(1.0, "ok")


def _refused(attempt) -> Verdict:
    try:
        attempt()
    except OSError:  # PermissionError from the hook; ENETUNREACH, EACCES from the kernel
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


ATTEMPTS = {
    "os.system": lambda ref: os.system("true"),
    "subprocess": lambda ref: subprocess.run(["true"], check=False),
    "fork": lambda ref: _fork(),
    "socket": lambda ref: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
    "unix_socket": lambda ref: socket.socket(socket.AF_UNIX).connect(ref),
    "ctypes": lambda ref: _ctypes_system(),
    "write_outside": _write,
    "remove_outside": os.remove,
    "symlink": lambda ref: os.symlink(ref, "link"),
    "read_outside": _read,
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
        interfaces = [name for _, name in socket.if_nameindex()]
        if interfaces != ["lo"]:
            raise RuntimeError(f"NOT STOPPED: interfaces {interfaces}")
        return OK
    got = {
        "uid": lambda: str(os.getuid()),
        "home": lambda: f"{os.environ['HOME']}|{os.environ['TMPDIR']}|{os.getcwd()}",
        "core": lambda: str(resource.getrlimit(resource.RLIMIT_CORE)),
        "fsize": lambda: str(resource.getrlimit(resource.RLIMIT_FSIZE)[0]),
    }[response]()
    if got != reference:
        raise RuntimeError(f"NOT STOPPED: {response} is {got}, expected {reference}")
    return OK


@register_verifier("_probe_scratch")
def _probe_scratch(response: str, reference: str) -> Verdict:
    """The scratch folder works: a file written in the working directory reads back."""
    _write("note.txt")
    with open(os.path.join(os.environ["HOME"], "note.txt")) as f:
        return OK if f.read() == "x" else Verdict(0.0, "wrong")
