"""The metric names of docs/ARCHITECTURE.md section 5, written out from docs/ARCHITECTURE.md (not
imported from the code, so that a renamed metric fails the tests)."""

ACR = frozenset(
    {
        "acr/raw",
        "acr/high",
        "acr/low",
        "acr/effective",
        "acr/batch_collapsed",
        "acr/ema",
        "acr/window",
        "acr/volatility",
        "acr/acr100",
        "acr/wasted_token_frac",
    }
)
AVSPO = frozenset(
    {
        "avspo/triggered",
        "avspo/tau_adapt",
        "avspo/k",
        "avspo/virtual_samples",
        "avspo/augmented_groups",
    }
)
VERIFIER = frozenset({"reward/verifier_error_frac", "reward/verifier_timeout_frac"})
SECTION5 = ACR | AVSPO | VERIFIER

# What every training step of a run logs: section 5 and more (the e2e runs check them all).
STEP_KEYS = SECTION5 | {
    "acr/trained",
    "acr/acr100_steps",
    "reward/mean",
    "reward/mean_trained",
    "response_length/mean",
    "response_length/mean_trained",
    "avspo/acr_trigger",
    "actor/grad_clip_frac",
    "actor/grad_clip_frac_all_steps",
    "rollout/lagged_token_frac",
    "response_length/clip_ratio",
    # what users' dashboards look for (verl's critic/advantages/*, response_length/{max,min},
    # prompt_length/*; TRL's completions/{min,max}_length): docs/metrics.md's table
    "response_length/max",
    "response_length/min",
    "prompt_length/mean",
    "prompt_length/max",
    "prompt_length/min",
    "advantage/mean",
    "advantage/max",
    "advantage/min",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "rollout/logprob_abs_diff_mean",
    "rollout/logprob_abs_diff_max",
    "rollout/is_weight_mean",
    "rollout/is_clipped_frac",
    "rollout/mixed_token_share",
    "verifier/faulted_groups",
    "verifier/faulted_group_frac",
    "timing_s/advantage",
    "timing_s/generate",
    "timing_s/verify",
    "timing_s/learner",
    "timing_s/weight_sync",
    "timing_s/other",
    "timing_s/step",
}

# The fields of each samples.jsonl record (logger.samples: diagnostics/samples.py), in order.
SAMPLE_FIELDS = [
    "step", "group_id", "sample", "prompt_uid", "prompt", "response", "reference", "reward",
    "score", "verdict", "correct", "advantage", "group_rewards", "trained", "finish_reason",
    "response_tokens",
]  # fmt: skip
