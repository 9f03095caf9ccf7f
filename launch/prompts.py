"""What the policy sees: a task's problems rendered for the model.

Base models and the tiny default read the task's plain template (``task.prompt_template``).
With ``task.chat_template`` the templated question becomes the user turn of the tokenizer's own
chat template (``apply_chat_template``, generation prompt appended), after an optional system
turn (``task.system_prompt``), as the paper's authors prompt Qwen2.5-Math.

>>> from reward.tasks import Problem
>>> class Tok:  # a stand-in with the transformers signature
...     def apply_chat_template(self, messages, tokenize, add_generation_prompt):
...         return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"
>>> p = Problem(uid="u", question="1+1", prompt="1+1?", answer="2")
>>> render([p], Tok(), chat_template=True, system_prompt="Be brief.")[0].prompt
'system:Be brief.|user:1+1?|assistant:'
>>> render([p], Tok(), chat_template=False, system_prompt=None)[0].prompt
'1+1?'
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from reward.tasks import Problem

# tokenizer classes that are the tokenizers library's own (tokenizer.json), with nothing of a
# model's: what AutoTokenizer picks for them is this class itself
PLAIN_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(folder: str):
    """``AutoTokenizer.from_pretrained(folder)``. Where the folder's tokenizer is a plain
    tokenizers-library one (``tokenizer_class`` in :data:`PLAIN_TOKENIZERS`, with its
    tokenizer.json: the shipped tiny models), that class loads it directly, as AutoTokenizer
    would, without importing transformers' model registry (a tiny run's driver: 9.4 core-s
    before, 6.1 after; docs/NOTES.md). Any other class (a model's own, e.g. Qwen2Tokenizer):
    AutoTokenizer."""
    config = Path(folder) / "tokenizer_config.json"
    try:
        plain = json.loads(config.read_text()).get("tokenizer_class") in PLAIN_TOKENIZERS
    except (OSError, ValueError):
        plain = False
    if plain and (Path(folder) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def render(
    problems: list[Problem], tokenizer, *, chat_template: bool, system_prompt: str | None
) -> list[Problem]:
    """``problems`` with their prompts rendered: through the model's chat template with
    ``chat_template``, and always where the data holds chat messages (verl's ``prompt``
    column: rendered as written, ``system_prompt`` first where they have no system turn);
    else unchanged."""
    if not chat_template and not any(p.messages for p in problems):
        return problems
    if getattr(tokenizer, "chat_template", "") is None:
        why = "task.chat_template" if chat_template else "task.question_key (chat messages)"
        raise ValueError(f"{why}: the model's tokenizer has no chat template")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def turns(p: Problem) -> list[dict]:
        if p.messages is None:
            return [*system, {"role": "user", "content": p.prompt}]
        messages = [dict(m) for m in p.messages]
        return messages if messages[0]["role"] == "system" else [*system, *messages]

    return [
        dataclasses.replace(
            p,
            prompt=tokenizer.apply_chat_template(
                turns(p), tokenize=False, add_generation_prompt=True
            ),
        )
        if chat_template or p.messages
        else p
        for p in problems
    ]
