"""The transformers engine: batched ``generate`` with left padding and KV cache on any torch
device. The reference for log-prob checks and the fallback when vLLM is not installed.

Log-probs come from the raw logits of each generation step (``output_logits``), so they are the
model's own distribution at temperature 1, whatever the sampling temperature (rollout/types.py).
"""

from __future__ import annotations

import torch

from rollout.types import Group, Sample, SamplingConfig


class HFEngine:
    def __init__(self, model_path: str, *, dtype: str = "float32", device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, dtype)
        ).to(device)
        self.model.eval()
        self.device = device
        self.policy_version = 0

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingConfig) -> list[Group]:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True).to(self.device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        greedy = params.temperature == 0
        # n copies of each prompt (transformers refuses num_return_sequences > 1 when greedy)
        batch = {k: v.repeat_interleave(params.n, dim=0) for k, v in enc.items()}
        out = self.model.generate(
            **batch,
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        width = enc["input_ids"].shape[1]
        new = out.sequences[:, width:]  # [B*n, T]
        logits = torch.stack(out.logits, dim=1).float()  # [B*n, T, V] raw, before processors
        logp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        groups = []
        for i, prompt in enumerate(prompts):
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            samples = [
                self._sample(new[i * params.n + j], logp[i * params.n + j]) for j in range(params.n)
            ]
            groups.append(Group(prompt=prompt, prompt_ids=prompt_ids, samples=samples))
        return groups

    def _sample(self, ids: torch.Tensor, logp: torch.Tensor) -> Sample:
        ids_list = ids.tolist()
        eos = self.tokenizer.eos_token_id
        stop = eos in ids_list
        end = ids_list.index(eos) + 1 if stop else len(ids_list)
        return Sample(
            response_ids=ids_list[:end],
            logprobs=logp[:end].tolist(),
            text=self.tokenizer.decode(ids_list[:end], skip_special_tokens=True),
            finish_reason="stop" if stop else "length",
            policy_version=self.policy_version,
        )

    @torch.no_grad()
    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-probs of ``response_ids`` given ``prompt_ids`` (teacher forcing)."""
        ids = torch.tensor([prompt_ids + response_ids], device=self.device)
        logits = self.model(input_ids=ids).logits.float()[0, len(prompt_ids) - 1 : -1]
        logp = torch.log_softmax(logits, -1)
        return logp.gather(-1, torch.tensor(response_ids, device=self.device)[:, None])[
            :, 0
        ].tolist()

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise KeyError(
                f"weights do not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        self.policy_version = version
