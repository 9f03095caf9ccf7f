"""LoRA (``learner.lora``): the learner trains low-rank adapters (peft) on a frozen model; the
engines and checkpoints see the merged weights.

Only the adapters require gradients, so the optimizer (AdamW under DeepSpeed, any ZeRO stage)
holds state for them alone. What leaves the learner is the merged model under the base model's
parameter names, ``W + (alpha / r) B A`` for every adapted linear layer (:func:`sync_units`): the
weight sync sends it to the engines exactly as a fully fine-tuned model (both engines, both
transports, no engine-side LoRA support needed), and a checkpoint's ``model/`` folder holds it
(loadable by anything), beside the adapter alone in ``adapter/``. The merge is computed into new
tensors, never in place: the frozen weights stay bit-exact over a run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from learner.config import LoraConfig

ADAPTER = "default"  # peft's name for the one adapter


def wrap(model, cfg: LoraConfig):
    """``model`` with adapters on ``cfg.target_modules`` (peft), everything else frozen."""
    import peft

    targets = cfg.target_modules
    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets[0] if targets == ["all-linear"] else list(targets),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def base_name(name: str) -> str:
    """A peft parameter name as the base model names it.

    >>> base_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
    'model.layers.0.self_attn.q_proj.weight'
    >>> base_name("model.embed_tokens.weight")
    'model.embed_tokens.weight'
    """
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@dataclass
class SyncUnit:
    """One tensor the engines receive: its name, the parameters it is computed from (what
    ZeRO-3 gathers for it) and how."""

    name: str
    params: list[torch.nn.Parameter]
    value: Callable[[], torch.Tensor]


def sync_units(module: torch.nn.Module) -> list[SyncUnit]:
    """The tensors of the model the engines load, in ``named_parameters()`` order: every
    parameter as is, or, for a peft model, every frozen one under its base name with each
    adapted weight merged (the adapters themselves are not sent)."""
    layers = _lora_layers(module)
    units = []
    for name, p in module.named_parameters():
        if ".lora_" in name:
            continue  # inside its layer's merged weight
        layer = layers.get(name)
        if layer is None:
            units.append(SyncUnit(base_name(name), [p], lambda p=p: p.data))
            continue
        a, b = _adapters(layer)
        units.append(SyncUnit(base_name(name), [p, a, b], lambda p=p, m=layer: _merged(p, m)))
    return units


def _adapters(layer) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    """A LoRA layer's A and B weights."""
    return layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight


def _merged(w: torch.Tensor, layer) -> torch.Tensor:
    """``W + (alpha / r) B A`` of ``layer``'s adapter by peft's own merge (``get_delta_weight``:
    its scaling, rsLoRA and fan-in/fan-out conventions, in W's dtype as ``merge_and_unload``
    computes it), into a new tensor: W is not touched."""
    with torch.no_grad():
        return w.data + layer.get_delta_weight(ADAPTER).to(w.dtype)


def _lora_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{name of the frozen weight: its LoRA layer}`` of a peft model (empty otherwise)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft installed: no adapters either
        return {}
    return {
        f"{name}.base_layer.weight": layer
        for name, layer in module.named_modules()
        if isinstance(layer, LoraLayer) and ADAPTER in layer.lora_A
    }


def state_units(module: torch.nn.Module) -> list[SyncUnit]:
    """Every entry of ``module.state_dict()`` (tied weights under each name, buffers) as a
    :class:`SyncUnit` under its base name, each adapted weight merged, the adapters left out:
    what a checkpoint's ``model/`` holds, one entry at a time (the caller gathers each unit's
    ZeRO-3 shards around its ``value()``)."""
    layers = _lora_layers(module)
    units = []
    for name, t in module.state_dict(keep_vars=True).items():
        if ".lora_" in name:
            continue
        layer = layers.get(name)
        if layer is None:
            params = [t] if isinstance(t, torch.nn.Parameter) else []  # buffers: never sharded
            units.append(SyncUnit(base_name(name), params, lambda t=t: t.data))
            continue
        a, b = _adapters(layer)
        units.append(SyncUnit(base_name(name), [t, a, b], lambda t=t, m=layer: _merged(t, m)))
    return units


def merged_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The (merged) model's state dict under the base names, CPU copies (:func:`state_units`);
    the caller gathers ZeRO-3 shards around it (learner/export.py gathers entry by entry)."""
    return {u.name: u.value().detach().to("cpu", copy=True) for u in state_units(module)}


def adapter_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The adapters' parameters (empty without LoRA)."""
    return [p for name, p in module.named_parameters() if ".lora_" in name]


def adapter_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """A peft model's adapter weights as peft saves them (CPU copies), else None. The caller
    gathers ZeRO-3 shards around it."""
    if not hasattr(module, "peft_config"):
        return None
    from peft import get_peft_model_state_dict

    return {
        k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(module).items()
    }


def save_model(module: torch.nn.Module, state: dict, adapter: dict | None, folder: str) -> None:
    """``folder/model``: the (merged) model as a transformers folder, from ``state``
    (:func:`merged_state_dict`); a peft model's adapter alone (``adapter``) in ``folder/adapter``
    as peft lays it out (``PeftModel.from_pretrained`` loads it)."""
    import os

    from safetensors.torch import save_file

    base = module.get_base_model() if adapter is not None else module
    base.save_pretrained(os.path.join(folder, "model"), state_dict=state, safe_serialization=True)
    if adapter is not None:
        path = os.path.join(folder, "adapter")
        module.peft_config[ADAPTER].save_pretrained(path)
        save_file(adapter, os.path.join(path, "adapter_model.safetensors"))
