"""The verifier workers' sandbox: defence in depth behind the answer pre-checks.

Model text reaches third-party scorers (reward/gym_audit.py keeps the ones that could evaluate
it behind a whitelist). Should code run inside a worker all the same, assume it does: the worker
(reward/verifier_worker.py) is confined by the kernel, not by Python. In order:

1. **Nothing runs before the sandbox.** The pool starts the worker in isolated mode
   (``python -I``: no PYTHONPATH, no user site, no current folder on ``sys.path``) from a
   folder of the pool's own that no worker can write, with its import path given explicitly;
   the scratch folder does not exist yet.
2. **No network**: its own network namespace (``unshare(CLONE_NEWNET)``, inside its own user
   namespace when not root): no interface is up, not even loopback.
3. **Its imports**, then **a scratch folder** it makes inside the pool's folder (HOME, TMPDIR
   and working directory; owned by the worker's user; removed with it).
4. **Resource limits**: address space, a CPU-time ceiling for its whole life (hard: it cannot
   be raised; the worker sets the soft limit before each item), 64 MiB per written file,
   no core dumps.
5. **Landlock** (reward/kernel.py): reads only beneath the interpreter's, the import and the
   project's package folders and a few system ones; writes only in the scratch folder; no
   ptrace of a process outside its own domain (a sibling worker, the pool).
6. **Another user** when started as root: uid/gid ``nobody``, no supplementary groups. Import
   folders only root can enter (a clone under /root) are opened before the switch and read
   through their descriptors (``/proc/self/fd/N``).
7. **seccomp-bpf** (reward/kernel.py): no exec, no process creation, no socket, no ptrace, no
   rlimit change, no signal to another process.
8. **A Python audit hook** (``sys.addaudithook``), a second line: it refuses process creation,
   sockets, ``ctypes``, writes outside the scratch folder, reads (and listings) outside the
   allowed folders, any call with a ``dir_fd`` and any low-level ``os.open`` of a relative path,
   and changes to a function's code (or to its own defaults).

Each step reports what is in force or "OFF: <why>" (a kernel or container that does not allow
it, "not root: no user switch"). The pool keeps the report (``VerifierPool.protections``), warns
once naming what is OFF, or refuses to start with ``verifier.sandbox=require``; ``python -m
reward.pool`` prints it.

What it does not protect: a worker that runs code can lie about the verdicts of the items it is
given (the pool checks each answer's form and range, and replaces a worker after any error or
timeout and after ``verifier.max_items_per_worker`` items, but a well-formed lie about an item
sent to it passes); files beneath the allowed folders that the worker's user may read
(``/etc``'s world-readable files, the interpreter's and the project's sources); CPU and memory
within its limits.
"""

from __future__ import annotations

import ctypes
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
SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/etc", "/dev/urandom", "/dev/random")
"""System folders and files a worker may read (shared libraries, locale and time zone data)."""

SCRATCH_PREFIX = "avspo-verifier-"
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")
"""Where a pool's folder goes when root's temp folder is shut to others (:func:`make_pool_dir`),
and so where :func:`sweep_scratch` looks too."""


def others_can_enter(folder: str) -> bool:
    """Whether a user with no rights of its own can reach ``folder`` by its path (it and every
    ancestor searchable by others)."""
    path = Path(folder).absolute()
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _others_can_read(folder: str) -> bool:
    return others_can_enter(folder) and bool(Path(folder).stat().st_mode & stat.S_IROTH)


def worker_ids() -> tuple[int | None, int | None]:
    """The uid/gid a worker switches to: ``nobody``'s when this process is root, else None."""
    if os.geteuid() != 0:
        return None, None
    import pwd

    try:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return None, None
    return user.pw_uid, user.pw_gid


def make_pool_dir() -> str:
    """The pool's folder (named after this process: see :func:`sweep_scratch`), owned by this
    process's user: workers start in it and each makes its scratch folder inside. Mode 0711 as
    root (a ``nobody`` worker reaches its own folder by name; it cannot list or create entries),
    0700 otherwise. It lives in the first temp folder other users can enter (a 0700 TMPDIR
    would shut a ``nobody`` worker out of its own scratch)."""
    base = tempfile.gettempdir()
    if os.geteuid() == 0 and not others_can_enter(base):
        base = next((d for d in SHARED_TEMP if others_can_enter(d)), base)
    folder = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=base)
    if os.geteuid() == 0:
        os.chmod(folder, 0o711)
    return folder


def remove_scratch(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_scratch() -> int:
    """Remove the folders of pools whose process is gone (a Ray actor killed with its workers:
    SIGKILL leaves no one to clean up); returns how many. Run when a pool starts."""
    folders = {tempfile.gettempdir(), *(d for d in SHARED_TEMP if os.path.isdir(d))}
    gone = [p for d in folders for p in orphans(d, SCRATCH_PREFIX)]
    for path in gone:
        remove_scratch(str(path))
    return len(gone)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_name() -> str:
    import errno

    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def isolate_network() -> str:
    """The worker's first act, while it has one thread (a user namespace needs it)."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return "in force (network namespace): no interface, not even loopback"
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
        return f"in force (network namespace in a user namespace; ids unmapped: {err})"
    return "in force (network namespace in its own user namespace): no interface"


def read_roots(scratch: str) -> list[str]:
    """Folders a worker may read, computed with the rights it starts with (before any user
    switch): the interpreter's, the project's packages (not its run outputs or checkpoints), the
    other ``sys.path`` folders, a few system ones, and the scratch. An entry that cannot be
    listed is skipped, never fatal."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, scratch}
    roots |= set(SYSTEM_READABLE) | {f"/proc/{os.getpid()}"}
    project = str(_PROJECT_ROOT)
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real == project:
            try:
                roots |= {str(p) for p in _PROJECT_ROOT.iterdir() if (p / "__init__.py").is_file()}
            except OSError:
                continue
        elif real and os.path.exists(real):
            roots.add(real)
    return sorted({os.path.realpath(r) for r in roots if os.path.exists(r)})


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


def _drop_user(uid: int | None, gid: int | None, reached: int) -> str:
    """Switch to ``uid``/``gid`` (``reached``: import folders now read through descriptors)."""
    if os.geteuid() != 0:
        return f"OFF: not root: no user switch (runs as uid {os.geteuid()})"
    if uid is None or gid is None:
        return f"OFF: running as root (no user {UNPRIVILEGED_USER!r} to switch to)"
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if reached:  # a uid change makes /proc/self root's: its descriptors need it dumpable
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # (Landlock still shuts out other processes)
    note = f"; {reached} import folder(s) read through descriptors" if reached else ""
    return f"in force (setuid): uid {uid} ({UNPRIVILEGED_USER}), was root{note}"


def _make_scratch(pool_dir: str, name: str, uid: int | None, gid: int | None) -> str:
    scratch = os.path.join(pool_dir, name)
    os.mkdir(scratch, 0o700)  # fails if anything is there already
    if uid is not None and gid is not None and os.geteuid() == 0:
        os.chown(scratch, uid, gid)
    return scratch


def _limit(memory_bytes: int, cpu_seconds: int) -> str:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard == resource.RLIM_INFINITY or hard > FILE_SIZE_LIMIT:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    for limit, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds)):
        _, hard = resource.getrlimit(limit)
        if hard == resource.RLIM_INFINITY or hard > value:  # a lower hard limit already: kept
            resource.setrlimit(limit, (value, value))
    space, cpu = (resource.getrlimit(r)[1] for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU))
    return (
        f"in force (setrlimit, hard): address space {space // 2**20} MiB, {cpu} CPU s in all "
        "(soft: a few more before each item), written files "
        f"{FILE_SIZE_LIMIT // 2**20} MiB, no core dumps"
    )


def enter(
    pool_dir: str,
    name: str,
    uid: int | None,
    gid: int | None,
    memory_bytes: int,
    cpu_seconds: int,
) -> tuple[dict[str, str], str, list[str]]:
    """Steps 3-7 of the module docstring, after the worker's imports (its network namespace is
    already in place). Returns what is in force, by protection, the scratch folder and the
    folders it may read (for :func:`install_hook`)."""
    from reward import kernel

    kernel.load_libraries()
    done: dict[str, str] = {}
    scratch = _make_scratch(pool_dir, name, uid, gid)
    readable = read_roots(scratch)
    switching = os.geteuid() == 0 and uid is not None and gid is not None
    reached = _reach_import_folders() if switching else 0  # before Landlock shuts the rest
    done["rlimits"] = _limit(memory_bytes, cpu_seconds)
    done["landlock"] = kernel.install_landlock(readable, scratch)
    done["user"] = _drop_user(uid, gid, reached)
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = os.environ["MPLCONFIGDIR"] = scratch
    tempfile.tempdir = scratch
    done["scratch"] = (
        "in force: started isolated (python -I) outside it; HOME, TMPDIR and working "
        f"directory {scratch}, made after the imports"
    )
    done["seccomp"] = kernel.install_seccomp()
    return done, scratch, readable


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
_PATH_READS = _events("os.listdir os.scandir glob.glob")
_TWO_PATHS = frozenset({"os.rename", "os.link", "os.symlink"})
_DIR_FD_AT = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.chmod": 2, "os.chown": 3,
              "os.utime": 3, "os.rename": 2, "os.link": 2, "os.symlink": 2,
              "shutil.rmtree": 1}  # fmt: skip
"""Where each event carries its ``dir_fd`` (``os.rename``/``os.link``: two, from there); an
``os.*`` event gives -1 for none (``shutil.rmtree`` gives None)."""
_FUNCTION_PARTS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__globals__"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path, roots: tuple[str, ...], realpath=os.path.realpath, fsdecode=os.fsdecode) -> bool:
    real = realpath(fsdecode(path))
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def _hook(
    event: str,
    args: tuple,
    scratch: tuple[str, ...] = (),
    readable: tuple[str, ...] = (),
    inside=_inside,
    guarded: tuple = (),
) -> None:
    """Installed with its folders and helper bound as defaults (a function's code, and the
    defaults of the hook and its helper, are replaced only through an audited
    ``object.__setattr__``, refused below). A tripwire for
    Python code, not a wall: the walls are the kernel's (Landlock, seccomp, the uid)."""
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if isinstance(path, int):
            if writing:
                raise PermissionError(f"sandbox: writing to descriptor {path} is refused")
            return
        if mode is None and not os.path.isabs(os.fsdecode(path)):  # os.open: maybe a dir_fd
            raise PermissionError(f"sandbox: os.open of a relative path {path!r} is refused")
        if not inside(path, scratch if writing else readable):
            what = "writing" if writing else "reading"
            raise PermissionError(f"sandbox: {what} {path!r} is refused")
    elif event in _PROCESS:
        raise PermissionError(f"sandbox: {event} is refused")
    elif event.startswith("socket."):
        raise PermissionError(f"sandbox: {event} is refused (no network)")
    elif event in _NATIVE:
        raise PermissionError(f"sandbox: {event} is refused (native code)")
    elif event == "object.__setattr__":
        if args[1] == "__code__" or (args[0] in guarded and args[1] in _FUNCTION_PARTS):
            raise PermissionError(f"sandbox: setting {args[1]} of {args[0]!r} is refused")
    elif any(a not in (None, -1) for a in args[_DIR_FD_AT.get(event, len(args)) :]):
        raise PermissionError(f"sandbox: {event} with a dir_fd is refused")
    elif event in _PATH_WRITES:
        if not isinstance(args[0], int) and not inside(args[0], scratch):
            raise PermissionError(f"sandbox: {event} {args[0]!r} is refused")
    elif event in _PATH_READS:
        if not isinstance(args[0], int) and not inside(args[0] or ".", readable):
            raise PermissionError(f"sandbox: listing {args[0]!r} is refused")
    elif event in _TWO_PATHS and (
        event != "os.rename" or not all(inside(p, scratch) for p in args[:2])
    ):
        raise PermissionError(f"sandbox: {event} {args[:2]!r} is refused")


def install_hook(scratch: str, readable: list[str]) -> str:
    """Install the audit hook (after the worker's imports; imports later, such as a verifier's
    warm-up, read from the allowed folders). Returns what it refuses."""
    real = os.path.realpath(scratch)
    _hook.__defaults__ = ((real,), tuple(readable), _inside, (_hook, _inside))
    sys.addaudithook(_hook)
    return (
        "in force (sys.addaudithook, a second line): refuses processes, sockets, ctypes, "
        "writes outside the scratch folder, reads and listings outside the allowed folders, "
        "dir_fd calls, relative os.open, changes to a function's code or to its own defaults"
    )
