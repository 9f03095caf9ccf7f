"""rollout/shares.py: which worker generates which (prompt, sample), and the groups put back
together in sample order. Pure: no Ray, no engine."""

from __future__ import annotations

import itertools
import random

import pytest

from rollout.hf_engine import sample_generators
from rollout.shares import Assembler, split, whole
from rollout.types import Group, Sample, Share


def _owners(plan: list[list[Share]]) -> dict[tuple[int, int], int]:
    """(prompt, sample) -> the worker that generates it; each pair must come once."""
    owner = {}
    for worker, shares in enumerate(plan):
        for s in shares:
            for j in range(s.start, s.stop):
                assert (s.position, j) not in owner, (s, plan)
                owner[(s.position, j)] = worker
    return owner


def test_the_papers_batch_shape_gives_every_engine_a_share():
    # 1 prompt x 8 samples on 8 engines: one sample each (the old split by prompts gave
    # engine 0 all 8 and left seven idle); on 4 engines, 2 each; on 3, 8/3 -> 3, 2, 3
    assert split(1, 8, 8) == [[Share(0, j, j + 1)] for j in range(8)]
    assert split(1, 8, 4) == [[Share(0, 2 * i, 2 * i + 2)] for i in range(4)]
    # bounds round(8 i / 3) = 0, 3, 5, 8 (Python rounds 2.67 to 3 and 5.33 to 5)
    assert split(1, 8, 3) == [[Share(0, 0, 3)], [Share(0, 3, 5)], [Share(0, 5, 8)]]


def test_whole_groups_stay_whole_when_the_prompts_divide_evenly():
    # the embedded default (64 prompts x 8, one worker) and 64 prompts on 8 workers: each
    # worker's shares are whole groups, the requests of an unsplit call
    assert split(64, 8, 1) == [whole(64, 8)]
    for i, shares in enumerate(split(64, 8, 8)):
        assert shares == [Share(p, 0, 8) for p in range(8 * i, 8 * i + 8)]


def test_fewer_samples_than_workers_leaves_some_idle():
    # 1 prompt x 2 samples on 4 workers: bounds round(0.5 i) = 0, 0, 1, 2, 2
    assert split(1, 2, 4) == [[], [Share(0, 0, 1)], [Share(0, 1, 2)], []]


@pytest.mark.parametrize(
    "prompts,n,workers", [(1, 8, 1), (1, 8, 5), (3, 8, 4), (5, 4, 3), (10, 8, 4), (7, 1, 3)]
)
def test_every_sample_once_in_order_and_balanced(prompts, n, workers):
    plan = split(prompts, n, workers)
    owner = _owners(plan)
    order = [(p, j) for p in range(prompts) for j in range(n)]
    assert sorted(owner) == order  # every (prompt, sample) exactly once
    # contiguous in (prompt, sample) order: worker 0's run, then worker 1's, ...
    assert [owner[x] for x in order] == sorted(owner[x] for x in order)
    sizes = [sum(s.stop - s.start for s in shares) for shares in plan]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == prompts * n
    for shares in plan:  # at most one share of a prompt per worker, none empty
        assert len({s.position for s in shares}) == len(shares)
        assert all(s.stop > s.start for s in shares)


def test_each_samples_stream_does_not_depend_on_the_split():
    # the hf engine's row generators (rollout/hf_engine.py): worker i's rows draw from the same
    # streams as the same rows of an unsplit call (the seeds of rollout/seeding.py ``sample_seed``)
    seeds = lambda shares: [g.initial_seed() for g in sample_generators(7, shares)]  # noqa: E731
    one = seeds(whole(3, 8))
    for workers in (2, 3, 4, 8):
        assert [x for shares in split(3, 8, workers) for x in seeds(shares)] == one
    assert len(set(one)) == 24


def _piece(position: int, start: int, stop: int) -> Group:
    """A share's group; sample j's text names its (prompt, sample)."""
    samples = [Sample([j], [-0.5], f"{position}.{j}", "stop", 0) for j in range(start, stop)]
    return Group(prompt=f"p{position}", prompt_ids=[1, position], samples=samples)


@pytest.mark.parametrize("prompts,n,workers", [(1, 8, 4), (3, 8, 5), (4, 2, 3)])
def test_groups_come_back_whole_in_sample_order_whatever_the_arrival_order(prompts, n, workers):
    shares = [s for w in split(prompts, n, workers) for s in w]
    for trial in range(5):
        random.Random(trial).shuffle(shares)
        assembler, done = Assembler(shares), {}
        for s in shares:
            group = assembler.add(s, _piece(s.position, s.start, s.stop))
            if group is not None:
                assert s.position not in done
                done[s.position] = group
        assert sorted(done) == list(range(prompts))
        for p, group in done.items():
            assert [x.text for x in group.samples] == [f"{p}.{j}" for j in range(n)]
            assert (group.prompt, group.prompt_ids) == (f"p{p}", [1, p])


def test_a_piece_received_twice_counts_once():
    # a restarted worker generates all of its shares again: those already in are dropped
    shares = split(2, 4, 3)  # [(0,0,3)], [(0,3,4), (1,0,1)], [(1,1,4)]
    a = Assembler(list(itertools.chain(*shares)))
    assert a.add(Share(0, 0, 3), _piece(0, 0, 3)) is None
    assert a.add(Share(0, 0, 3), _piece(0, 0, 3)) is None
    assert [x.text for x in a.add(Share(0, 3, 4), _piece(0, 3, 4)).samples] == [
        "0.0", "0.1", "0.2", "0.3"
    ]  # fmt: skip
    assert a.add(Share(0, 3, 4), _piece(0, 3, 4)) is None  # already whole and sent
    assert a.add(Share(1, 0, 1), _piece(1, 0, 1)) is None
    assert len(a.add(Share(1, 1, 4), _piece(1, 1, 4)).samples) == 4


def test_a_piece_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="1 samples came back"):
        Assembler([Share(0, 0, 2)]).add(Share(0, 0, 2), _piece(0, 0, 1))
