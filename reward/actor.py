"""The verifier pool behind a Ray actor: the driver sends a step's responses, the actor scores
them in its killable worker processes (reward/pool.py) and returns verdicts."""

from __future__ import annotations

import json
import os

from reward.custom import ENV
from reward.pool import PoolConfig, VerifierPool
from reward.verifiers import Verdict


class VerifierActor:
    def __init__(self, cfg: PoolConfig, reward_functions: list[str] | None = None):
        """``reward_functions``: specs (``module:function``, ``file.py:function``) the pool and
        its workers register as verifiers (reward/custom.py)."""
        if reward_functions:
            os.environ[ENV] = json.dumps(reward_functions)
        self.pool = VerifierPool(cfg)

    def verify(
        self,
        responses: list[str],
        references: list[str],
        verifier: str,
        timeout_s: float | None = None,
        *,
        lowest: float = 0.0,
        highest: float = 1.0,
    ) -> tuple[list[Verdict], int, list[str]]:
        """Verdicts in order (a timeout, crash or error scores ``lowest``, the task's lowest
        reward; a score outside ``[lowest, highest]`` is an error), with the pool's health in
        the same answer: the worker processes it replaced so far and this call's error texts
        (reward/health.py)."""
        verdicts = self.pool.verify(
            responses,
            references,
            verifier=verifier,
            timeout_s=timeout_s,
            lowest=lowest,
            highest=highest,
        )
        return verdicts, self.pool.replaced, list(self.pool.last_errors)
