"""Benchmark: LoRA (learner.lora) against full fine-tuning on SmolLM2-135M: trainable
parameters, optimizer state, peak memory, update time and what a weight sync sends per step.

    .venv/bin/python tests/benchmarks/bench_lora.py                 # rank 16, 8 x 256 tokens
    .venv/bin/python tests/benchmarks/bench_lora.py --rank 8 --steps 2 --batch 4

SmolLM2-135M-Instruct comes from the offline conversion (launch/models/bootstrap.py, ``source:
smollm2``). Each configuration runs in a fresh subprocess through the learner's own code: the
loader (learner/policy.py ``load_policy``, which wraps the model for LoRA), AdamW over the
parameters that require gradients (as the DeepSpeed rank builds it), ``microbatch_loss`` +
backward + step on ``--batch`` rows of ``--length`` tokens (a quarter prompt), then the export
the weight sync sends (learner/lora.py ``sync_units``: the merged weights under the base names).
One process, plain torch AdamW (no DeepSpeed, one rank): the differences between the two are
the adapters'. The synced bytes are the same for both (the merged model is sent); sending the
adapter alone instead would need the engines to apply it (vLLM's LoRA support): measured in
tests/benchmarks/bench_lora_vllm.py, and why this project does not (docs/real-models.md).
Printed: per configuration, then LoRA / full ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.benchmarks.child import run_child  # noqa: E402 - after the path


def make_batch(args, vocab: int):
    from learner.batch import build_batch
    from rollout.types import Group, Sample

    g = torch.Generator().manual_seed(1)
    prompt_len = args.length // 4
    groups = []
    for _ in range(args.batch):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        response = torch.randint(0, vocab, (args.length - prompt_len,), generator=g).tolist()
        groups.append(Group("", prompt, [Sample(response, [-10.0] * len(response), "", "stop", 0)]))
    return build_batch(groups, torch.linspace(-1.0, 1.0, args.batch), pad_id=0)


def child(args) -> None:
    from learner.config import LearnerConfig, LoraConfig
    from learner.lora import sync_units
    from learner.loss import LossConfig
    from learner.policy import load_policy
    from learner.update import microbatch_loss

    torch.set_num_threads(args.threads or torch.get_num_threads())
    cfg = LearnerConfig(lora=LoraConfig(rank=args.rank, alpha=2.0 * max(args.rank, 1)))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = load_policy(args.model, cfg, "float32")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    batch = make_batch(args, model.config.vocab_size)
    seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out, _ = microbatch_loss(
            model, batch, LossConfig(), temperature=1.0, total_tokens=float(batch.num_tokens),
            total_seqs=float(len(batch)), logits=cfg.logits, chunk_tokens=cfg.logits_chunk_tokens,
        )  # fmt: skip
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    with torch.no_grad():
        sent = sum(u.value().numel() * u.value().element_size() for u in sync_units(model))
    export_s = time.perf_counter() - t0
    state = optimizer.state_dict()["state"].values()
    print(json.dumps({
        "trainable": sum(p.numel() for p in trainable),
        "total": sum(p.numel() for p in model.parameters()),
        "optimizer_mib": sum(t.numel() * t.element_size() for s in state for t in s.values()
                             if torch.is_tensor(t)) / 2**20,
        "seconds": min(seconds),
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "base_mib": rss0 / 1024,
        "sync_mib": sent / 2**20,
        "export_s": export_s,
    }))  # fmt: skip


def run(args, model_dir: str, rank: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", model_dir, "--rank", str(rank)]
    for name in ("batch", "length", "steps", "threads"):
        cmd += [f"--{name}", str(getattr(args, name))]
    return run_child(cmd, f"rank {rank}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    from launch.models.bootstrap import ModelConfig, ensure_model

    folder = ensure_model(ModelConfig(source="smollm2"), log=lambda *_: None)
    print(f"SmolLM2-135M, {args.batch} x {args.length} tokens, best of {args.steps} updates")
    rows = {}
    for name, rank in (("full", 0), (f"lora r={args.rank}", args.rank)):
        rows[name] = r = run(args, folder, rank)
        print(
            f"{name:10s} trainable {r['trainable'] / 1e6:7.2f}M of {r['total'] / 1e6:.1f}M  "
            f"optimizer {r['optimizer_mib']:7.1f} MiB  update {r['seconds']:6.2f} s  peak RSS "
            f"{r['peak_mib']:6.0f} MiB  sync {r['sync_mib']:6.1f} MiB/step "
            f"(export {r['export_s']:.2f} s)"
        )
    full, lora = rows["full"], rows[f"lora r={args.rank}"]
    print(
        f"lora / full: trainable {lora['trainable'] / full['trainable']:.4f}, optimizer state "
        f"{lora['optimizer_mib'] / full['optimizer_mib']:.4f}, update time "
        f"{lora['seconds'] / full['seconds']:.2f}, peak RSS "
        f"{lora['peak_mib'] / full['peak_mib']:.2f}, synced bytes "
        f"{lora['sync_mib'] / full['sync_mib']:.2f}"
    )


if __name__ == "__main__":
    main()
