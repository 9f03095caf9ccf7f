"""The verifier workers' sandbox: defence in depth behind the answer pre-checks.

Model text reaches third-party scorers (reward/gym_audit.py keeps the ones that could evaluate
it behind a whitelist). Should code run inside a worker all the same, the worker
(reward/verifier_worker.py) holds, from its start:

- **no network**: its own network namespace (``unshare(CLONE_NEWNET)``; unprivileged, inside
  its own user namespace), where no interface is up, not even loopback: neither the internet
  nor Ray's, the learner's or the rendezvous servers on 127.0.0.1 can be reached;
- **another user** when started as root: uid/gid ``nobody``, no supplementary groups, so files
  only root may read (``/root``, ``~/.cache/huggingface/token``, a 0600 checkpoint) stay shut.
  Import folders only root can reach (a pyenv Python under /root) are opened before the switch
  and read through their descriptors (``/proc/self/fd/N``);
- **a scratch folder** as HOME, TMPDIR and working directory, made for the worker, removed with
  it, not on ``sys.path``;
- **resource limits**: address space (RLIMIT_AS), CPU seconds per item (RLIMIT_CPU), 64 MiB
  per written file (RLIMIT_FSIZE), no core dumps;
- **a Python audit hook** (``sys.addaudithook``) refusing process creation (``os.system``,
  ``subprocess``, ``fork``, ``exec``, ``kill``), every socket, ``ctypes`` (loading or calling
  native code), writes, deletes, renames and links outside the scratch folder, and reads
  outside the interpreter's folders, the project's packages and a few system folders.

:func:`enter` and :func:`install_hook` return what is in force, and say why where something is
not (a kernel without unprivileged user namespaces, not root, no ``nobody``); the pool logs it
once and keeps it (``VerifierPool.protections``); ``python -m reward.pool`` prints it.

What it does not do: the audit hook acts on Python's own calls only (native code, or a bug in
the interpreter, is out of its reach, which is why ``ctypes`` is refused), and a process that
runs code can lie about its own verdict (it holds the pipe to the pool): the sandbox protects
the machine and its secrets, not the reward of the item that ran. Files other users may read
(mode 0644) are shut to the hook only, not to the kernel.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from comm.orphans import orphans

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_DUMPABLE = 4
UNPRIVILEGED_USER = "nobody"
FILE_SIZE_LIMIT = 64 * 2**20
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


SCRATCH_PREFIX = "avspo-verifier-"


def make_scratch() -> tuple[str, int | None, int | None]:
    """The parent's part: a fresh scratch folder (named after this process: see
    :func:`sweep_scratch`), and the uid/gid the worker becomes (``nobody`` when this process is
    root; it then owns the folder), or None."""
    folder = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    if os.geteuid() != 0:
        return folder, None, None
    import pwd

    try:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return folder, None, None
    os.chown(folder, user.pw_uid, user.pw_gid)
    return folder, user.pw_uid, user.pw_gid


def remove_scratch(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_scratch() -> int:
    """Remove the scratch folders of pools whose process is gone (a Ray actor killed with its
    workers: SIGKILL leaves no one to clean up); returns how many. Run when a pool starts."""
    gone = orphans(tempfile.gettempdir(), SCRATCH_PREFIX)
    for path in gone:
        remove_scratch(str(path))
    return len(gone)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_name() -> str:
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def _isolate_network() -> str:
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return "in force: own network namespace"
    first = _errno_name()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return (
            f"OFF: unshare(CLONE_NEWNET) failed ({first}), with CLONE_NEWUSER too "
            f"({_errno_name()}): this kernel or container allows neither"
        )
    try:  # map our own ids, or files created in the scratch folder fail (EOVERFLOW)
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as err:
        return f"in force: own network namespace (in a user namespace; ids unmapped: {err})"
    return "in force: own network namespace (in its own user namespace)"


def _others_can_read(folder: str) -> bool:
    """Whether a user with no rights of its own can list ``folder`` (every ancestor searchable
    by others, the folder readable and searchable)."""
    path = Path(folder).absolute()
    for i, part in enumerate([path, *path.parents]):
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH or (i == 0 and not mode & stat.S_IROTH):
            return False
    return True


def _reach_import_folders() -> int:
    """Import folders only root can reach, opened now and read through their descriptors
    after the switch (``sys.path`` and the ``__path__`` of packages imported so far)."""
    remap: dict[str, str] = {}
    for i, entry in enumerate(sys.path):
        if entry and os.path.isdir(entry) and not _others_can_read(entry):
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)  # not inherited
            remap[entry] = sys.path[i] = f"/proc/self/fd/{fd}"
    if not remap:
        return 0

    def moved(path: str) -> str:
        for old, new in remap.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [moved(p) for p in search]
    return len(remap)


def _drop_user(uid: int | None, gid: int | None) -> str:
    if os.geteuid() != 0:
        return f"in force: uid {os.geteuid()} (not root)"
    if uid is None or gid is None:
        return f"OFF: running as root (no user {UNPRIVILEGED_USER!r} to switch to)"
    reached = _reach_import_folders()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    # a uid change makes the process non-dumpable: /proc/self (its descriptors) becomes root's
    _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    note = f"; {reached} import folder(s) read through descriptors" if reached else ""
    return f"in force: uid {uid} ({UNPRIVILEGED_USER}), was root{note}"


def enter(scratch: str, uid: int | None = None, gid: int | None = None) -> dict[str, str]:
    """The worker's first act (single-threaded, before its imports): network namespace, rlimits,
    user, scratch folder. Returns what is in force, by protection."""
    here = {"", ".", scratch, os.path.realpath(scratch)}
    sys.path[:] = [p for p in sys.path if p not in here]  # `-m` put the cwd (scratch) first
    done = {"network": _isolate_network()}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard == resource.RLIM_INFINITY or hard > FILE_SIZE_LIMIT:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    done["user"] = _drop_user(uid, gid)
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch
    done["home"] = f"in force: HOME, TMPDIR and working directory {scratch}"
    return done


def read_roots(scratch: str) -> tuple[str, ...]:
    """Folders the hook lets a worker read: the interpreter's, the project's packages, the
    other ``sys.path`` folders (PYTHONPATH, user site), a few system ones, and the scratch."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, scratch}
    roots |= {"/usr", "/lib", "/lib64", "/etc", "/dev/null", "/dev/urandom", "/dev/random"}
    project = str(_PROJECT_ROOT)
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real == project:  # its packages only: not its run outputs or checkpoints
            roots |= {str(p) for p in _PROJECT_ROOT.iterdir() if (p / "__init__.py").is_file()}
        elif real and os.path.isdir(real):
            roots.add(real)
    return tuple(sorted(os.path.realpath(r) for r in roots))


def _events(names: str) -> frozenset[str]:
    return frozenset(names.split())


_PROCESS = _events(
    "os.system os.exec os.spawn os.posix_spawn os.fork os.forkpty os.kill os.killpg "
    "subprocess.Popen pty.spawn os.startfile signal.pthread_kill"
)
_NATIVE = _events("ctypes.dlopen ctypes.dlsym ctypes.dlsym/handle ctypes.call_function")
_PATH_WRITES = _events(
    "os.remove os.rmdir os.mkdir os.chmod os.chown os.truncate os.utime shutil.rmtree"
)
_TWO_PATHS = frozenset({"os.rename", "os.link", "os.symlink"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(os.fsdecode(path))
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def _hook(
    event: str,
    args: tuple,
    scratch: tuple[str, ...] = (),
    readable: tuple[str, ...] = (),
    me=None,
    inside=_inside,
) -> None:
    """Installed with its folders, itself and its helper bound as defaults (a function's
    defaults and code are replaced only through an audited ``object.__setattr__``, refused
    below). A tripwire for Python code, not a wall: code aimed at it can still patch what it
    calls (``os.path``); the namespace, the uid and the rlimits are the kernel's."""
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if isinstance(path, int):
            if writing:
                raise PermissionError(f"sandbox: writing to descriptor {path} is refused")
            return
        if not inside(path, scratch if writing else readable):
            what = "writing" if writing else "reading"
            raise PermissionError(f"sandbox: {what} {path!r} is refused")
    elif event in _PROCESS:
        raise PermissionError(f"sandbox: {event} is refused")
    elif event.startswith("socket."):
        raise PermissionError(f"sandbox: {event} is refused (no network)")
    elif event in _NATIVE:
        raise PermissionError(f"sandbox: {event} is refused (native code)")
    elif event in _PATH_WRITES:
        if not isinstance(args[0], int) and not inside(args[0], scratch):
            raise PermissionError(f"sandbox: {event} {args[0]!r} is refused")
    elif event in _TWO_PATHS:
        if event != "os.rename" or not all(inside(p, scratch) for p in args[:2]):
            raise PermissionError(f"sandbox: {event} {args[:2]!r} is refused")
    elif event == "object.__setattr__" and args[0] is me:
        raise PermissionError("sandbox: the audit hook cannot be changed")


def install_hook(scratch: str) -> str:
    """Install the audit hook (after the worker's imports; imports later, such as a verifier's
    warm-up, read from the allowed folders). Returns what it refuses."""
    real = os.path.realpath(scratch)
    _hook.__defaults__ = ((real,), read_roots(scratch), _hook, _inside)
    sys.addaudithook(_hook)
    return (
        "in force: refuses processes, sockets, ctypes, writes outside the scratch folder, "
        "reads outside the interpreter, the project's packages and system folders"
    )
