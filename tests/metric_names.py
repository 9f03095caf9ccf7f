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
        "avspo/groups_augmented",
    }
)
VERIFIER = frozenset({"reward/verifier_error_frac", "reward/verifier_timeout_frac"})
SECTION5 = ACR | AVSPO | VERIFIER
