"""The transformers engine: a batched decode loop with left padding and KV cache on any torch
device. The reference for log-prob checks and the fallback when vLLM is not installed.

Sampling follows the contract of rollout/seeding.py: row (prompt p, sample j) draws from its own
``torch.Generator`` seeded with ``sample_seed(seed, p, j)`` (p and j as the call's shares name
them: rollout/shares.py), by inverse-CDF sampling of
softmax(logits / T), so two copies of a prompt in one call give independent samples and a row's
draws do not depend on the other rows. ``Sample.logprobs`` are log-probs of the distribution
that was sampled, log_softmax(logits / T) (log_softmax(logits) when greedy), as vLLM's
``processed_logprobs`` mode returns them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from rollout.engine import encode_prompt
from rollout.seeding import call_seed, sample_seed
from rollout.shares import whole
from rollout.types import Group, Sample, SamplingConfig, Share


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
        self.receiver = None  # the collective sync's end (open_weight_group)

    @torch.no_grad()
    def generate(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> list[Group]:
        """rollout/engine.py ``Engine.generate``."""
        tok = self.tokenizer
        shares = shares or whole(len(prompts), params.n)
        counts = [s.stop - s.start for s in shares]  # rows of each prompt
        enc = tok.pad({"input_ids": [encode_prompt(tok, p) for p in prompts]}, return_tensors="pt")
        ids = enc["input_ids"].to(self.device)  # [B, P]
        mask = enc["attention_mask"].to(self.device)
        generators = None
        if params.temperature > 0:
            generators = sample_generators(call_seed(params.seed), shares)
        new, logp = self._decode(ids, mask, counts, params, generators)  # [R, T], R = sum(counts)
        groups, row = [], 0
        for i, prompt in enumerate(prompts):
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            samples = [self._sample(new[r], logp[r]) for r in range(row, row + counts[i])]
            groups.append(Group(prompt=prompt, prompt_ids=prompt_ids, samples=samples))
            row += counts[i]
        return groups

    def generate_stream(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> Iterator[list[tuple[int, Group]]]:
        """One static batch: every group at once, when the last row stops."""
        yield list(enumerate(self.generate(prompts, params, shares)))

    def _decode(self, ids, mask, counts: list[int], params: SamplingConfig, generators):
        """Token ids and their log-probs ``[R, T]`` (``counts[b]`` rows for prompt b of
        ``ids [B, P]``, R = sum(counts)); rows stop at EOS (padded after it). Each prompt is
        prefilled once and its KV cache copied to its rows."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        position = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at 0
        # row r's prompt: [R]
        rows = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts)).to(self.device)
        done = torch.zeros(sum(counts), dtype=torch.bool, device=self.device)
        past, step_ids, tokens, logps = None, ids, [], []
        for i in range(params.max_new_tokens):
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=position,
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            )
            past = out.past_key_values
            logits = out.logits[:, -1].float()  # [R, V] ([B, V] after the prefill)
            if i == 0 and counts != [1] * len(counts):  # the prefill ran once per prompt
                past.batch_select_indices(rows)
                logits, mask, position = logits[rows], mask[rows], position[rows]
            if generators is None:
                logp_all = torch.log_softmax(logits, -1)
                token = logits.argmax(-1)
            else:
                logp_all = torch.log_softmax(logits / params.temperature, -1)
                token = _draw(logp_all, generators)
            token = torch.where(done, torch.full_like(token, pad), token)
            tokens.append(token)
            logps.append(logp_all.gather(-1, token[:, None])[:, 0])
            done |= token == eos
            if bool(done.all()):
                break
            step_ids = token[:, None]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            position = position[:, -1:] + 1
        return torch.stack(tokens, 1), torch.stack(logps, 1)

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
    def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Log-probs of ``response_ids`` given ``prompt_ids`` under softmax(logits / T)."""
        ids = torch.tensor([prompt_ids + response_ids], device=self.device)
        logits = self.model(input_ids=ids).logits.float()[0, len(prompt_ids) - 1 : -1]
        logp = torch.log_softmax(logits / temperature, -1)
        return logp.gather(-1, torch.tensor(response_ids, device=self.device)[:, None])[
            :, 0
        ].tolist()

    def load_weights(self, buckets: Iterable[dict[str, torch.Tensor]], version: int) -> None:
        """New weights, one ``{name: tensor}`` bucket at a time (rollout/weight_sync.py)."""
        self._copy_in((pair for bucket in buckets for pair in bucket.items()), version)

    def load_file(self, path: str, version: int) -> None:
        """New weights from a safetensors file (comm/weight_file.py: views, copied in)."""
        from comm.weight_file import read_weights

        self._copy_in(read_weights(path), version)

    @torch.no_grad()
    def _copy_in(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy ``(name, tensor)`` pairs (state-dict names) into the model as they come, one
        bucket at a time; every parameter must arrive (a tied lm_head is the embedding: either
        name fills it)."""
        targets = self.model.state_dict(keep_vars=True)
        seen, unexpected = set(), []
        for name, tensor in named:
            if name in targets:
                targets[name].data.copy_(tensor)
                seen.add(id(targets[name]))
            else:
                unexpected.append(name)
        missing = [n for n, p in self.model.named_parameters() if id(p) not in seen]
        if unexpected or missing:
            raise KeyError(
                f"weights do not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        self.policy_version = version

    def sleep(self) -> None:
        """Nothing to release (the engine for CPUs and debugging has no sleep mode)."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """See :meth:`sleep`."""

    def weights_checksum(self) -> tuple[float, float]:
        """comm/weight_protocol.py ``checksum`` of the model's parameters."""
        from comm.weight_protocol import checksum

        return checksum(p for _, p in self.model.named_parameters())

    def open_weight_group(self, group, first_rank: int, specs) -> list[int]:
        """Join the collective weight-sync group (comm/weight_protocol.py) as one rank."""
        from comm.weight_protocol import open_receiver

        if self.receiver is not None:  # a rebuilt group replaces the old one: abort it first
            self.receiver.close()
        self.receiver = open_receiver(group, first_rank, specs)
        return [first_rank]

    def receive_weights(self, version: int) -> None:
        """Receive policy ``version`` from learner rank 0's broadcast and load it."""
        self._copy_in(self.receiver.receive(version), version)


def sample_generators(seed: int, shares: list[Share]) -> list[torch.Generator]:
    """One CPU generator per row, sample j of the prompt at position p of each share in turn,
    seeded ``sample_seed(seed, p, j)``. On the CPU whatever device the model is on: the uniform
    draws are made there (:func:`_draw`), so a row's stream is the same on every device."""
    return [
        torch.Generator("cpu").manual_seed(sample_seed(seed, s.position, j))
        for s in shares
        for j in range(s.start, s.stop)
    ]


def _draw(logp: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row from ``exp(logp) [R, V]``, row r with ``generators[r]`` (inverse CDF;
    the uniforms drawn on the CPU, the search on ``logp``'s device)."""
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    cdf = logp.double().exp().cumsum(-1)  # [R, V]
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp(max=logp.shape[-1] - 1).to(logp.device)
