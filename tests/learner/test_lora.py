"""learner/lora.py on a small Llama (no Ray): only adapters train, the merged weights under the
base names equal peft's own merge, and a saved checkpoint folder loads as a plain model and as
base + adapter with the same outputs."""

from __future__ import annotations

import copy

import pytest
import torch

from learner.config import LearnerConfig, LoraConfig
from learner.lora import adapter_state_dict, merged_state_dict, save_model, sync_units, wrap

peft = pytest.importorskip("peft")


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _trained_lora(cfg: LoraConfig):
    """A wrapped model whose adapters moved off their zero start (B = 0 at init)."""
    model = wrap(_llama(), cfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


def test_only_the_adapters_train_on_every_linear_but_the_head():
    base = _llama()
    model = wrap(copy.deepcopy(base), LoraConfig(rank=4, alpha=8))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # 2 layers x 7 linears (q k v o gate up down), A and B each; the tied head has none
    assert len(trainable) == 2 * 7 * 2
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) < 0.2 * sum(
        p.numel() for p in base.parameters()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_weights_equal_peft_merge_under_the_base_names(dtype):
    """Bit for bit: the merge is peft's own (``get_delta_weight``), as ``merge_and_unload``."""
    model = _trained_lora(LoraConfig(rank=4, alpha=8)).to(dtype)
    merged = merged_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload()  # peft's own merge
    assert list(merged) == list(reference.state_dict())  # the base names, in the model's order
    for name, t in reference.state_dict().items():
        torch.testing.assert_close(merged[name], t, rtol=0, atol=0)
    units = sync_units(model)  # what the collective sync sends: each parameter once
    assert [u.name for u in units] == [n for n, _ in reference.named_parameters()]
    for u in units:
        torch.testing.assert_close(u.value(), merged[u.name], rtol=0, atol=0)
    frozen = dict(model.named_parameters())[
        "base_model.model.model.layers.0.mlp.up_proj.base_layer.weight"
    ]
    assert not torch.equal(merged["model.layers.0.mlp.up_proj.weight"], frozen.data)  # moved
    before = frozen.data.clone()
    merged_state_dict(model)
    assert torch.equal(frozen.data, before)  # merged into new tensors, never in place


def test_a_model_without_adapters_syncs_its_parameters_as_they_are():
    model = _llama()
    units = sync_units(model)
    assert [u.name for u in units] == [n for n, _ in model.named_parameters()]
    assert all(u.value().data_ptr() == u.params[0].data_ptr() for u in units)  # no copy
    assert adapter_state_dict(model) is None


def test_a_checkpoint_loads_as_the_merged_model_and_as_base_plus_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = _trained_lora(LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    save_model(model, merged_state_dict(model), adapter_state_dict(model), str(tmp_path))
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "model")(input_ids=ids).logits
        again = PeftModel.from_pretrained(_llama(), tmp_path / "adapter")(input_ids=ids).logits
    torch.testing.assert_close(plain, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, want, rtol=0, atol=1e-6)


def test_the_learner_config_holds_lora_off_by_default():
    assert LearnerConfig().lora.rank == 0 and LearnerConfig().lora.target_modules == ["all-linear"]
