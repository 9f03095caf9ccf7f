"""Rendered prompts reach the model with one BOS: a chat template that writes the BOS itself
(Llama-3, Gemma) must not get a second one from the tokenizer."""

from __future__ import annotations

from launch.models.tiny_model import build_tokenizer
from launch.prompts import render
from reward.tasks import Problem
from rollout.engine import encode_prompt
from rollout.hf_engine import HFEngine
from rollout.types import SamplingConfig

# the tiny tokenizer's template written as Llama-3's and Gemma's are: the BOS first
WRITES_BOS = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_the_bos_comes_once_whoever_writes_it():
    tok = build_tokenizer()  # adds <s> itself; its own template does not write it
    plain = encode_prompt(tok, "3+4=")
    assert plain[0] == tok.bos_token_id and plain.count(tok.bos_token_id) == 1
    assert encode_prompt(tok, "<s>3+4=") == plain  # written by a template: not added again
    assert encode_prompt(tok, "3+4=<s>").count(tok.bos_token_id) == 2  # only a leading one


def test_the_hf_engine_prompts_a_bos_writing_template_with_one_bos(tiny_model_dir):
    """Rendered through the production path (launch/prompts.py render) with a template that
    writes the BOS, the engine's prompt ids are the plain prompt's: one BOS, then the text."""
    engine = HFEngine(tiny_model_dir)
    engine.tokenizer.chat_template = WRITES_BOS
    problem = Problem(uid="u", question="3+4", prompt="3+4=", answer="7")
    (rendered,) = render([problem], engine.tokenizer, chat_template=True, system_prompt=None)
    assert rendered.prompt == "<s>3+4="
    (group,) = engine.generate([rendered.prompt], SamplingConfig(n=2, max_new_tokens=4))
    assert group.prompt_ids == encode_prompt(engine.tokenizer, "3+4=")
    assert group.prompt_ids.count(engine.tokenizer.bos_token_id) == 1
