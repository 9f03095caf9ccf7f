"""Helpers shared by several test modules (a test module never imports another one's)."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from learner.batch import build_batch
from learner.tempered_logits import token_logprobs
from rollout.types import Group, Sample

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")

# The weights ids of the pinned tiny builds on the CPU families where they were measured: MICRO
# (tests/launch/test_bootstrap.py), FAST_TINY and the default (both ship in launch/assets/: the
# AMD ids). Keyed on what was measured, not guessed from an ISA: both AMD EPYC families build the
# same bytes under the pins, the Intel Xeon other ones (docs/NOTES.md). On a measured family a
# rebuild must give its ids (a change of torch, MKL or the build shows there); on another family
# the tests run every check that does not depend on the CPU and report the ids it built.
_AMD = {"micro": "418a5839", "fast_tiny": "5e521f73", "default": "4aa8613f"}
PINNED_IDS = {
    "AuthenticAMD avx2": _AMD,  # AMD EPYC, AVX2 only (2026-12-01): the published results'
    "AuthenticAMD avx512": _AMD,  # AMD EPYC, AVX-512 with AVX512_BF16 (2026-12-04)
    # Intel Xeon @ 2.80GHz, family 6 model 106 (Ice Lake), AVX-512 (2026-12-03)
    "GenuineIntel avx512": {"micro": "8e6bc88c", "fast_tiny": "9438f709", "default": "5e818d0c"},
}


def cpu_family() -> str:
    """The CPU's vendor and widest vector ISA: the keys of :data:`PINNED_IDS`."""
    vendor, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id":
                vendor = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    return f"{vendor} {isa}"


def pinned_ids(build: str, built: str) -> str | None:
    """This CPU family's measured id of ``build`` ("micro", "fast_tiny", "default"), or None
    where the family was never measured: then a warning reports ``built`` (the id this machine
    made, to record) and the caller checks everything else."""
    import warnings

    family = cpu_family()
    if family not in PINNED_IDS:
        warnings.warn(f"no ids measured on {family!r}: this CPU built {build} as {built}",
                      stacklevel=2)  # fmt: skip
        return None
    return PINNED_IDS[family][build]


def load(*overrides: str):
    """The run config composed from conf/ with ``overrides`` (Hydra) and validated."""
    from hydra import compose, initialize_config_dir

    from launch.validation import to_train_config

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))


def random_lm(arch: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
              vocab: int, **extra):  # fmt: skip
    """A causal LM of transformers' ``arch`` (``Llama``, ``Qwen2``, ``Gemma2``) with random
    weights (seed 0), built from its config: no download. ``extra``: any other config field.

    >>> random_lm("Llama", 1, 16, 32, 2, 2, 50).num_parameters()
    4208

    (embeddings and head 2 x 50 x 16, attention 4 x 16 x 16, MLP 3 x 16 x 32, norms 3 x 16)
    """
    import transformers

    config = getattr(transformers, f"{arch}Config")(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return getattr(transformers, f"{arch}ForCausalLM")(config).float()


def kill_and_wait(actor, timeout_s: float = 60.0) -> None:
    """``ray.kill`` and wait until the actor is gone. ``ray.kill`` is asynchronous: a call made
    right after it may still be answered by the live actor (a liveness check then passes and the
    next call fails), so a test that needs the actor dead asks until a call raises."""
    import time

    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except RayActorError:
            return
        except GetTimeoutError:
            break
    raise AssertionError(f"actor still answering {timeout_s:.0f} s after ray.kill")


def train_batch(model, seed=0, n_groups=4, n=4):
    """Synthetic groups over the tiny vocabulary, old log-probs = the model's own + noise."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n_groups):
        prompt = [1] + [rng.randint(4, 17) for _ in range(rng.randint(3, 6))] + [17]
        samples = [
            Sample([rng.randint(4, 13) for _ in range(rng.randint(1, 4))] + [2], [], "", "stop", 0)
            for _ in range(n)
        ]
        groups.append(Group("", prompt, samples))
    batch = build_batch(
        [
            Group(
                g.prompt,
                g.prompt_ids,
                [
                    Sample(s.response_ids, [0.0] * len(s.response_ids), "", "stop", 0)
                    for s in g.samples
                ],
            )
            for g in groups
        ],
        torch.randn(n_groups * n, generator=torch.Generator().manual_seed(seed)),
        pad_id=0,
    )
    with torch.no_grad():
        logp, _ = token_logprobs(
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
            batch.input_ids,
        )
    noise = 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(seed + 1))
    batch.old_logprobs = (logp + noise) * batch.response_mask
    return groups, batch


@dataclass
class V:
    score: float
    reason: str = "ok"
    extra: dict | None = None  # a reward function's other numbers (reward/verifiers.py Verdict)


def groups_of(lengths: list[list[int]], truncated: set[tuple[int, int]] = frozenset()):
    return [
        Group(
            f"p{i}",
            [1, 4, 5],
            [
                Sample(
                    [6] * n,
                    [-0.5] * n,
                    "",
                    "length" if (i, j) in truncated else "stop",
                    0,
                )
                for j, n in enumerate(row)
            ],
        )
        for i, row in enumerate(lengths)
    ]


class RecordingVerifier:
    """The verifier stage's interface (launch/stages.py ``Verifier``) over a plain function
    ``verify(groups, problems) -> verdicts``."""

    restarts = 0

    def __init__(self, verify):
        self.fn = verify
        self.submitted = 0  # verification calls started

    def verify(self, groups, problems, task, truncated):
        return self.fn(groups, problems)

    def submit(self, groups, problems, task):  # a call in flight: here, its arguments
        self.submitted += 1
        return groups, problems

    def result(self, pending, truncated):
        return self.fn(*pending)

    def drain(self):
        return [], 0  # no error texts, no restarts: a function does not fail as a pool does

    def shutdown(self):
        pass


class StreamingRollout:
    """A fake rollout group's ``generate(prompts, params)`` given the streaming call of
    rollout/group.py ``RolloutGroup.stream``: one group at a time, last prompt first (an order
    no engine promises, so that the driver's reassembly is exercised). Everything else is the
    fake's own."""

    def __init__(self, rollout):
        self._rollout = rollout

    def __getattr__(self, name):
        return getattr(self._rollout, name)

    def stream(self, prompts, params):
        groups = self.generate(prompts, params)  # a test may have replaced it
        for i in reversed(range(len(groups))):
            yield [(i, groups[i])]


class NoWeightSync:
    """The weight sync's interface (rollout/weight_sync.py ``WeightSync``), doing nothing."""

    def before_update(self):
        pass

    def after_update(self, version):
        return 0.0

    def sync(self, version):
        return 0.0


def fake_stages(cfg, problems, rollout, verify, *, learner=None, sampler=None, resume_from=None):
    """``launch.stages.Stages`` for the driver's own logic without Ray: the real advantage
    stage and prompt sampler, ``rollout`` / ``verify`` / ``learner`` as given (fakes)."""
    from launch.sampler import make_sampler
    from launch.stages import Stages
    from learner.advantage_stage import AdvantageStage
    from reward.tasks import Task

    task = Task("fake", "numeric", (0.0, 1.0), list(problems), [])
    stage = AdvantageStage(
        cfg.algorithm,
        reward_range=(0.0, 1.0),
        seed=0,
        max_response_len=cfg.rollout.sampling.max_new_tokens,
    )
    return Stages(
        task=task,
        eval_sets={None: (task, cfg.task)},
        model_path="fake",
        resume_from=resume_from,
        stage=stage,
        sampler=sampler or make_sampler(task.train, cfg.trainer),
        rollout=StreamingRollout(rollout),
        verifier=RecordingVerifier(verify),
        learner=learner,
        weights=NoWeightSync(),
        placement={},
    )


def pool_loading(modules: str, cfg):
    """A verifier pool (reward/pool.py) whose workers load the verifier ``modules``
    (``AVSPO_VERIFIER_MODULES``, restored after): a context manager for module-scoped
    fixtures (pytest's ``monkeypatch`` is per test)."""
    import contextlib

    import pytest

    from reward.pool import VerifierPool

    @contextlib.contextmanager
    def running():
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AVSPO_VERIFIER_MODULES", modules)
            with VerifierPool(cfg) as pool:
                yield pool

    return running()


def weight_change(cfg, loss, model_dir: str, dtype: str, batch, updates: int):
    """The flattened change of a learner group's exported weights after ``updates`` updates on
    ``batch`` (``cfg``: its LearnerConfig), in float64 (a float32 dot product over 134M elements
    gave a cosine of 1.08): tests/learner/test_bf16_masters.py, bench_bf16_drift.py."""
    from learner.group import LearnerGroup

    group = LearnerGroup(cfg, loss, model_dir, dtype=dtype)
    try:
        before = {k: v.double().clone() for k, v in group.export_weights().items()}
        for _ in range(updates):
            group.train_on(batch)
        after = group.export_weights()
    finally:
        group.shutdown()
    return torch.cat([(after[k].double() - v).flatten() for k, v in before.items()])


@contextlib.contextmanager
def env_restored(*keys: str):
    """Inside: ``os.environ`` as it is; after: each of ``keys`` as it was before, set or unset
    (monkeypatch's ``delenv`` of an absent key records nothing, so a key the code under test
    then sets would outlive the test, in this process and in what it starts later)."""
    before = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cli(module: str, *argv: str, env: dict[str, str] | None = None):
    """``python -m launch.<module> *argv`` run in this process (its ``cli``): a
    ``subprocess.CompletedProcess`` with the exit code and what it printed, ~0.1 s instead of a
    new interpreter's ~2.5 s (mostly ``import torch``). For the checks that stop before anything
    starts (a config or data error, ``--validate``, ``--cfg``); ``env`` is set for the call only
    (read when the code reads it, not at an import). The entry point itself, as a process, is
    run by the tests that start real runs."""
    import importlib
    import io
    import subprocess
    import sys

    out, err, argv_before = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = [f"launch/{module}.py", *argv]
    try:
        with env_restored(*(env or {})), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):  # fmt: skip
            os.environ.update(env or {})
            importlib.import_module(f"launch.{module}").cli()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv_before
    return subprocess.CompletedProcess(
        ["-m", f"launch.{module}", *argv], code, out.getvalue(), err.getvalue()
    )
