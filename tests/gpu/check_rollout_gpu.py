"""One-command GPU check of the rollout engines (official vllm on CUDA):

    python tests/gpu/check_rollout_gpu.py [--model DIR] [--tp 1]

1. builds (or finds) the tiny model, starts vLLM on the GPU, generates n samples per prompt;
2. log-prob agreement: vLLM's sampled-token log-probs vs a transformers forward pass (fp32);
3. weight update in place: perturbed weights pushed with version 1 change the log-probs of a
   fixed sequence to match a transformers forward pass of the pushed weights (tied lm_head).
Prints PASS/FAIL per check and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check is for GPU machines")
        return 2
    from transformers import AutoModelForCausalLM

    from launch.bootstrap import ModelConfig, ensure_model
    from rollout.types import SamplingConfig
    from rollout.vllm_engine import VLLMEngine

    path = args.model or ensure_model(ModelConfig())
    engine = VLLMEngine(
        path,
        dtype="float32",
        max_model_len=64,
        tensor_parallel_size=args.tp,
        gpu_memory_utilization=0.3,
    )
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ok = True

    def forward(model, prompt_ids, response_ids):
        ids = torch.tensor([prompt_ids + response_ids], device="cuda")
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, len(prompt_ids) - 1 : -1]
        lp = torch.log_softmax(logits, -1)
        return lp.gather(-1, torch.tensor(response_ids, device="cuda")[:, None])[:, 0].cpu()

    groups = engine.generate(["12+7=", "61-27="], SamplingConfig(n=8, max_new_tokens=6, seed=0))
    gap = max(
        (torch.tensor(s.logprobs) - forward(ref, g.prompt_ids, s.response_ids)).abs().max().item()
        for g in groups
        for s in g.samples
    )
    ok &= gap < 1e-3
    print(f"{'PASS' if gap < 1e-3 else 'FAIL'} generation + log-prob agreement: max gap {gap:.2e}")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(ref.state_dict(), version=1)
    prompt_ids, response_ids = [1, 10, 5, 15, 6, 11, 17], [7, 8, 2]
    got = torch.tensor(engine.score(prompt_ids, response_ids))
    gap = (got - forward(ref, prompt_ids, response_ids)).abs().max().item()
    ok &= gap < 1e-3 and engine.policy_version == 1
    print(f"{'PASS' if gap < 1e-3 else 'FAIL'} weight update in place: max gap {gap:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
