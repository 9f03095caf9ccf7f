"""The FLOP count of tests/benchmarks/bench_learner_flops.py, against the shipped default model's
own weights and a hand count."""

import torch

from tests.benchmarks.bench_learner_flops import model_flops


def test_decoder_weights_are_the_models_matmul_weights_and_flops_add_up():
    """The default tiny model: hidden 256, 4 layers, 8 heads of 32 (8 KV heads), MLP 768,
    vocabulary 32. Per layer q, k, v, o 4 x 256 x 256 = 262,144 and the MLP 3 x 256 x 768 =
    589,824: 851,968, x 4 layers = 3,407,872, which is every 2-D weight but the (tied)
    embedding. One row of 3 tokens (its last 2 scored) through the decoder:
    forward = 2 x 3,407,872 x 3 + 2 x (32 x 256) x 2 + attention 4 x 256 x 4 x (1 + 2 + 3)
    = 20,447,232 + 32,768 + 24,576 = 20,504,576; the update 3x that."""
    from pathlib import Path

    from safetensors.torch import load_file

    from launch.models.bootstrap import ensure_model
    from launch.models.model_config import ModelConfig

    path = ensure_model(ModelConfig(), log=lambda *_: None)
    weights = load_file(next(Path(path).glob("*.safetensors")))
    matmul = sum(v.numel() for k, v in weights.items() if v.dim() == 2 and "embed" not in k)

    class Batch:
        attention_mask = torch.tensor([[1, 1, 1, 0]])

    metrics = {"perf/learner_decoder_tokens": 3.0, "perf/learner_tokens": 2.0}
    flops = model_flops(path, metrics, Batch())
    assert flops["decoder_weights"] == matmul == 3_407_872
    assert flops["forward"] == 20_504_576
    assert flops["update"] == 3 * 20_504_576
