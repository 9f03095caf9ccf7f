"""A reward function in verl's form, as a verl user brings it (docs/configuration.md, "Coming
from verl, OpenRLHF or TRL"): ``task=custom task.verifier=reward/verl_example.py:compute_score``.

GSM8K's rule: the number after the last ``####`` against the reference; 1 when equal, 0.1 for
an answer in the right format that is wrong (verl's ``format_score`` idea), 0 without one.

>>> compute_score("openai/gsm8k", "6 + 6 = 12\\n#### 12", "12")
1.0
>>> compute_score("openai/gsm8k", "#### 13", "12"), compute_score("openai/gsm8k", "12", "12")
(0.1, 0.0)
"""

from __future__ import annotations

import re

_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    found = _FINAL.findall(solution_str)
    if not found:
        return 0.0
    answer = found[-1].replace(",", "").rstrip(".")
    return 1.0 if answer == ground_truth.replace(",", "") else 0.1
