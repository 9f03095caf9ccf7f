"""Entry point of one verifier worker process: ``python -m reward.verifier_worker R W MEM``.

Reads JSON items ``[idx, verifier, response, reference]`` from file descriptor R, writes JSON
results ``[idx, score, reason, error_text]`` to W, until it reads ``null`` or R closes. Its
address space is capped at MEM bytes (RLIMIT_AS). JSON, not pickle, both ways: the parent never
unpickles anything that touched model text.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import sys
from multiprocessing.connection import Connection


def main(read_fd: int, write_fd: int, memory_bytes: int) -> None:
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit already set: keep it
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" warnings
    from reward.verifiers import VERIFIERS, load_verifier_modules, verify_math

    load_verifier_modules()
    verify_math("\\boxed{x^2}", "x^2")  # warm up math-verify (first call ~75 ms)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    outbox.send_bytes(b'"ready"')
    while True:
        try:
            msg = json.loads(inbox.recv_bytes())
        except EOFError:
            return
        if msg is None:
            return
        idx, verifier, response, reference = msg
        try:
            verdict = VERIFIERS[verifier](response, reference)
            result = [idx, float(verdict.score), verdict.reason, ""]
        except BaseException as exc:  # MemoryError, RecursionError, anything: the item errs
            result = [idx, 0.0, "error", f"{type(exc).__name__}: {str(exc)[:200]}"]
        outbox.send_bytes(json.dumps(result).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
