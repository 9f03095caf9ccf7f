"""One step's rollouts as the driver hands them on: problems, groups, verdicts, which groups are
trained, and what generating them took. A checkpoint keeps the one-step mode's pending batch in
this form (``state_dict``)."""

from __future__ import annotations

import dataclasses

from reward.tasks import Problem
from reward.verifiers import Verdict
from rollout.types import Group, Sample


@dataclasses.dataclass
class Rollouts:
    """Every group one step generated, with problems and verdicts, which of them are trained
    (DAPO's selection; all otherwise), and what it took."""

    problems: list[Problem]
    groups: list[Group]
    verdicts: list  # sample order
    trained: list[bool]  # per group
    metrics: dict[str, float]

    def state_dict(self) -> dict:
        """JSON-ready (a checkpoint's sidecar): problems by uid, groups and verdicts as fields
        (Python floats round-trip exactly through JSON)."""
        return {
            "uids": [p.uid for p in self.problems],
            "groups": [dataclasses.asdict(g) for g in self.groups],
            "verdicts": [dataclasses.asdict(v) for v in self.verdicts],
            "trained": self.trained,
            "metrics": self.metrics,
        }

    @classmethod
    def from_state(cls, state: dict, problems: dict[str, Problem]) -> Rollouts:
        groups = [
            Group(g["prompt"], g["prompt_ids"], [Sample(**x) for x in g["samples"]])
            for g in state["groups"]
        ]
        return cls(
            [problems[uid] for uid in state["uids"]],
            groups,
            [Verdict(**v) for v in state["verdicts"]],
            list(state["trained"]),
            dict(state["metrics"]),
        )
