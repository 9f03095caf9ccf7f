"""Prompt samplers (launch/sampler.py): ``uniform`` is the old PromptSampler draw for draw;
``collapse_aware`` draws more mixed groups than uniform on a synthetic stream without starving any
prompt, its weights follow the documented formula, it resumes bit-exactly, its config keys are
validated; and the driver's step (launch/loop.py ``Trainer.train_step``, stages faked) feeds it
the monitor's collapse and logs ``rollout/mixed_token_share``. No Ray."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from launch.config import TrainConfig, TrainerConfig
from launch.loop import Trainer
from launch.sampler import CollapseAwareSampler, PromptSampler, make_sampler
from launch.validation import ConfigError, to_train_config
from reward.tasks import Problem
from reward.verifiers import Verdict
from rollout.types import Group, Sample
from tests.helpers import CONF, fake_stages


def _problems(n: int) -> list[Problem]:
    return [Problem(uid=f"u{i}", question=f"q{i}", prompt=f"p{i}", answer=str(i)) for i in range(n)]


def _aware(problems, seed=0, **kw) -> CollapseAwareSampler:
    args = dict(prior=1.0, floor=0.05, exponent=1.0, decay=1.0) | kw
    return CollapseAwareSampler(problems, seed, **args)


# ---- uniform: today's sampler, draw for draw ------------------------------------------------


def _old_sequence(n: int, seed: int, ks: list[int]) -> list[list[int]]:
    """The PromptSampler of launch/loop.py before the samplers moved (a copy of its algorithm):
    one random.Random(seed); a fresh shuffled range(n) whenever the order runs out."""
    rng, order, pos, out = random.Random(seed), [], 0, []
    for k in ks:
        got = []
        while len(got) < k:
            if pos >= len(order):
                order, pos = list(range(n)), 0
                rng.shuffle(order)
            got.append(order[pos])
            pos += 1
        out.append(got)
    return out


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
@pytest.mark.parametrize("n, ks", [(7, [5, 12, 3, 3]), (40, [8] * 12), (3, [8, 1, 5])])
def test_uniform_is_the_old_prompt_sampler_draw_for_draw(seed, n, ks):
    problems = _problems(n)
    trainer = TrainerConfig(seed=seed)
    assert trainer.prompt_sampler == "uniform"  # the default
    s = make_sampler(problems, trainer)
    assert type(s) is PromptSampler
    got = [[int(p.uid[1:]) for p in s.next(k)] for k in ks]
    assert got == _old_sequence(n, seed, ks)
    assert set(s.state_dict()) == {"order", "pos", "rng"}  # the checkpoint format is unchanged


# ---- collapse-aware: the formula -------------------------------------------------------------


def test_weights_follow_the_formula():
    ps = _problems(3)
    s = _aware(ps, prior=1.0, floor=0.05, exponent=1.0, decay=1.0)
    assert s.weight("u0") == 0.5  # unseen: (0 + 1) / (0 + 2)
    for _ in range(3):
        s.update(["u0", "u1"], [True, False])
    # u0 collapsed 3 times: (0 + 1) / (3 + 2) = 0.2; u1 mixed 3 times: (3 + 1) / (3 + 2) = 0.8
    assert s.weight("u0") == pytest.approx(0.2) and s.weight("u1") == pytest.approx(0.8)
    for _ in range(100):
        s.update(["u0"], [True])
    assert s.estimate("u0") == pytest.approx(1 / 105)  # (0 + 1) / (103 + 2) ...
    assert s.weight("u0") == 0.05  # ... below the floor
    # prior a = 4: (0 + 4) / (3 + 8) after three collapsed groups
    p4 = _aware(ps, prior=4.0)
    p4.update(["u0", "u0", "u0"], [True, True, True])  # three groups in one step count 3
    assert p4.weight("u0") == pytest.approx(4 / 11)
    # exponent 2 squares p: 0.8 -> 0.64; 0.2 -> 0.04 -> floored at 0.05
    t = _aware(ps, exponent=2.0)
    for _ in range(3):
        t.update(["u0", "u1"], [True, False])
    assert t.weight("u1") == pytest.approx(0.64) and t.weight("u0") == 0.05


def test_decay_discounts_old_evidence_per_step():
    ps = _problems(2)
    s = _aware(ps, decay=0.5)
    s.update(["u0"], [True])  # step 1: c = 1 -> p = 1/3
    assert s.estimate("u0") == pytest.approx(1 / 3)
    s.update(["u1"], [False])  # step 2, u0 not seen: its c counts 0.5 -> p = 1 / 2.5
    assert s.estimate("u0") == pytest.approx(1 / 2.5)
    s.update(["u0"], [False])  # step 3: m = 1, c = 0.25 -> p = 2 / 3.25
    assert s.estimate("u0") == pytest.approx(2 / 3.25)
    assert s.stats["u0"] == [1.0, 0.25, 3]


def test_draws_are_without_replacement_within_a_step_and_across_its_rounds():
    ps = _problems(10)
    s = _aware(ps, seed=3)
    first, second = s.next(4), s.next(4)  # DAPO's rounds of one step
    assert len({p.uid for p in first + second}) == 8
    third = s.next(4)  # only 2 left: a new pass over all 10
    assert len({p.uid for p in third}) == 4
    s.update([p.uid for p in first + second + third], [True] * 12)
    assert s.drawn == []
    assert len({p.uid for p in s.next(10)}) == 10
    assert len(s.next(25)) == 25  # more than the split: whole passes


def test_the_floor_bounds_every_draw_probability():
    # one prompt collapsed 1,000 times among 9 that are always mixed: its weight is the floor,
    # so each first draw picks it with probability 0.05 / (0.05 + 9 * (1001 / 1002)) ~ 0.0055
    ps = _problems(10)
    s = _aware(ps, seed=0)
    for _ in range(1000):
        s.update([p.uid for p in ps], [p.uid == "u0" for p in ps])
    assert s.weight("u0") == 0.05
    hits = 0
    for _ in range(4000):
        hits += s.next(1)[0].uid == "u0"
        s.drawn = []
    expected = 4000 * 0.05 / (0.05 + 9 * 1001 / 1002)  # ~22
    assert 8 <= hits <= 40, (hits, expected)


# ---- collapse-aware vs uniform on a synthetic stream ----------------------------------------


def _simulate(sampler, problems, seed: int, steps=30, per_step=8, group=8):
    """40 prompts: u0-u19 always solved, u20-u29 never solved (both always collapse), u30-u39
    each sample correct with p = 0.5 (mixed unless all 8 agree: 1 - 2 / 2**8 = 0.992). Returns
    the share of mixed groups among the draws and how often each prompt was drawn."""
    sim = random.Random(seed)
    mixed, draws = 0, 0
    counts = {p.uid: 0 for p in problems}
    for _ in range(steps):
        batch = sampler.next(per_step)
        collapsed = []
        for p in batch:
            counts[p.uid] += 1
            if int(p.uid[1:]) < 30:
                collapsed.append(True)
            else:
                rewards = [sim.random() < 0.5 for _ in range(group)]
                collapsed.append(len(set(rewards)) == 1)
        sampler.update([p.uid for p in batch], collapsed)
        mixed += collapsed.count(False)
        draws += len(batch)
    return mixed / draws, counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collapse_aware_draws_more_mixed_groups_than_uniform_and_starves_none(seed):
    """Measured (30 steps x 8 prompts = 240 draws each; defaults prior 1, floor 0.05, T 1,
    decay 0.99): mixed-group share uniform 0.250 / 0.246 / 0.250 (the mixed quarter of the
    prompts), collapse-aware 0.425 / 0.479 / 0.471 (seeds 0 / 1 / 2); with T = 0.5: 0.596 /
    0.633 / 0.625. Every prompt was drawn at least once (least: 1-2 draws; uniform: 6)."""
    ps = _problems(40)
    trainer = TrainerConfig(seed=seed, prompt_sampler="collapse_aware")
    uniform, _ = _simulate(make_sampler(ps, TrainerConfig(seed=seed)), ps, seed)
    aware, counts = _simulate(make_sampler(ps, trainer), ps, seed)
    assert aware >= uniform + 0.12, f"mixed-group share: collapse-aware {aware:.3f}, {uniform=:.3f}"
    assert min(counts.values()) >= 1, [u for u, n in counts.items() if n == 0]
    assert sum(counts.values()) == 240  # equal draws: no extra rollouts
    sharp, _ = _simulate(_aware(ps, seed, exponent=2.0, decay=0.99), ps, seed)
    assert sharp > aware, (sharp, aware)


# ---- state ---------------------------------------------------------------------------------


def test_collapse_aware_resumes_bit_exactly():
    ps = _problems(13)
    a = _aware(ps, seed=5, decay=0.9)
    sim = random.Random(0)
    for _ in range(4):
        batch = a.next(4)
        a.update([p.uid for p in batch], [sim.random() < 0.6 for _ in batch])
    a.next(3)  # mid-step (a DAPO round drawn): `drawn` is part of the state
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, like the checkpoint sidecar
    expected = []
    for _ in range(5):
        batch = a.next(4)
        expected.append([p.uid for p in batch])
        a.update(expected[-1], [sim.random() < 0.6 for _ in batch])
    b = _aware(ps, seed=99, decay=0.9)  # another seed: everything comes from the state
    b.load_state_dict(state)
    sim = random.Random(0)
    for _ in range(4 * 4):
        sim.random()
    got = []
    for _ in range(5):
        batch = b.next(4)
        got.append([p.uid for p in batch])
        b.update(got[-1], [sim.random() < 0.6 for _ in batch])
    assert got == expected
    assert b.state_dict() == a.state_dict()


def test_a_state_of_the_other_sampler_is_refused():
    ps = _problems(3)
    with pytest.raises(ValueError, match="not a collapse_aware sampler's .it is uniform's"):
        _aware(ps).load_state_dict(PromptSampler(ps, 0).state_dict())


# ---- config ----------------------------------------------------------------------------------


def _load(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))


def test_config_keys_reach_the_sampler():
    cfg = _load(
        "trainer.prompt_sampler=collapse_aware",
        "trainer.sampler_prior=2",
        "trainer.sampler_floor=0.1",
        "trainer.sampler_exponent=2",
        "trainer.sampler_decay=0.9",
    )
    s = make_sampler(_problems(3), cfg.trainer)
    assert isinstance(s, CollapseAwareSampler)
    assert (s.prior, s.floor, s.exponent, s.decay) == (2.0, 0.1, 2.0, 0.9)
    assert _load().trainer == TrainerConfig()  # conf/config.yaml repeats the schema's defaults


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.prompt_sampler=greso", "trainer.prompt_sampler: 'greso' is not one of"),
        ("trainer.sampler_prior=0", "trainer.sampler_prior: must be > 0.0"),
        ("trainer.sampler_floor=0", "trainer.sampler_floor: must be > 0.0"),
        ("trainer.sampler_floor=1.5", "trainer.sampler_floor: must be <= 1.0"),
        ("trainer.sampler_exponent=-1", "trainer.sampler_exponent: must be > 0.0"),
        ("trainer.sampler_decay=0", "trainer.sampler_decay: must be > 0.0"),
        ("trainer.sampler_decay=1.01", "trainer.sampler_decay: must be <= 1.0"),
    ],
)
def test_bad_sampler_values_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        _load(override)


# ---- the driver's step (launch/loop.py), stages faked ---------------------------------------


class FakeRollout:
    """Prompt "p{i}" answers per ``pattern[i]`` (True = correct); response i+1 tokens long."""

    restarts = regenerated = 0

    def __init__(self, pattern: dict[int, list[bool]]):
        self.pattern, self.calls = pattern, []

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        out = []
        for p in prompts:
            i = int(p[1:])
            texts = [str(i) if ok else "x" for ok in self.pattern[i][: params.n]]
            samples = [Sample([1] * (i + 1), [-0.5] * (i + 1), t, "stop", 0) for t in texts]
            out.append(Group(prompt=p, prompt_ids=[0], samples=samples))
        return out


class FakeLearner:
    def train_on(self, batch, learner_version=None):
        return {}


def _verify(groups, problems):
    return [
        Verdict(1.0 if s.text == p.answer else 0.0, "ok" if s.text == p.answer else "wrong")
        for g, p in zip(groups, problems, strict=True)
        for s in g.samples
    ]


def _trainer(
    cfg: TrainConfig, problems, pattern, learner=None, run_dir=".", log=print, resume_from=None
):
    """The real Trainer over real pure stages (advantage stage, sampler) and fake Ray ones."""
    rollout, learner = FakeRollout(pattern), learner or FakeLearner()
    stages = fake_stages(cfg, problems, rollout, _verify, learner=learner, resume_from=resume_from)
    return Trainer(cfg, stages, Path(run_dir), log=log)


MIXED, RIGHT, WRONG = [True, False, True, True], [True] * 4, [False] * 4


@pytest.mark.parametrize("algorithm", ["grpo", "avspo", "dapo"])
@pytest.mark.parametrize("sampler", ["uniform", "collapse_aware"])
def test_train_step_feeds_the_sampler_and_logs_the_mixed_token_share(algorithm, sampler):
    problems = _problems(12)
    pattern = {i: [MIXED, RIGHT, WRONG][i % 3] for i in range(12)}
    cfg = _load(
        f"algorithm={algorithm}",
        f"trainer.prompt_sampler={sampler}",
        "trainer.prompts_per_step=4",
        "rollout.n_samples=4",
        "learner.mini_batch_size=16",
    )
    t = _trainer(cfg, problems, pattern)
    for step in (1, 2, 3):
        calls = len(t.rollout.calls)
        m = t.train_step(step)
        new = [p for call in t.rollout.calls[calls:] for p in call]
        assert all(len(call) == 4 for call in t.rollout.calls[calls:])  # k prompts per round
        if algorithm != "dapo":
            assert len(new) == 4  # one round: the sampler costs no extra rollouts
        # hand-computed: prompt p{i} is mixed iff i % 3 == 0, and has 4 x (i + 1) tokens
        tokens = [4 * (int(p[1:]) + 1) for p in new]
        mixed = sum(n for p, n in zip(new, tokens, strict=True) if int(p[1:]) % 3 == 0)
        assert m["rollout/mixed_token_share"] == pytest.approx(mixed / sum(tokens))
        # the sampler's collapse is the monitor's: acr/raw covers every generated group
        collapsed = sum(int(p[1:]) % 3 != 0 for p in new)
        assert m["acr/raw"] == pytest.approx(collapsed / len(new))
    if sampler == "collapse_aware":
        seen = {p for call in t.rollout.calls for p in call}
        for p in seen:
            m_, c_, _ = t.sampler.stats["u" + p[1:]]
            assert (m_ > 0) == (int(p[1:]) % 3 == 0) and (c_ > 0) == (int(p[1:]) % 3 != 0)


def test_the_sampler_sees_collapse_after_overlong_shaping():
    """With DAPO's overlong shaping (L_max 8, buffer 4), an all-correct group whose responses
    differ in length inside the buffer is *not* collapsed for the monitor, nor for the sampler."""
    problems = _problems(3)
    pattern = {i: RIGHT for i in range(3)}
    cfg = _load(
        "trainer.prompt_sampler=collapse_aware",
        "trainer.prompts_per_step=3",
        "rollout.n_samples=4",
        "learner.mini_batch_size=12",
        "algorithm.overlong.shaping=true",
        "algorithm.overlong.buffer_len=4",
    )
    t = _trainer(cfg, problems, pattern)
    lengths = iter([1, 1, 1, 1, 2, 2, 2, 2, 4, 5, 6, 7])  # the third group: penalties 0..-0.75
    drawn = []

    def generate(prompts, params):
        drawn.extend(prompts)
        groups = FakeRollout(pattern).generate(prompts, params)
        for g in groups:
            for s in g.samples:
                n = next(lengths)
                s.response_ids, s.logprobs = [1] * n, [-0.5] * n
        return groups

    t.rollout.generate = generate
    m = t.train_step(1)
    third = "u" + drawn[2][1:]
    assert {uid for uid, (mx, _, _) in t.sampler.stats.items() if mx > 0} == {third}
    assert m["acr/raw"] == pytest.approx(2 / 3)
    assert m["rollout/mixed_token_share"] == pytest.approx(22 / (4 + 8 + 22))


class FakeCheckpointLearner(FakeLearner):
    def __init__(self, state):
        self.state = state

    def load_checkpoint(self, folder):
        return self.state


@pytest.mark.parametrize("saved_kind", ["uniform", "collapse_aware"])
def test_restore_loads_the_samplers_state_or_starts_a_changed_sampler_afresh(tmp_path, saved_kind):
    """Trainer.restore: the checkpoint's sampler state continues the same sampler; a checkpoint
    of the other sampler (trainer.prompt_sampler changed, allowed on resume with
    trainer.resume_allow_changes) leaves the new one fresh, with a log line."""
    problems = _problems(6)
    cfg = _load("trainer.prompt_sampler=collapse_aware")
    first = _trainer(cfg, problems, {i: MIXED for i in range(6)})
    before = make_sampler(problems, cfg.trainer)
    saved = make_sampler(problems, TrainerConfig(seed=4, prompt_sampler=saved_kind))
    saved.next(3)
    saved.update(["u1", "u2"], [True, False])
    state = {
        "step": 2,
        "advantage_stage": first.stage.state_dict(),
        "extra": {"sampler": json.loads(json.dumps(saved.state_dict())), "accuracy_start": 0.5},
    }
    logs = []
    t = _trainer(
        cfg, problems, {i: MIXED for i in range(6)}, learner=FakeCheckpointLearner(state),
        run_dir=tmp_path, log=logs.append, resume_from=tmp_path / "checkpoints" / "step_000002",
    )  # fmt: skip
    assert t.restore() == 2
    if saved_kind == "collapse_aware":
        assert t.sampler.state_dict() == saved.state_dict()
    else:
        assert t.sampler.state_dict() == before.state_dict()
        said = "prompt sampler is uniform: the collapse_aware sampler starts afresh"
        assert any(said in m for m in logs), logs


def test_an_empty_train_split_builds_but_cannot_draw():
    """launch.evaluate builds the sampler for a test-only task: only drawing is an error."""
    for sampler in (PromptSampler([], 0), _aware([])):
        with pytest.raises((ValueError, IndexError)):
            sampler.next(1)


def test_resuming_a_finished_run_returns_its_last_logged_row(tmp_path):
    """A run stopped after its last checkpoint but before its caller recorded it (e.g. the
    reproduce grid killed) resumes at step == total_steps: no step runs, and the run's final
    metrics are the logged row of the last step (eval/accuracy included), not an empty dict."""
    problems = _problems(6)
    cfg = _load("trainer.total_steps=2", "logger.report=false", "logger.console=false")
    first = _trainer(cfg, problems, {i: MIXED for i in range(6)})
    state = {
        "step": 2,
        "advantage_stage": first.stage.state_dict(),
        "extra": {"sampler": first.sampler.state_dict(), "accuracy_start": 0.25},
    }
    rows = [{"step": 0, "eval/accuracy": 0.25}, {"step": 1}, {"step": 2, "eval/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = _trainer(
        cfg, problems, {i: MIXED for i in range(6)}, learner=FakeCheckpointLearner(state),
        run_dir=tmp_path, log=lambda m: None, resume_from=tmp_path / "checkpoints" / "step_000002",
    )  # fmt: skip
    final = t.run()
    assert final["eval/accuracy_start"] == 0.25 and final["eval/accuracy"] == 0.5
    assert t.rollout.calls == []  # nothing generated
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3  # no row added


@pytest.mark.parametrize(
    "override", ["trainer.sampler_temperature=0.5", "+trainer.sampler_temperature=2"]
)
def test_the_old_temperature_key_is_refused_naming_the_new_one(override, capsys):
    """The prompt-weight exponent was called a temperature (1 / exponent); the old key, plain or
    added with +, stops the run with one line that names its replacement."""
    from launch.train import validate

    with pytest.raises(SystemExit) as stopped:
        validate([override], data=False)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "trainer.sampler_temperature was renamed: write trainer.sampler_exponent" in err
