"""Benchmark: peak memory and time of one learner step at a real vocabulary, full vs chunked
logits (learner.logits), with gradient checkpointing off and on.

    make bench      # or: .venv/bin/python tests/benchmarks/bench_learner_memory.py
    .venv/bin/python tests/benchmarks/bench_learner_memory.py --batch 2 --length 256  # quick

The model is Qwen2-style, built from a config (no download): vocabulary 151,936 (Qwen2.5's),
tied embeddings, hidden 128, 2 layers, saved once and loaded by each run through the learner's
own loader (learner/policy.py ``load_policy``), so the logits dominate: at 4 x 1,024 tokens the
full fp32 logits are 4 x 1024 x 151936 x 4 B = 2.3 GiB per copy. One step = the rank's
``microbatch_loss`` (forward, log-probs and entropy at T = 0.7, PPO loss) + backward + AdamW
step on one micro-batch of ``--batch`` rows of ``--length`` tokens (the first quarter prompt,
the rest response). Each configuration runs in a fresh subprocess, which reports its own peak
RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) before and after the step, and the step's
seconds (the last of ``--steps`` steps; every step counts for the peak). Printed: loss (must be
equal across configurations: same weights, same batch, the first step), seconds, peak RSS, the
step's increase of the peak, and chunked / full ratios. Exit status 1 if the losses differ.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.benchmarks.child import run_child  # noqa: E402 - after the path

VOCAB = 151936


def build_model(folder: str, args) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(args.length, 128),
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)


def make_batch(args):
    from learner.batch import build_batch
    from rollout.types import Group, Sample

    g = torch.Generator().manual_seed(1)
    prompt_len = args.length // 4
    groups = []
    for _ in range(args.batch):
        prompt = torch.randint(0, args.vocab, (prompt_len,), generator=g).tolist()
        response = torch.randint(0, args.vocab, (args.length - prompt_len,), generator=g).tolist()
        logprobs = [-11.9] * len(response)  # ~log(1 / 151936): an untrained model's
        groups.append(Group("", prompt, [Sample(response, logprobs, "", "stop", 0)]))
    advantages = torch.linspace(-1.0, 1.0, args.batch)
    return build_batch(groups, advantages, pad_id=0)


def child(args) -> None:
    from learner.config import LearnerConfig
    from learner.loss import LossConfig
    from learner.policy import load_policy
    from learner.update import microbatch_loss

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = LearnerConfig(gradient_checkpointing=args.ckpt, logits=args.logits)
    model = load_policy(args.model, cfg, "float32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = make_batch(args)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    losses, seconds = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out, _ = microbatch_loss(
            model,
            batch,
            LossConfig(entropy_coef=0.01),
            temperature=0.7,
            total_tokens=float(batch.num_tokens),
            total_seqs=float(len(batch)),
            logits=cfg.logits,
            chunk_tokens=cfg.logits_chunk_tokens,
        )
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - t0)
        losses.append(out.loss.item())
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "loss": losses[0],
                "seconds": seconds[-1],
                "peak_mib": rss_after / 1024,  # ru_maxrss is in KiB on Linux
                "step_mib": (rss_after - rss_before) / 1024,
            }
        )
    )


def run(args, model_dir: str, logits: str, ckpt: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", model_dir, "--logits", logits]
    for name in ("batch", "length", "vocab", "hidden", "layers", "steps", "threads"):
        cmd += [f"--{name}", str(getattr(args, name))]
    if ckpt:
        cmd.append("--ckpt")
    return run_child(cmd, f"{logits} ckpt={ckpt}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--logits", default="chunked", help=argparse.SUPPRESS)
    p.add_argument("--ckpt", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    full_gib = args.batch * args.length * args.vocab * 4 / 2**30
    print(
        f"Qwen2-style, vocabulary {args.vocab}, hidden {args.hidden}, {args.layers} layers; "
        f"{args.batch} x {args.length} tokens (fp32 logits {full_gib:.2f} GiB per copy)"
    )
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        build_model(folder, args)
        for ckpt in (False, True):
            for logits in ("full", "chunked"):
                rows[logits, ckpt] = r = run(args, folder, logits, ckpt)
                print(
                    f"logits={logits:8s} grad_ckpt={ckpt!s:5s} loss {r['loss']:.6f}  "
                    f"{r['seconds']:7.2f} s  peak RSS {r['peak_mib']:8.0f} MiB  "
                    f"step +{r['step_mib']:7.0f} MiB"
                )
    for ckpt in (False, True):
        full, chunked = rows["full", ckpt], rows["chunked", ckpt]
        print(
            f"grad_ckpt={ckpt!s:5s} chunked/full: peak RSS "
            f"{chunked['peak_mib'] / full['peak_mib']:.2f}, step increase "
            f"{chunked['step_mib'] / max(full['step_mib'], 1e-9):.2f}, seconds "
            f"{chunked['seconds'] / full['seconds']:.2f}"
        )
    losses = [r["loss"] for r in rows.values()]
    gap = max(losses) - min(losses)
    print(f"loss spread over the four runs: {gap:.3g}")
    if gap > 1e-5 * max(1.0, abs(losses[0])):
        sys.exit("LOSS MISMATCH: the configurations do not compute the same loss")


if __name__ == "__main__":
    main()
