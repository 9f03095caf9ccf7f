"""Tasks, answer extraction, process-isolated verifiers and intrinsic rewards.

>>> [v.reason for v in verify(["12+7=19", "12+7=18", "?"], ["19"] * 3, verifier="numeric")]
['ok', 'wrong', 'no_answer']
"""

from __future__ import annotations

from reward.verifiers import Verdict


def verify(
    responses: list[str],
    references: list[str],
    *,
    verifier: str = "math",
    timeout_s: float = 2.0,
    lowest: float = 0.0,
    highest: float = 1.0,
) -> list[Verdict]:
    """Score each response against its reference in killable worker processes (docs/ARCHITECTURE.md
    section 9).

    ``verifier`` names a verifier of :data:`reward.verifiers.VERIFIERS`: ``numeric``, ``math``,
    ``reasoning_gym``, ``choice`` (an option letter A-J), or the boxed-only variant of one,
    ``<name>_boxed`` (only a complete final ``\\boxed{...}`` is an answer). A task's own is
    ``make_task(cfg).verifier`` (``task.verifier`` with ``task.answer_extraction`` applied).

    Every item gets a wall-clock timeout. A timeout, a crashed worker, an exception inside the
    verifier or an answer from a worker that is not a score in ``[lowest, highest]`` gives
    ``Verdict(lowest, "timeout" | "error")``: ``lowest, highest`` is the task's reward range
    (``task.reward_range``; default 0.0, 1.0). A wrong or unparseable
    answer gets the verifier's own score with reason "wrong" or "no_answer"; an answer that a
    reasoning_gym scorer would evaluate and that holds what the task's answers never hold gets 0,
    reason "refused" (reward/gym_audit.py). It never raises for
    bad model text and works from any thread. Uses the process-wide
    :func:`reward.pool.default_pool`.
    """
    from reward.pool import default_pool

    return default_pool().verify(
        responses,
        references,
        verifier=verifier,
        timeout_s=timeout_s,
        lowest=lowest,
        highest=highest,
    )


__all__ = ["Verdict", "verify"]
