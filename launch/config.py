"""The whole run's config schema and its Hydra registration.

Dataclasses are the schema (one source of truth); ``conf/**/*.yaml`` hold presets. Hydra rejects
an unknown key or a value of the wrong type while composing, naming the key's full path; a key
added with ``+`` (which Hydra accepts anywhere) is checked against the schema too
(launch/schema_keys.py: only free-form maps such as ``task.gym_config`` take new keys).
``validate`` (launch/validation.py) then checks values (``field(metadata=...)``: ``choices``,
``ge``, ``gt``, ``le``, ``lt``, and a dataclass's own ``check()``), again naming the path, before
any actor starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from diagnostics.acr import MonitorConfig
from launch.models.model_config import ModelConfig
from launch.sampler import SAMPLERS
from learner.config import AlgorithmConfig, LearnerConfig, minibatch_problem
from reward.pool import PoolConfig
from reward.tasks import TaskConfig
from rollout.config import RolloutConfig


@dataclass
class TrainerConfig:
    """The driver loop."""

    total_steps: int = field(default=40, metadata={"ge": 1})
    seed: int = 0
    eval_every: int = field(default=10, metadata={"ge": 0})
    """Held-out evaluation every this many steps (and at step 0 and the last step); 0 = never."""
    eval_pass_k: int = field(default=8, metadata={"ge": 0})
    """Evaluation also samples this many answers per problem for ``eval/pass@k`` (0 = off)."""
    eval_samples: int | None = field(default=None, metadata={"ge": 1})
    """Samples per problem at ``eval_temperature`` (n >= ``eval_pass_k``): ``eval/pass@k`` is
    Chen et al.'s unbiased estimate from n samples and ``eval/mean@n`` their mean solve rate;
    null = ``eval_pass_k``."""
    eval_temperature: float = field(default=1.0, metadata={"gt": 0.0})
    """Temperature of the pass@k samples (pass@1 ``eval/accuracy`` is greedy)."""
    eval_max_new_tokens: int | None = field(default=None, metadata={"ge": 1})
    """Response length at evaluation (the paper: 2,048); null = rollout.sampling.max_new_tokens."""
    eval_tasks: dict[str, TaskConfig] = field(default_factory=dict)
    """Held-out tasks evaluated instead of the training task's test split, by name: each logs
    ``eval/<name>/accuracy`` (greedy pass@1), ``eval/<name>/pass@k``, ``eval/<name>/mean@k``,
    and ``eval/accuracy`` etc. are their averages. Compose presets into it with Hydra, e.g.
    ``+task@trainer.eval_tasks.math500=math500 trainer.eval_tasks.math500.test_file=...``
    (conf/experiment/ presets do this)."""
    save_every: int = field(default=20, metadata={"ge": 0})
    """Checkpoint every this many steps (and at the last step); 0 = only at the last step."""
    prompts_per_step: int = field(default=64, metadata={"ge": 1})
    """Prompts sampled per step; each gets rollout.n_samples samples (one group)."""
    prompt_sampler: str = field(default="uniform", metadata={"choices": SAMPLERS})
    """How prompts are drawn (launch/sampler.py). ``uniform``: seeded passes over the train
    split, each prompt once per pass. ``collapse_aware``: weighted draws without replacement,
    weight ``max(sampler_floor, p ** sampler_exponent)`` with p the Beta-posterior mean
    chance that the prompt's group is mixed (not collapsed), from its discounted history: prompts
    that were always or never solved are drawn less (GRESO's idea, arXiv 2506.02177), with no
    extra rollouts. The ``sampler_*`` keys act only with ``collapse_aware``."""
    sampler_prior: float = field(default=1.0, metadata={"gt": 0.0})
    """Beta(a, a) prior pseudo-counts of mixed and collapsed groups: an unseen prompt has p = 1/2;
    a larger a needs more history before a prompt's weight moves."""
    sampler_floor: float = field(default=0.05, metadata={"gt": 0.0, "le": 1.0})
    """Least weight of any prompt (weights are in [floor, 1]): each draw picks a prompt with
    probability >= floor / train prompts, so none is starved."""
    sampler_exponent: float = field(default=1.0, metadata={"gt": 0.0})
    """The weight is p ** exponent: above 1 sharpens the preference for mixed prompts, towards 0
    the draw becomes uniform. (Called ``sampler_temperature`` = 1 / exponent before 2026-12-05;
    the old key is refused with a message naming this one.)"""
    sampler_decay: float = field(default=0.99, metadata={"gt": 0.0, "le": 1.0})
    """Per-step discount of a prompt's collapse counts (1 = never forget; 0.99 halves evidence in
    ~69 steps), so a prompt judged under an older policy drifts back to the prior."""
    run_dir: str | None = None
    """Holds metrics.jsonl, report.md, plots, checkpoints; null = Hydra's output directory."""
    resume: str | None = None
    """null (fresh run) | auto (latest checkpoint in run_dir if any) | a checkpoint path."""
    keep_checkpoints: int | None = field(default=3, metadata={"ge": 1})
    """Keep the newest this many checkpoints (older ones are deleted after a save); null = all."""
    resume_allow_changes: list[str] = field(default_factory=list)
    """Config keys (or prefixes, e.g. ``learner.lr``, ``algorithm``) that may differ from the
    checkpoint's run on resume; any other difference in what changes results is refused."""
    # ``trainer.async``: a Python keyword, so the field is declared through the class namespace
    # (read it with ``async_mode``).
    __annotations__["async"] = "str"
    vars()["async"] = field(
        default="off",
        init=False,
        repr=False,
        compare=False,
        metadata={"choices": ("off", "one_step")},
    )
    """``off``: generate, verify, update, sync in turn. ``one_step`` (split devices,
    ``cluster.colocate=false``): step t+1's generation and verification run while step t
    trains, with the weights of step t - 1, so every sample is at most one policy version behind
    the learner (``rollout/policy_lag``); the learner recomputes old log-probs and weights each
    token by the truncated importance ratio (``learner.old_logprobs=recompute``, required).
    The generated step t+1 is saved with a checkpoint at step t, so a resume is bit-exact."""

    verify_while_generating: bool = True
    """Each prompt's group goes to the verifier as soon as its samples have all ended (the
    engines stream finished groups), while the rest still decode; false: the whole batch after
    generation. The same verdicts either way."""

    @property
    def async_mode(self) -> str:
        return getattr(self, "async")

    def check(self) -> str | None:
        if self.eval_samples is not None and self.eval_samples < self.eval_pass_k:
            return (
                f"eval_samples: {self.eval_samples} samples cannot give pass@{self.eval_pass_k} "
                "(needs eval_samples >= eval_pass_k)"
            )
        return None


@dataclass
class ClusterConfig:
    """Where the Ray actors run (``conf/cluster/{local,gpu_node,multi_node}.yaml``)."""

    name: str = "local"
    address: str | None = None
    """Ray cluster to join; null = ``$RAY_ADDRESS`` if set, else a local Ray started here."""
    num_cpus: int | None = field(default=None, metadata={"ge": 1})
    """Local Ray only: logical CPUs to declare; null = what the actors need (they time-share)."""
    placement_groups: bool = True
    """Reserve rollout, verifier and learner resources in placement groups before starting."""
    placement_strategy: str = field(
        default="PACK", metadata={"choices": ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")}
    )
    ready_timeout_s: float = field(default=300.0, metadata={"gt": 0.0})
    """Limit for the placement groups' resources to become available (a busy cluster's)."""
    wait_for_nodes: bool = False
    """A reservation the cluster's nodes can never hold (more GPUs than it has) fails at once;
    true: wait ``ready_timeout_s`` for nodes that may still join (an autoscaler's)."""
    listen: str = field(default="loopback", metadata={"choices": ("loopback", "node")})
    """Local Ray only: where the run's servers listen. ``loopback``: Ray (GCS, raylet, workers,
    its agents) and every rendezvous of the run (DeepSpeed's, the weight sync's, gloo) on
    127.0.0.1 only, no dashboard: nothing reachable from the network. ``node``: Ray's default,
    the node's IP (what other machines joining this Ray would need)."""
    colocate: bool = True
    """Generation and the update take turns on the same devices (verl's hybrid engine,
    OpenRLHF's colocate_all, TRL's colocate mode): rollout worker i and learner rank i share
    bundle i of one placement group (launch/cluster.py), and the phase that runs uses the whole
    node: on CPU each engine or rank computes with the node's cores divided among its stage's
    actors there; on GPU the engine and the rank share the GPU, and vLLM sleeps (weights and KV
    cache released) during the update. false = split devices: each stage holds its own
    (``num_cpus_per_*``, ``num_gpus_per_*``), for ``trainer.async=one_step`` overlap."""
    actor_logs: bool = True
    """Actors' warnings and errors reach the driver's console (Ray's log_to_driver), with the
    libraries' own chatter turned down (launch/cluster.py: QUIET); false = actors are silent
    (their logs stay in Ray's session folder)."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Environment variables of every actor (Ray's runtime env, on a joined or a local Ray;
    launch/cluster.py ``runtime_env_vars``): the GPU presets set NCCL's. A variable the driver's
    own environment already sets keeps that value (a local Ray's actors inherit it; a Ray job
    passes its own ``env_vars``). Drop one with ``~cluster.env_vars.NAME``."""


@dataclass
class LoggerConfig:
    """Metric sinks (``conf/logger/``); ``metrics.jsonl`` in the run dir is always written."""

    console: bool = True
    """One readable line per step (plus a progress bar with ETA when stdout is a terminal)."""
    progress: str = field(default="auto", metadata={"choices": ("auto", "always", "never")})
    tensorboard: bool = False
    """Event files under ``<run_dir>/tensorboard``."""
    wandb: bool = False
    wandb_project: str = "avspo"
    wandb_entity: str | None = None
    wandb_mode: str | None = field(
        default=None, metadata={"choices": (None, "online", "offline", "disabled")}
    )
    """null = ``$WANDB_MODE`` if set, else online when wandb has a key (``WANDB_API_KEY``, or
    ``wandb login``'s entry in ~/.netrc), else offline. The key is read by wandb; it is never
    written or logged."""
    wandb_name: str | None = None
    """The wandb run's name; null = the run directory's name. A resumed run keeps its wandb run
    (the id is in the checkpoint)."""
    wandb_group: str | None = None
    """null = the algorithm's name (runs of one method side by side)."""
    wandb_tags: list[str] | None = None
    """null = the algorithm's, the task's and the model's names."""
    report: bool = True
    """Write report.md and PNG plots into the run dir at the end (launch.analyze does too)."""
    samples: int = field(default=4, metadata={"ge": 0})
    """Rollouts per training step logged whole (prompt, response, reward, verdict, advantage,
    group): ``samples.jsonl`` in the run dir, a wandb table, a few in report.md; chosen evenly
    over the step's samples (diagnostics/samples.py). 0 = none. Default 4: a few KB a step
    (verl's ``log_val_generations`` and TRL's ``log_completions`` are off by default; the
    report needs them, and reading what the model wrote is the first check of a strange curve)."""


@dataclass
class TrainConfig:
    """Root of ``conf/config.yaml``."""

    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    verifier: PoolConfig = field(default_factory=PoolConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    acr: MonitorConfig = field(default_factory=MonitorConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def check(self) -> str | None:
        n = self.trainer.prompts_per_step * self.rollout.n_samples
        problem = minibatch_problem(n, self.learner.mini_batch_size, self.learner.num_ranks)
        if problem:
            return f"learner.mini_batch_size: {problem} (trainer.prompts_per_step x n_samples)"
        sampling = self.rollout.sampling
        if sampling.temperature <= 0:
            return (
                "rollout.sampling.temperature: training samples at T > 0 (the learner divides its "
                f"logits by T), got {sampling.temperature}"
            )
        problem = (
            _length_problem(self)
            or _layout_problem(self)
            or _weight_sync_problem(self)
            or _async_problem(self)
        )
        if problem:
            return problem
        budget = self.verifier.step_budget_s
        if budget is not None and budget >= self.verifier.call_timeout_s:
            return (
                f"verifier.step_budget_s: {budget:g} must be below verifier.call_timeout_s "
                f"({self.verifier.call_timeout_s:g}), the driver's wait for a verification call"
            )
        ov = self.algorithm.overlong
        if ov.shaping and ov.buffer_len >= sampling.max_new_tokens:
            return (
                f"algorithm.overlong.buffer_len: {ov.buffer_len} must be below the max response "
                f"length rollout.sampling.max_new_tokens ({sampling.max_new_tokens})"
            )
        return None


TINY_LIMITS = {"rollout.max_model_len": 64, "rollout.sampling.max_new_tokens": 8}
TINY_LR = 1e-4


def _length_problem(cfg: TrainConfig) -> str | None:
    """Lengths that cannot work: a response budget the context cannot hold, or a real model
    run with the tiny model's limits (8-token answers, 64-token context, lr 1e-4; LoRA adapters
    are trained at such rates, so not the lr then)."""
    rollout = cfg.rollout
    if rollout.sampling.max_new_tokens >= rollout.max_model_len:
        return (
            f"rollout.sampling.max_new_tokens: {rollout.sampling.max_new_tokens} leaves no room "
            f"for a prompt in rollout.max_model_len ({rollout.max_model_len})"
        )
    if cfg.model.source == "tiny":
        return None
    values = {"rollout.max_model_len": rollout.max_model_len}
    values["rollout.sampling.max_new_tokens"] = rollout.sampling.max_new_tokens
    small = [k for k, v in values.items() if v <= TINY_LIMITS[k]]
    model, preset = _model_and_preset(cfg.model)
    if small:
        shown = ", ".join(f"{k}={values[k]}" for k in small)
        return (
            f"{small[0]}: {shown} are the tiny model's limits, too short for model {model} "
            f"({preset})"
        )
    if cfg.learner.lr >= TINY_LR and cfg.learner.lora.rank == 0:  # LoRA: ~1e-4 is usual
        return (
            f"learner.lr: {cfg.learner.lr:g} is the tiny model's learning rate; a pretrained "
            f"model ({model}) wants ~1e-6 ({preset})"
        )
    return None


def _model_and_preset(model: ModelConfig) -> tuple[str, str]:
    """The model a message is about, and the preset that sets its lengths and lr. A model by
    path with the tiny preset's values (``model.source=path`` alone) is named by its path."""
    if model.source == "path" and model.name == "tiny":
        return repr(model.path), "use the preset for one: model=pretrained model.path=..."
    return repr(model.name), f"its preset, conf/model/{model.name}.yaml, sets its own"


def _async_problem(cfg: TrainConfig) -> str | None:
    """``trainer.async=one_step`` overlaps phases on split devices, with the importance
    correction, and draws prompts before the previous step's update (no DAPO rounds)."""
    if cfg.trainer.async_mode != "one_step":
        return None
    if cfg.cluster.colocate:
        return (
            "trainer.async: one_step overlaps generation with the update on split devices; "
            "set cluster.colocate=false (colocated phases take turns on the same devices)"
        )
    if cfg.learner.old_logprobs != "recompute":
        return (
            "trainer.async: one_step trains on samples one policy version old; set "
            "learner.old_logprobs=recompute (truncated importance weights, learner.tis_cap)"
        )
    if cfg.learner.tis_cap is None:
        return (
            "learner.tis_cap: null leaves trainer.async=one_step without the importance "
            "correction its one-version-old samples need; set a cap (2.0 as the authors' code)"
        )
    if cfg.algorithm.dynamic_sampling.enabled:
        return "trainer.async: one_step does not support algorithm.dynamic_sampling (yet)"
    return None


def _layout_problem(cfg: TrainConfig) -> str | None:
    """Layouts that cannot work: a colocated engine must fit one shared bundle (one GPU at
    most, no tensor parallelism) on the same kind of device as the learner rank."""
    if not cfg.cluster.colocate:
        return None
    rollout, learner = cfg.rollout, cfg.learner
    if rollout.tensor_parallel_size > 1:
        return (
            f"cluster.colocate: an engine with rollout.tensor_parallel_size="
            f"{rollout.tensor_parallel_size} spans several GPUs, a colocated bundle holds one; "
            "use cluster.colocate=false (split devices)"
        )
    gpus = {"rollout.num_gpus_per_worker": rollout.num_gpus_per_worker,
            "learner.num_gpus_per_rank": learner.num_gpus_per_rank}  # fmt: skip
    if (rollout.num_gpus_per_worker > 0) != (learner.num_gpus_per_rank > 0) or any(
        v > 1 for v in gpus.values()
    ):
        shown = ", ".join(f"{k}={v:g}" for k, v in gpus.items())
        return (
            f"cluster.colocate: engine and learner rank share one device, so both hold one GPU "
            f"or none ({shown}); use cluster.colocate=false for other layouts"
        )
    return None


def _weight_sync_problem(cfg: TrainConfig) -> str | None:
    """The collective transport over NCCL needs learner rank 0 and every engine process on a
    GPU of its own: NCCL refuses two ranks of one group on one device."""
    from rollout.weight_sync import weight_sync_backend

    rollout, learner = cfg.rollout, cfg.learner
    if rollout.weight_sync != "collective":
        return None
    backend = weight_sync_backend(rollout)
    if backend != "nccl":
        return None
    if rollout.num_gpus_per_worker == 0 or learner.num_gpus_per_rank == 0:
        return (
            "rollout.weight_sync_backend: nccl needs GPUs on both sides (rollout."
            f"num_gpus_per_worker={rollout.num_gpus_per_worker:g}, learner.num_gpus_per_rank="
            f"{learner.num_gpus_per_rank:g}); use gloo or rollout.weight_sync=object_store"
        )
    if cfg.cluster.colocate:
        return (
            "rollout.weight_sync: collective over NCCL cannot run with cluster.colocate (engine "
            "and learner rank on one GPU, where NCCL refuses two ranks); use "
            "rollout.weight_sync=object_store, or cluster.colocate=false"
        )
    shared = [
        f"{k}={v:g}"
        for k, v in (
            ("learner.num_gpus_per_rank", learner.num_gpus_per_rank),
            ("rollout.num_gpus_per_worker", rollout.num_gpus_per_worker),
        )
        if v < 1
    ]
    if shared:
        return (
            f"rollout.weight_sync: collective over NCCL cannot run with {', '.join(shared)}: "
            "a fractional GPU puts learner and engine on one device, where NCCL refuses two "
            "ranks; use rollout.weight_sync=object_store (works on a shared GPU)"
        )
    return None


def learner_seed(cfg: TrainConfig) -> int:
    """``learner.seed``, or one derived from ``trainer.seed`` when it is null."""
    from rollout.seeding import derive_seed

    if cfg.learner.seed is not None:
        return cfg.learner.seed
    return derive_seed(cfg.trainer.seed, "learner")


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


register_configs()
