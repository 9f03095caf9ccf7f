"""The driver's tokenizer (launch/prompts.py ``load_tokenizer``): the one AutoTokenizer gives,
loaded without transformers' model registry where the folder holds a plain tokenizers-library
tokenizer (the shipped tiny models), through AutoTokenizer for any other class."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from launch.prompts import load_tokenizer
from tests.helpers import ROOT

SHIPPED = [ROOT / "launch" / "assets" / name for name in ("tiny-default", "tiny-fast")]
TEXTS = ["12+7=", "<s>3+4=", "(1+2)*3=9</s>", ""]


@pytest.mark.parametrize("folder", SHIPPED, ids=[f.name for f in SHIPPED])
def test_the_shipped_tokenizers_load_as_autotokenizer_loads_them(folder):
    from transformers import AutoTokenizer

    ours, auto = load_tokenizer(str(folder)), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(auto)
    for text in TEXTS:
        assert ours(text)["input_ids"] == auto(text)["input_ids"], text
    same = ("pad_token_id", "eos_token_id", "bos_token_id", "padding_side", "chat_template")
    assert [getattr(ours, k) for k in same] == [getattr(auto, k) for k in same]
    turn = [{"role": "user", "content": "3+4="}]
    assert ours.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) == (
        auto.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    )


def test_the_driver_process_never_imports_the_model_registry():
    # the registry (transformers.models.auto.modeling_auto) was ~1.6 core-s of each driver's
    # start; the tokenizer and what the driver renders with it do not need it
    code = (
        "import sys; from launch.prompts import load_tokenizer; "
        f"t = load_tokenizer({str(SHIPPED[0])!r}); t('1+1='); "
        "print('transformers.models.auto.modeling_auto' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_another_tokenizer_class_goes_through_autotokenizer(tmp_path, monkeypatch):
    import transformers

    folder = tmp_path / "tok"
    shutil.copytree(SHIPPED[1], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps(config | {"tokenizer_class": "Qwen2Tokenizer"})
    )
    asked = []
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda path: asked.append(path) or "auto"
    )
    assert load_tokenizer(str(folder)) == "auto" and asked == [str(folder)]
    assert load_tokenizer(str(SHIPPED[1])) != "auto"  # the plain class: loaded directly
