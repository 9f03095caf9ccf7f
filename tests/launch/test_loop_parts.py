"""The driver's own logic without Ray: prompt sampler state, DAPO dynamic sampling's group
selection, evaluation (pass@k), metrics truncation on resume, and the metric sinks. The stages
are fakes here; tests/e2e runs the same code with real actors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from diagnostics.sinks import ConsoleSink, TensorBoardSink, wandb_mode
from launch.config import TrainConfig
from launch.heldout import evaluate, pass_at_k
from launch.loop import Trainer
from launch.resume import truncate_metrics
from launch.sampler import PromptSampler
from reward.tasks import Problem
from reward.verifiers import Verdict
from rollout.types import Group, Sample
from tests.helpers import fake_stages


def _problems(n: int) -> list[Problem]:
    return [Problem(uid=f"u{i}", question=f"q{i}", prompt=f"p{i}", answer=str(i)) for i in range(n)]


def test_prompt_sampler_resumes_exactly():
    problems = _problems(7)
    a = PromptSampler(problems, seed=3)
    a.next(5)
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, like the checkpoint sidecar
    expected = [p.uid for p in a.next(12)]  # crosses an epoch boundary (7 per epoch)
    b = PromptSampler(problems, seed=99)
    b.load_state_dict(state)
    assert [p.uid for p in b.next(12)] == expected
    # every epoch is a permutation: the first 7 draws hold each problem once
    fresh = PromptSampler(problems, seed=3)
    assert sorted(p.uid for p in fresh.next(7)) == sorted(p.uid for p in problems)


class FakeStages:
    """Prompt "p{i}": the samples answer i (correct) when ``pattern[i]`` says so."""

    def __init__(self, pattern: dict[int, list[bool]]):
        self.pattern, self.calls = pattern, []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        groups = []
        for p in prompts:
            i = int(p[1:])
            texts = [str(i) if ok else "x" for ok in self.pattern[i][: params.n]]
            samples = [Sample([1], [-0.5], t, "stop", 0) for t in texts]
            groups.append(Group(prompt=p, prompt_ids=[0], samples=samples))
        return groups

    def verify(self, groups, problems):
        return [
            Verdict(1.0 if s.text == p.answer else 0.0, "ok" if s.text == p.answer else "wrong")
            for g, p in zip(groups, problems, strict=True)
            for s in g.samples
        ]


def _trainer(cfg: TrainConfig, problems, stages: FakeStages) -> Trainer:
    """The real Trainer over the real sampler and advantage stage, fake generation and
    verification (no Ray)."""
    sampler = PromptSampler(problems, seed=0)
    built = fake_stages(cfg, problems, stages, stages.verify, sampler=sampler)
    return Trainer(cfg, built, Path("."))


MIXED, ALL_RIGHT, ALL_WRONG = [True, False], [True, True], [False, False]


def _cfg(dynamic: bool, max_rounds: int = 3, per_step: int = 2) -> TrainConfig:
    cfg = TrainConfig()
    cfg.rollout.n_samples = 2
    cfg.trainer.prompts_per_step = per_step
    cfg.algorithm.dynamic_sampling.enabled = dynamic
    cfg.algorithm.dynamic_sampling.max_rounds = max_rounds
    return cfg


def test_groups_are_verified_as_they_stream_in_and_verdicts_keep_sample_order():
    # The fake stream sends one group at a time, last prompt first (tests/helpers.py
    # StreamingRollout): 3 prompts give 3 verification calls; with verify_while_generating off,
    # one call for the batch. Either way the same verdicts, in sample order (prompt by prompt,
    # its 2 samples each: p0 right right, p1 right wrong, p2 wrong wrong).
    problems = _problems(3)
    pattern = {0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG}
    want = {"u0": [1.0, 1.0], "u1": [1.0, 0.0], "u2": [0.0, 0.0]}
    calls = {}
    for overlap in (True, False):
        cfg = _cfg(dynamic=False, per_step=3)
        cfg.trainer.verify_while_generating = overlap
        trainer = _trainer(cfg, problems, FakeStages(pattern))
        r = trainer.collect(step=1)
        uids = [p.uid for p in r.problems]
        assert sorted(uids) == ["u0", "u1", "u2"]
        assert [g.prompt for g in r.groups] == ["p" + u[1:] for u in uids]
        assert [v.score for v in r.verdicts] == [x for u in uids for x in want[u]]
        calls[overlap] = trainer.stages.verifier.submitted
    assert calls == {True: 3, False: 1}


def test_dynamic_sampling_keeps_informative_groups_and_counts_rounds():
    # sampler order (seed 0) is fixed; make only p1, p4, p6 informative
    problems = _problems(8)
    pattern = {i: ALL_WRONG for i in range(8)} | {1: MIXED, 4: MIXED, 6: MIXED}
    order = [p.uid for p in PromptSampler(problems, seed=0).next(8)]
    stages = FakeStages(pattern)
    r = _trainer(_cfg(dynamic=True), problems, stages).collect(step=5)
    # rounds of 2 prompts each until 2 informative groups are found
    rounds_needed = next(
        k for k in range(1, 5) if sum(u in {"u1", "u4", "u6"} for u in order[: 2 * k]) >= 2
    )
    assert r.metrics["dapo/rounds"] == rounds_needed == len(stages.calls)
    assert r.metrics["dapo/generated_groups"] == 2 * rounds_needed == len(r.groups)
    assert r.metrics["dapo/informative_groups"] == 2
    # every generated group comes back (the monitor sees them all); the informative are trained
    assert [p.uid for p in r.problems] == order[: 2 * rounds_needed]
    trained = [p.uid for p, t in zip(r.problems, r.trained, strict=True) if t]
    assert trained == [u for u in order[: 2 * rounds_needed] if u in {"u1", "u4", "u6"}]
    assert len(r.verdicts) == 4 * rounds_needed  # 2 samples per group, in group order
    # each round has its own seed, derived from the step
    seeds = [params.seed for _, params in stages.calls]
    assert len(set(seeds)) == len(seeds) and all(params.n == 2 for _, params in stages.calls)


def test_dynamic_sampling_tops_up_with_dropped_groups_after_max_rounds():
    problems = _problems(4)
    pattern = {0: ALL_RIGHT, 1: ALL_WRONG, 2: ALL_RIGHT, 3: MIXED}
    stages = FakeStages(pattern)
    r = _trainer(_cfg(dynamic=True, max_rounds=2, per_step=3), problems, stages).collect(step=1)
    # 2 rounds x 3 prompts = 6 groups drawn; p3 is the only informative prompt, seen at most
    # twice; the trained batch keeps its size (3): the informative ones, then collapsed ones
    # in generation order
    assert r.metrics["dapo/rounds"] == 2 and len(r.groups) == 6 and sum(r.trained) == 3
    informative = int(r.metrics["dapo/informative_groups"])
    uids = [p.uid for p in r.problems]
    assert 1 <= informative == uids.count("u3") <= 2
    collapsed = [i for i, u in enumerate(uids) if u != "u3"]
    expected = {i for i, u in enumerate(uids) if u == "u3"} | set(collapsed[: 3 - informative])
    assert {i for i, t in enumerate(r.trained) if t} == expected


def test_without_dynamic_sampling_one_round_keeps_everything():
    problems = _problems(4)
    stages = FakeStages({i: ALL_WRONG for i in range(4)})
    r = _trainer(_cfg(dynamic=False, per_step=4), problems, stages).collect(step=1)
    assert len(stages.calls) == 1 and len(r.groups) == 4 and all(r.trained)
    assert not any(k.startswith("dapo/") for k in r.metrics)


def test_evaluate_reports_greedy_accuracy_and_pass_at_k():
    problems = _problems(4)
    # greedy (n=1) sees the first entry; pass@2 sees both: problems 0,1 greedy-right;
    # p2 right only in its 2nd sample; p3 never
    pattern = {0: ALL_RIGHT, 1: [True, False], 2: [False, True], 3: ALL_WRONG}
    stages = FakeStages(pattern)
    cfg = TrainConfig()
    out = evaluate(stages.generate, stages.verify, problems, cfg.rollout.sampling, k=2)
    assert out["eval/accuracy"] == 0.5  # 2 of 4 greedy answers right
    assert out["eval/pass@2"] == 0.75  # p0, p1, p2 have a right sample among 2
    assert out["eval/mean@2"] == 0.5  # 4 right of 8 samples
    assert stages.calls[0][1].temperature == 0.0 and stages.calls[1][1].temperature == 1.0


def test_evaluate_reports_per_data_source_when_the_data_names_several():
    """verl's ``data_source`` column: the same pattern as above with p0, p1 from "gsm8k" and
    p2, p3 from "math". gsm8k: greedy 2/2 = 1.0, pass@2 1.0, mean@2 3/4; math: greedy 0/2,
    pass@2 (1 + 0) / 2 = 0.5, mean@2 1/4. One source: no breakdown."""
    problems = [dataclasses.replace(p, data_source="gsm8k" if i < 2 else "math")
                for i, p in enumerate(_problems(4))]  # fmt: skip
    pattern = {0: ALL_RIGHT, 1: [True, False], 2: [False, True], 3: ALL_WRONG}
    out = evaluate(FakeStages(pattern).generate, FakeStages(pattern).verify, problems,
                   TrainConfig().rollout.sampling, k=2)  # fmt: skip
    assert out["eval/gsm8k/accuracy"] == 1.0 and out["eval/math/accuracy"] == 0.0
    assert out["eval/gsm8k/pass@2"] == 1.0 and out["eval/math/pass@2"] == 0.5
    assert out["eval/gsm8k/mean@2"] == 0.75 and out["eval/math/mean@2"] == 0.25
    assert out["eval/accuracy"] == 0.5  # the whole set, as before
    same = [dataclasses.replace(p, data_source="gsm8k") for p in problems]
    one = evaluate(FakeStages(pattern).generate, FakeStages(pattern).verify, same,
                   TrainConfig().rollout.sampling, k=2)  # fmt: skip
    assert not any(k.startswith("eval/gsm8k/") for k in one)


def test_evaluation_says_which_pass_of_which_set_runs():
    """Progress of a long evaluation: each set (``i/m`` with its name when there are several)
    and each pass over it (greedy, then the samples) is announced before it runs."""
    from launch.heldout import evaluate_held_out
    from reward.tasks import TaskConfig

    shown = []
    stages = FakeStages({i: ALL_RIGHT for i in range(3)})
    out = evaluate(stages.generate, stages.verify, _problems(3), TrainConfig().rollout.sampling,
                   k=2, n=4, phase=shown.append)  # fmt: skip
    assert out["eval/accuracy"] == 1.0
    assert shown == ["greedy, 3 problems", "4 samples each, 3 problems"]

    cfg = TrainConfig()
    cfg.trainer.eval_pass_k = 0
    fake = fake_stages(cfg, _problems(3), stages, stages.verify)
    two, three = (dataclasses.replace(fake.task, test=_problems(n)) for n in (2, 3))
    fake.eval_sets = {"a": (two, TaskConfig()), "b": (three, TaskConfig())}
    shown.clear()
    evaluate_held_out(cfg, fake, step=0, phase=shown.append)
    assert shown == ["evaluation 1/2 (a): greedy, 2 problems",
                     "evaluation 2/2 (b): greedy, 3 problems"]  # fmt: skip
    shown.clear()
    fake.eval_sets = {None: (three, TaskConfig())}  # the training task's own test split
    evaluate_held_out(cfg, fake, step=0, phase=shown.append)
    assert shown == ["evaluation: greedy, 3 problems"]


def test_pass_at_k_matches_the_combinatorial_definition():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_truncate_metrics_moves_rows_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in [0, 1, 2, 3]))
    truncate_metrics(path, 2)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2]
    moved = (tmp_path / "metrics.pre_resume.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in moved] == [3]


def test_a_fresh_start_in_a_used_run_dir_moves_the_old_rows_aside(tmp_path):
    """A run that starts from step 0 where an earlier attempt left rows (it died before its
    first checkpoint, and ``trainer.resume=auto`` found none) writes a metrics.jsonl of its own:
    the old rows move to metrics.pre_resume.jsonl, as a resume moves the rows after its
    checkpoint (before: appended, so steps 0 and 1 appeared twice)."""
    problems = [Problem(f"p{i}", "q", "q", "1") for i in range(2)]
    trainer = _trainer(_cfg(dynamic=False), problems, FakeStages({}))
    trainer.run_dir = tmp_path
    old = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in [0, 1])
    (tmp_path / "metrics.jsonl").write_text(old)
    assert trainer.restore() == 0
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert (tmp_path / "metrics.pre_resume.jsonl").read_text() == old


def test_wandb_mode_never_goes_online_without_a_key():
    assert wandb_mode(None, {}) == "offline"
    assert wandb_mode(None, {"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}) == "disabled"
    assert wandb_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"


def test_wandb_goes_online_for_a_user_who_ran_wandb_login(tmp_path):
    """``wandb login`` writes the key into ~/.netrc for the server's host: online, as with
    WANDB_API_KEY; another server's entry, or an unreadable file, is no login."""
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    netrc.chmod(0o600)
    home = {"HOME": str(tmp_path)}
    assert wandb_mode(None, home) == "online"
    assert wandb_mode(None, {"NETRC": str(netrc)}) == "online"
    assert wandb_mode(None, {**home, "WANDB_BASE_URL": "https://wandb.example.org"}) == "offline"
    assert wandb_mode(None, {**home, "WANDB_MODE": "offline"}) == "offline"  # told otherwise
    netrc.write_text("machine wandb.example.org login user password 0123456789abcdef\n")
    assert wandb_mode(None, home) == "offline"  # a login to another server only
    assert wandb_mode(None, {"NETRC": str(tmp_path)}) == "offline"  # unreadable: a folder


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    """The wandb run's id goes into every checkpoint; a run resumed from one logs into the same
    wandb run (offline here: the two attempts' folders carry one id). Name, group and tags come
    from the config's defaults: the run directory, the algorithm, algorithm/task/model."""
    problems = _problems(4)
    saved = {}

    class Learner:  # what the trainer asks of the learner group for a checkpoint
        def save_checkpoint(self, root, step, state, keep):
            saved.update(step=step, **state)
            return f"{root}/step_{step:06d}"

        def load_checkpoint(self, path):
            return saved

    class Weights:
        def sync(self, step):
            pass

    import wandb

    inits, real_init = [], wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: inits.append(kw) or real_init(**kw))
    cfg = _cfg(dynamic=False)
    cfg.logger.wandb, cfg.logger.wandb_mode = True, "offline"
    first = _trainer(cfg, problems, FakeStages({}))
    first.run_dir, first.learner = tmp_path / "run-a", Learner()
    first.open_sinks(0).close()
    first.save(3)
    assert saved["extra"]["wandb_run_id"] == first.wandb_run_id
    again = _trainer(cfg, problems, FakeStages({}))
    again.run_dir, again.learner, again.weights = first.run_dir, Learner(), Weights()
    again.resume_from = "checkpoint"
    assert again.restore() == 3
    again.open_sinks(3).close()
    assert again.wandb_run_id == first.wandb_run_id
    # Each attempt's folder holds its run file, run-<id>.wandb. The folder's name is not read: two
    # attempts started within one second get "offline-run-<time>-<id>" and "...-<id>-1".
    files = sorted(p.name for p in (first.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files == [f"run-{first.wandb_run_id}.wandb"] * 2
    named = {(kw["name"], kw["group"], tuple(kw["tags"])) for kw in inits}
    assert named == {("run-a", "avspo", ("avspo", "arithmetic", "tiny"))}  # the schema's default
    assert [kw["id"] for kw in inits] == [None, first.wandb_run_id]  # new, then continued


def test_console_sink_prints_plain_lines_off_a_terminal(capsys):
    lines = []
    sink = ConsoleSink(10, progress="auto", write=lines.append)  # pytest's stdout is no tty
    sink.log(3, {"reward/mean": 0.25, "acr/raw": 0.5})
    sink.close()
    assert sink.bar is None
    assert lines == ["step 3/10 | reward 0.250 | acr 0.50"]


def test_tensorboard_sink_writes_readable_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.log(1, {"acr/raw": 0.25, "eval/accuracy": float("nan")})
    sink.log(2, {"acr/raw": 0.5})
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["acr/raw"]  # NaN is not written
    assert [(e.step, e.value) for e in acc.Scalars("acr/raw")] == [(1, 0.25), (2, 0.5)]


def test_trainer_config_has_the_stable_keys():
    cfg = TrainConfig()
    for path in [
        "trainer.total_steps",
        "trainer.seed",
        "trainer.eval_every",
        "trainer.run_dir",
        "trainer.resume",
        "rollout.n_samples",
        "rollout.num_workers",
        "task.difficulty",
        "learner.num_ranks",
    ]:
        node = cfg
        for part in path.split("."):
            assert dataclasses.is_dataclass(node), path
            node = getattr(node, part)


def test_prompts_over_the_context_are_dropped_and_counted_or_refused():
    """The tiny tokenizer is one token per character plus <s>: "1" * 50 is 51 tokens, "p0" 3."""
    from launch.models.tiny_model import build_tokenizer
    from launch.stages import fit_context
    from launch.validation import ConfigError
    from reward.tasks import Task

    tok = build_tokenizer()
    long = Problem(uid="l", question="q", prompt="1" * 50, answer="1")
    task = Task("t", "numeric", (0.0, 1.0), train=_problems(3) + [long], test=_problems(2))
    cfg = TrainConfig()
    cfg.rollout.max_model_len, cfg.rollout.sampling.max_new_tokens = 64, 8
    sets = {None: (task, cfg.task)}
    # train: 51 + 8 = 59 <= 64 fits: nothing dropped
    assert fit_context(cfg, task, sets, tok, train=True) == (task, sets, 0)
    # with 16 new tokens 51 + 16 = 67 > 64: that prompt is dropped, counted and logged
    cfg.rollout.sampling.max_new_tokens = 16
    logs = []
    fitted, fitted_sets, dropped = fit_context(cfg, task, sets, tok, True, logs.append)
    assert dropped == 1 and [p.uid for p in fitted.train] == ["u0", "u1", "u2"]
    assert fitted_sets[None][0] is fitted and fitted.test == task.test
    assert logs == ["task: 1 of 4 train prompts dropped, over the context (rollout.max_model_len: "
                    "64 < the longest train prompt of task (51 tokens) + 16 new tokens; "
                    "task.over_long=error refuses instead)"]  # fmt: skip
    cfg.task.over_long = "error"
    with pytest.raises(ConfigError, match=r"^rollout.max_model_len: 64 < the longest train prompt "
                       r"of task \(51 tokens\) \+ 16 new tokens; raise it"):  # fmt: skip
        fit_context(cfg, task, sets, tok, train=True)
    assert fit_context(cfg, task, sets, tok, train=False)[2] == 0  # test prompts: 3 tokens
    # held-out sets with their own budget: "<s>p1" is 3 tokens, + 62 = 65 > 64: all over it
    cfg.task.over_long = "filter"
    cfg.rollout.sampling.max_new_tokens = 8
    cfg.trainer.eval_max_new_tokens = 62
    with pytest.raises(ConfigError, match=r"trainer.eval_tasks.x \(3 tokens\) \+ 62 new tokens; "
                       "every prompt is over it"):  # fmt: skip
        fit_context(cfg, task, {"x": (task, cfg.task)}, tok, train=False)


def test_evaluate_counts_solved_at_r_hi_for_accuracy_and_pass_at_k():
    # One definition of "solved" (issue 24): a score >= the task's r_hi. A partial credit of
    # 0.5 is not solved by either metric (before, eval/accuracy averaged it as 0.5 while
    # pass@k counted it as unsolved).
    problems = _problems(2)

    def verify(groups, probs):  # p0 always 0.5, p1 always 1.0
        return [
            Verdict(0.5 if p.uid == "u0" else 1.0, "ok")
            for g, p in zip(groups, probs, strict=True)
            for _ in g.samples
        ]

    stages = FakeStages({0: ALL_RIGHT, 1: ALL_RIGHT})
    cfg = TrainConfig()
    out = evaluate(stages.generate, verify, problems, cfg.rollout.sampling, k=2, solved_at=1.0)
    assert out["eval/accuracy"] == 0.5 and out["eval/pass@2"] == 0.5 and out["eval/mean@2"] == 0.5


def test_pass_at_k_from_more_samples_than_k():
    # trainer.eval_samples n = 4 > k = 2: Chen et al.'s unbiased estimator per problem.
    # p0: 1 right of 4 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; p1: 0 of 4 -> 0. Mean 0.25.
    # mean@4 = 1 right of 8 samples = 0.125.
    stages = FakeStages({0: [False, False, True, False], 1: [False] * 4})
    cfg = TrainConfig()
    out = evaluate(stages.generate, stages.verify, _problems(2), cfg.rollout.sampling, k=2, n=4)
    assert out["eval/pass@2"] == 0.25 and out["eval/mean@4"] == 0.125
    assert stages.calls[1][1].n == 4


def test_eval_samples_below_k_is_a_config_error():
    from launch.validation import ConfigError, validate

    cfg = TrainConfig()
    cfg.trainer.eval_pass_k, cfg.trainer.eval_samples = 8, 4
    with pytest.raises(ConfigError, match="trainer.eval_samples"):
        validate(cfg)


def test_the_console_shows_long_phases_on_its_bar_and_lines_above_it():
    """On a terminal (progress=always here) a phase's text sits on the step bar while it runs and
    is cleared after; the run's other lines go above the bar. Off a terminal: no bar, no phase."""
    from diagnostics.sinks import ConsoleSink, MultiSink

    lines = []
    plain = ConsoleSink(4, progress="never", write=lines.append)
    plain.phase("evaluating 256 problems")  # nothing to show it on
    assert plain.bar is None and plain.write == lines.append

    console = ConsoleSink(4, progress="always", write=lines.append)
    sink = MultiSink([console])
    with sink.phase("writing the step-2 checkpoint") as show:
        assert "writing the step-2 checkpoint" in str(console.bar)  # the bar as it is drawn
        show("evaluation 2/7 (math500): greedy, 500 problems")  # progress within the phase
        assert "evaluation 2/7 (math500)" in str(console.bar)
    assert "checkpoint" not in str(console.bar)
    assert console.write == console.bar.write  # lines go above the bar
    console.close()
