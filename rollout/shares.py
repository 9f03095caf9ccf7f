"""How a call's samples are spread over the rollout workers, and put back into groups.

A call of P prompts x n samples is P * n samples in (prompt, sample) order. Worker i of k gets
the samples ``[round(i * P * n / k), round((i + 1) * P * n / k))`` of that order: shares equal
within one sample, so with one prompt of 8 samples on 4 workers each generates 2, and with 64
prompts on 8 workers each generates 8 whole groups. A worker's call is a list of
:class:`Share`: samples ``[start, stop)`` of the prompt at ``position`` of the call; a worker
holds at most one share of a prompt, and only the first and last of its shares can be part of a
group. Sample j of the prompt at position p draws from the stream ``sample_seed(s, p, j)``
whoever generates it (rollout/seeding.py), so the groups do not depend on the number of workers;
one worker gets ``Share(p, 0, n)`` for every prompt: the requests (and seeds) of an unsplit call.

>>> split(1, 8, 4)
[[Share(position=0, start=0, stop=2)], [Share(position=0, start=2, stop=4)], \
[Share(position=0, start=4, stop=6)], [Share(position=0, start=6, stop=8)]]
>>> [[(s.position, s.start, s.stop) for s in shares] for shares in split(3, 2, 2)]
[[(0, 0, 2), (1, 0, 1)], [(1, 1, 2), (2, 0, 2)]]
"""

from __future__ import annotations

from rollout.types import Group, Share


def whole(prompts: int, n: int) -> list[Share]:
    """Every sample of each of ``prompts`` prompts: what a call without shares generates."""
    return [Share(p, 0, n) for p in range(prompts)]


def split(prompts: int, n: int, workers: int) -> list[list[Share]]:
    """Per worker, its shares of ``prompts`` x ``n`` samples (empty where there are fewer
    samples than workers), contiguous in (prompt, sample) order."""
    total = prompts * n
    out = []
    for i in range(workers):
        first, end = round(i * total / workers), round((i + 1) * total / workers)
        shares = []
        while first < end:
            p, j = divmod(first, n)
            stop = min(end, (p + 1) * n) - p * n
            shares.append(Share(p, j, stop))
            first = p * n + stop
        out.append(shares)
    return out


class Assembler:
    """Puts each prompt's group back together from its pieces, in sample order.

    >>> from rollout.types import Sample
    >>> piece = lambda j: Group("1+1=", [1, 5], [Sample([j], [0.0], str(j), "stop", 0)])
    >>> a = Assembler([Share(0, 1, 2), Share(0, 0, 1)])
    >>> a.add(Share(0, 1, 2), piece(1)) is None  # sample 0 missing
    True
    >>> [s.text for s in a.add(Share(0, 0, 1), piece(0)).samples]
    ['0', '1']
    """

    def __init__(self, shares: list[Share]):
        """``shares``: every share of the call (all workers')."""
        self.expected: dict[int, set[int]] = {}  # prompt position -> starts of its shares
        for s in shares:
            self.expected.setdefault(s.position, set()).add(s.start)
        self.pieces: dict[int, dict[int, Group]] = {p: {} for p in self.expected}

    def add(self, share: Share, piece: Group) -> Group | None:
        """Keep ``piece`` (the samples of ``share``; one already received is ignored: a
        restarted worker generates its shares again). Returns the prompt's whole group once its
        last piece is in, else None."""
        if len(piece.samples) != share.stop - share.start:
            raise ValueError(f"{share}: {len(piece.samples)} samples came back")
        got = self.pieces[share.position]
        if share.start in got:
            return None
        got[share.start] = piece
        if set(got) != self.expected[share.position]:
            return None
        parts = [got[start] for start in sorted(got)]
        samples = [s for part in parts for s in part.samples]
        return Group(prompt=parts[0].prompt, prompt_ids=parts[0].prompt_ids, samples=samples)
