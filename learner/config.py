"""The ``algorithm`` config group's schema: which advantage estimator, AVSPO, trigger and loss.

Plain dataclasses (no Hydra import): ``launch/config.py`` registers them with Hydra's ConfigStore
and ``launch/validation.py`` validates field ``metadata`` (``choices``, ``ge``/``gt``/``le``/
``lt``) with the key's path.
Presets live in ``conf/algorithm/*.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.advantage import AUGMENT, RELEASE_SCOPES
from learner.estimators import ESTIMATORS
from learner.logprobs import LOGITS_MODES
from learner.loss import LossConfig
from learner.shared_prefix import PACK_MODES
from learner.tempered_logits import CHUNK_TOKENS
from learner.trigger import TriggerConfig
from learner.virtual_samples import STRATEGIES
from reward.intrinsic import IntrinsicRewardConfig


@dataclass
class AvspoConfig:
    """Virtual samples for collapsed groups (the ``avspo`` and ``avspo_release`` estimators)."""

    alpha: float = field(default=0.5, metadata={"gt": 0.0})
    """K_t = max(1, min(G, ceil(G * ACR_t ** alpha)))."""
    strategy: str = field(default="stratified", metadata={"choices": STRATEGIES})
    """stratified (paper) | fixed | random | opposite (authors' code)."""
    r_anchor: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    """Anchor of ``stratified`` virtual rewards for all-incorrect groups (share of the range)."""
    k: int | None = field(default=None, metadata={"ge": 1})
    """Fixed number of virtual samples per collapsed group (ablation); null = adaptive K_t."""
    augment: str = field(default="both", metadata={"choices": AUGMENT})
    """Which collapsed groups get virtual samples: both (AVSPO), incorrect (all-incorrect groups
    only) or correct (all-correct only): the paper's mechanism isolation (ablation)."""
    release_scope: str = field(default="group", metadata={"choices": RELEASE_SCOPES})
    """``avspo_release`` only: where the released rule looks for a single label. ``group``: every
    group whose rewards are all r_lo (all r_hi) gets one r_hi (r_lo) virtual sample, the fork's
    rule in its published settings, where a batch is one group; ``step``: only when the whole
    step is at one label (the literal reading; at 64 groups x 8 it practically never fires)."""


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (Yu et al. 2025), run by the driver: groups whose rewards are all
    equal are dropped and more prompts are generated until the step has
    ``trainer.prompts_per_step`` informative groups, for at most ``max_rounds`` generation rounds
    (then the step trains on what it has, topped up with dropped groups so its size is fixed).
    The ACR monitor sees every generated group (``acr/raw``: before the filter); the trained
    batch's collapse is ``acr/trained``."""

    enabled: bool = False
    max_rounds: int = field(default=3, metadata={"ge": 1})


@dataclass
class OverlongConfig:
    """DAPO's overlong handling (Yu et al. 2025, arXiv 2503.14476, section 3.4), off by default.

    With L_max = ``rollout.sampling.max_new_tokens`` and L_cache = ``buffer_len``, a response of
    |y| tokens gets the reward ``r + penalty(|y|)``,
    penalty = -factor * max(0, |y| - (L_max - L_cache)) / L_cache (0 .. -factor at L_max);
    ``filter`` masks truncated responses (finish reason "length") out of the loss."""

    shaping: bool = False
    buffer_len: int = field(default=4, metadata={"ge": 1})
    """L_cache in tokens (DAPO: 4,096 of 20,480); must be < the max response length."""
    penalty_factor: float = field(default=1.0, metadata={"ge": 0.0})
    filter: bool = False


@dataclass
class AlgorithmConfig:
    """One RL algorithm: advantage estimator by name plus its knobs and the policy loss."""

    name: str = "avspo"
    """Preset name, for logs and run directories."""
    estimator: str = field(default="avspo", metadata={"choices": lambda: tuple(ESTIMATORS)})
    """Registered advantage estimator: grpo | dr_grpo | rloo | avspo | avspo_release | dcpo."""
    eps: float = field(default=1e-6, metadata={"ge": 0.0})
    """Added to the std in GRPO-style normalisation (ours; TRL uses 1e-4)."""
    tau: float = field(default=1e-6, metadata={"ge": 0.0})
    """Collapse threshold on a group's population reward std: the one threshold of the
    estimators, the trigger's ACR_t, the ACR monitor and DAPO's filter."""
    unbiased_std: bool = True
    """Advantage std divides by G - 1 (TRL, verl) rather than G."""
    avspo: AvspoConfig = field(default_factory=AvspoConfig)
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    reward: IntrinsicRewardConfig = field(default_factory=IntrinsicRewardConfig)
    """Reward sources and their weights: the verifier, INTUITOR's self-certainty, RENT's
    negative entropy (reward/intrinsic.py)."""

    def check(self) -> str | None:
        r = self.reward
        if r.verifier == 0.0 and not r.intrinsic:
            return "reward: every weight is 0 (verifier, self_certainty, neg_entropy)"
        if r.intrinsic and self.dynamic_sampling.enabled:
            return (
                "dynamic_sampling.enabled: DAPO's filter judges groups by the verifier's score, "
                "before the intrinsic rewards exist; not supported with reward.self_certainty "
                "or reward.neg_entropy"
            )
        return None


@dataclass
class LoraConfig:
    """``learner.lora``: rank 0 trains every weight (no LoRA)."""

    rank: int = field(default=0, metadata={"ge": 0})
    alpha: float = field(default=16.0, metadata={"gt": 0.0})
    """The adapters' scale is alpha / rank."""
    dropout: float = field(default=0.0, metadata={"ge": 0.0, "lt": 1.0})
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names (suffixes) that get adapters; ``all-linear``: every linear layer but the
    output head (peft's shorthand)."""


@dataclass
class LearnerConfig:
    """The ``learner`` group (``conf/learner/*.yaml``): DeepSpeed ranks and the PPO update."""

    num_ranks: int = field(default=2, metadata={"ge": 1})
    zero_stage: int = field(default=2, metadata={"ge": 0, "le": 3})
    """DeepSpeed ZeRO stage 0-3. Stages 1-3 skip a step whose grad norm is not finite by
    themselves; for stage 0 the rank checks its gradients and all ranks skip together."""
    lr: float = field(default=1e-4, metadata={"ge": 0.0})
    """1e-4 for the tiny default with 64 x 8 samples per step (docs/NOTES.md: with 16 x 8 it was
    flat, 2e-4 and up degraded it); real models want ~1e-6. 0 is a weight-sync check: nothing
    the run measures may move (E7b)."""
    weight_decay: float = field(default=0.0, metadata={"ge": 0.0})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = field(default=1e-8, metadata={"gt": 0.0})
    warmup_steps: int = field(default=0, metadata={"ge": 0})
    """Linear LR warmup over this many optimizer steps, then constant."""
    grad_clip: float = field(default=1.0, metadata={"gt": 0.0})
    micro_batch_size: int | None = field(default=None, metadata={"ge": 1})
    """Samples per forward/backward on one rank; null (default) = micro-batches by a token
    budget: ``micro_batch_tokens``, or sized for the device when that is null too."""
    micro_batch_tokens: int | None = field(default=None, metadata={"ge": 1})
    """Token budget of a micro-batch instead of a sample count: each rank's share of a
    mini-batch is packed, longest first, whole groups together, into micro-batches of at most
    this many padded tokens (rows x longest sequence); a longer sequence gets a micro-batch of
    its own; every rank runs the same number of micro-batches (learner/batch.py
    ``plan_microbatches``). null (and ``micro_batch_size`` null) = sized for the device: each
    rank divides ``activation_memory_fraction`` of its free device memory (CPU: available RAM,
    shared by the ranks of the node) by an estimate of the activation bytes per token
    (learner/policy.py ``auto_micro_batch_tokens``); the smallest rank's figure is used."""
    activation_memory_fraction: float = field(default=0.25, metadata={"gt": 0.0, "le": 1.0})
    """Share of the free memory the automatic micro-batch budget may fill with activations."""
    shared_prefix: bool = True
    """Compute each distinct prompt of a micro-batch once (a group's n samples share it) and the
    responses on its KV cache (learner/shared_prefix.py ``shared_prefix_hidden``): same log-probs
    and gradients to float rounding on ~(P + nR) instead of n(P + R) tokens per group. Off with
    ``gradient_checkpointing`` (transformers drops the cache then), with ``logits=full``, and
    for a model where the shared path does not reproduce the plain one (checked at start)."""
    pack: str = field(default="auto", metadata={"choices": PACK_MODES})
    """Layout of the shared-prefix passes (learner/shared_prefix.py): ``off`` runs the prompts
    and the responses as padded batches; ``on`` packs each into one row with a block attention
    mask (no padding through the weights; attention over the whole row); ``auto`` packs a
    micro-batch when that costs fewer FLOPs by the model's shapes (responses of unequal lengths;
    not long rows). Packing needs sdpa or eager attention and no sliding-window layers (else
    padded), and passes the same numeric check at start as the shared prefix (else ``off``,
    logged)."""
    mini_batch_size: int | None = field(default=256, metadata={"ge": 1})
    """At most this many samples per optimizer step (over all ranks): a step's batch of n
    samples makes ceil(n / mini_batch_size) equal mini-batches, one optimizer step each; null =
    one optimizer step per training step. Default: 2 steps for the default 64 x 8 samples."""
    ppo_epochs: int = field(default=1, metadata={"ge": 1})
    old_logprobs: str = field(default="auto", metadata={"choices": ("auto", "bypass", "recompute")})
    """Old log-probs of the PPO ratio: ``bypass`` takes the engine's (right when engine and
    learner compute the same numbers: fp32 on CPU, measured gap ~1e-6); ``recompute`` runs a
    no-grad learner forward before the first update and weights each token's loss by
    min(exp(logp_learner_old - logp_engine), tis_cap) (bf16, GPUs: the GPU cluster presets);
    ``auto``: recompute when the learner trains in bf16 (engine and learner then differ by
    ~0.04 nats on SmolLM2), bypass in fp32."""
    tis_cap: float | None = field(default=2.0, metadata={"ge": 1.0})
    """Truncated importance-sampling cap in ``recompute`` mode (authors' code, TRL: 2.0);
    null = recompute without importance weights."""
    logits: str = field(default="chunked", metadata={"choices": LOGITS_MODES})
    """How log-probs and entropy are computed (learner/logprobs.py): ``chunked`` runs the
    decoder, then the output embedding and softmax over pieces of ``logits_chunk_tokens``
    positions (never the whole [B, T, V] logits; response tokens only); ``full`` takes the
    model's logits. A model whose logits are not lm_head(hidden) falls back to ``full`` (logged
    with the reason)."""
    logits_chunk_tokens: int = field(default=CHUNK_TOKENS, metadata={"ge": 1})
    """Positions per piece of the logits: the peak logits memory is ~ this x vocabulary x 18
    bytes (2,048 x 152k: ~5.6 GB; the full [32, 4096, 152k] logits are ~40 GB in bf16)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (learner/lora.py): ``lora.rank`` > 0 trains adapters on the frozen
    model (the optimizer holds the adapters' state only); the engines and checkpoints get the
    merged weights."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in the backward pass (transformers' non-reentrant
    checkpointing): activation memory of one layer instead of all. transformers checkpoints only
    in training mode, so the model is put in ``train()`` mode (dropout as its config sets; 0 for
    Llama/Qwen2-style models)."""
    attn_implementation: str | None = field(
        default=None, metadata={"choices": ("eager", "sdpa", "flash_attention_2")}
    )
    """transformers' attention kernel for the learner (``from_pretrained``); null = its default."""
    dtype: str | None = field(default=None, metadata={"choices": ("float32", "bfloat16")})
    """Learner weights and activations; null = ``model.dtype`` (what the engines use; float32 on
    the CPU default). ``bfloat16`` turns on DeepSpeed's bf16 mode: bf16 forward/backward, fp32
    master weights and Adam state in the optimizer, fp32 gradient accumulation (ZeRO 1-3)."""
    bf16_masters: str = field(default="dither", metadata={"choices": ("dither", "grid")})
    """With a bf16 learner: ``dither`` offsets each fp32 master once, inside its bf16 rounding
    cell (the weights unchanged), so the first updates move weights in proportion to their
    drift; ``grid`` keeps DeepSpeed's masters on the bf16 grid, where a weight moves only once
    its master drifted half a spacing (learner/bf16_masters.py). Ignored in fp32."""
    num_cpus_per_rank: float = field(default=1.0, metadata={"ge": 0.0})
    num_gpus_per_rank: float = field(default=0.0, metadata={"ge": 0.0})
    timeout_s: float = field(default=900.0, metadata={"gt": 0.0})
    seed: int | None = None
    """Seeds the learner ranks' torch RNG and the advantage stage's virtual-value draws
    (``random`` strategy); null = derived from ``trainer.seed`` (launch/config.py
    ``learner_seed``), so each run seed draws its own."""


def old_logprobs_mode(setting: str, dtype: str) -> str:
    """``learner.old_logprobs`` with ``auto`` resolved for a learner in ``dtype``.

    >>> old_logprobs_mode("auto", "bfloat16"), old_logprobs_mode("auto", "float32")
    ('recompute', 'bypass')
    """
    if setting != "auto":
        return setting
    return "recompute" if dtype == "bfloat16" else "bypass"


def minibatch_problem(n: int, mini_batch_size: int | None, num_ranks: int) -> str | None:
    """Why a batch of ``n`` samples cannot be split into ceil(n / mini_batch_size) equal
    mini-batches with equal sample counts per rank (None when it can).

    >>> minibatch_problem(512, 256, 2), minibatch_problem(24, 256, 2)
    (None, None)
    >>> minibatch_problem(384, 256, 2)  # 2 mini-batches of 192
    >>> minibatch_problem(300, 256, 4)[-65:]
    'gives 150 per mini-batch, not a multiple of learner.num_ranks (4)'
    """
    m = -(-n // (mini_batch_size or n))  # ceil
    if n % m or (n // m) % num_ranks:
        return (
            f"a batch of {n} samples in {m} mini-batches of at most {mini_batch_size or n} gives "
            f"{n / m:g} per mini-batch, not a multiple of learner.num_ranks ({num_ranks})"
        )
    return None
