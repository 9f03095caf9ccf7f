"""The kernel's part of the verifier sandbox: seccomp-bpf and Landlock, set up through two small,
maintained libraries rather than hand-written syscalls.

- **seccomp-bpf** (``pyseccomp``: libseccomp, the library behind Docker's, systemd's and
  Chrome's filters, driven through ctypes with the API of libseccomp's own Python bindings).
  After ``PR_SET_NO_NEW_PRIVS`` the worker may not: run a program (``execve``, ``execveat``),
  create a process (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``; ``clone3``
  answers ENOSYS, so threads fall back to ``clone``), open a socket of any family
  (``socket``, ``socketpair``), reach another process's memory (``ptrace``,
  ``process_vm_readv/writev``, ``pidfd_getfd``, ``kcmp``), change a resource limit but its
  own CPU-time one (``setrlimit``, ``prlimit64`` with a new limit; the kernel keeps the hard
  CPU limit from rising), signal any process but itself (``kill``, ``tgkill``,
  ``rt_(tg)sigqueueinfo`` elsewhere; ``tkill``, ``pidfd_send_signal``), change ids,
  namespaces, mounts or the root (``set*id``, ``unshare``, ``setns``, ``mount``,
  ``pivot_root``, ``chroot``...), load BPF, kernel modules or keys, use io_uring (which would
  bypass this filter), open files by handle, or push input into a terminal
  (``ioctl(TIOCSTI)``). A refused call fails with EPERM; a call of another architecture
  (32-bit or x32) kills the process.
- **Landlock** (``landlock``: the Landlock LSM's Python interface, ctypes over its three
  syscalls). The worker may read files only beneath the folders it names (the interpreter, the
  import folders, the project's packages, a few system folders) and write only in its scratch
  folder (and ``/dev/null``). Landlock also confines ``ptrace``: a worker cannot open a sibling
  worker's or the pool's ``/proc/<pid>/mem`` (each worker is its own domain).

Each setter returns "in force: ..." or "OFF: <why>" (a kernel without Landlock, a container whose
seccomp profile refuses it, libseccomp missing); reward/sandbox.py collects them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib
import os

CLONE_THREAD = 0x00010000
RLIMIT_CPU = 0
TIOCSTI = 0x5412

DENIED = (  # noqa: SIM905  (a list of 57 names reads better as words)
    "execve execveat fork vfork socket socketpair ptrace process_vm_readv process_vm_writev "
    "pidfd_getfd kcmp setrlimit tkill pidfd_send_signal setuid setgid setreuid setregid "
    "setresuid setresgid setgroups setfsuid setfsgid unshare setns mount umount2 pivot_root "
    "chroot move_mount open_tree fsopen fsmount fspick mount_setattr bpf perf_event_open "
    "userfaultfd keyctl add_key request_key io_uring_setup io_uring_enter io_uring_register "
    "init_module finit_module delete_module kexec_load kexec_file_load reboot swapon swapoff "
    "acct quotactl name_to_handle_at open_by_handle_at personality"
).split()
"""System calls refused outright (EPERM)."""


def _fail(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(exc).__name__}{f' {name}' if name else ''}: {exc}"[:200]


def load_libraries() -> None:
    """Import both libraries while the worker may still run programs: pyseccomp finds
    libseccomp through ``ctypes.util.find_library``, which runs ``ldconfig``. A missing one is
    reported by its installer below."""
    for name in ("pyseccomp", "landlock"):
        with contextlib.suppress(ImportError, OSError, RuntimeError):
            importlib.import_module(name)


def install_seccomp() -> str:
    """Load the worker's seccomp filter (after its imports, its user switch and Landlock: those
    need calls it refuses). Returns what is in force, or OFF and why."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:  # no libseccomp.so.2 on this machine
        return f"OFF: seccomp: pyseccomp/libseccomp unavailable ({_fail(exc)})"
    deny = sc.ERRNO(errno.EPERM)
    me = os.getpid()
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        skipped = []
        for name in DENIED:
            try:
                f.add_rule(deny, name)
            except (ValueError, OSError):  # a call this libseccomp does not know: none to refuse
                skipped.append(name)
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags sit in memory: not checkable
        # reading a limit stays allowed, and so does setting its own CPU limit (the soft one
        # before each item; the kernel lets no unprivileged process raise the hard one)
        f.add_rule(deny, "prlimit64", sc.Arg(2, sc.NE, 0), sc.Arg(1, sc.NE, RLIMIT_CPU))
        f.add_rule(deny, "prlimit64", sc.Arg(2, sc.NE, 0), sc.Arg(0, sc.NE, 0))
        for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            f.add_rule(deny, name, sc.Arg(0, sc.NE, me))
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
        f.load()
    except (OSError, ValueError, RuntimeError) as exc:
        return f"OFF: seccomp filter not loaded ({_fail(exc)})"
    unknown = f"; unknown here: {' '.join(skipped)}" if skipped else ""
    return (
        "in force (seccomp-bpf via libseccomp): no exec, no process but threads, no socket, "
        "no ptrace or process_vm, no rlimit change but its own CPU time's, signals to itself "
        f"only, no id, namespace or mount change, no bpf/io_uring/modules/keys{unknown}"
    )


def install_landlock(readable: list[str], writable: str) -> str:
    """Restrict this process (and threads it starts later) to reading beneath ``readable`` and
    writing beneath ``writable``. Paths are opened now, with this process's rights (before a
    user switch: folders only root can enter are named while it still can)."""
    try:
        import landlock
        from landlock import FSAccess
    except ImportError as exc:
        return f"OFF: Landlock: the landlock package is not installed ({_fail(exc)})"
    # landlock 1.0.0.dev5 takes any non-zero ctypes errno for a failure, even after a call that
    # succeeded: a stale one (the failed unshare(CLONE_NEWNET) of a non-root worker) is cleared
    ctypes.set_errno(0)
    try:
        abi = landlock.landlock_abi_version()
    except OSError as exc:  # ENOSYS: not built in; EOPNOTSUPP: not enabled at boot; EPERM: seccomp
        return f"OFF: Landlock unavailable on this kernel or in this container ({_fail(exc)})"
    read = FSAccess.READ_FILE | FSAccess.READ_DIR
    try:
        rules = landlock.Ruleset()  # every filesystem right of this ABI handled: denied unless
        for path in readable:
            if os.path.exists(path):
                ctypes.set_errno(0)
                rules.allow(path, rules=read if os.path.isdir(path) else FSAccess.READ_FILE)
        rules.allow(writable)  # every right beneath the scratch folder
        rules.allow("/dev/null", rules=FSAccess.READ_FILE | FSAccess.WRITE_FILE)
        ctypes.set_errno(0)
        rules.apply()
    except OSError as exc:
        return f"OFF: Landlock ruleset refused ({_fail(exc)})"
    return (
        f"in force (Landlock ABI {abi}): reads beneath {len(readable)} folders, writes in the "
        "scratch folder only; no ptrace of processes outside its domain"
    )
