"""Benchmark: the learner's achieved FLOP rate against this CPU's matmul rate (issue 46 item 5).

    .venv/bin/python tests/benchmarks/bench_learner_flops.py [--model smollm2|tiny]
                                          [--dtype float32|bfloat16] [--profile] [overrides]

The learner is built as a run builds it (the config of ``experiment=smollm2_cpu``, or the
default for ``tiny``: its ranks, ZeRO stage, micro-batches, logits path and shared prefix, one
torch thread per rank of the machine's cores as launch/cluster.py plans them) and takes updates
on one step's batch shaped like that run's: the task's first train prompts rendered as the
engines see them, ``n_samples`` responses each of seeded random tokens, uniformly 1/4 to all of
``max_new_tokens`` long. One warm-up update, then the median of 3.

FLOPs are counted as model FLOPs (the MFU convention: what the update needs, not what it
recomputes): forward and backward = 3 x the forward's 2 x (matmul weights) per token, where

- the decoder's weights (attention and MLP projections) run on every token through the decoder
  (``perf/learner_decoder_tokens``: each shared prompt once when it is computed once),
- the output projection (vocabulary x hidden) on the scored response tokens only
  (``perf/learner_tokens``: the chunked logits path computes no others),
- attention's scores and weighted sum add 2 x 2 x hidden x (context length) per token and layer,
  counted over each sequence's causal context.

Gradient checkpointing's second forward is not counted (it shows as a lower share).

``--profile``: afterwards, one rank's share of the update (its rows, as micro-batches of
``learner.micro_batch_size``) runs again in this process on the rank's threads, plain PyTorch
(the model, our loss, backward, an AdamW step; no DeepSpeed, no Ray), under ``torch.profiler``;
it prints that update's seconds and the self time by kind of op (matmuls; softmax and
log-softmax; norms; element-wise and the rest; the optimizer): where the time that is not
matmul goes, and how much of the learner's update is DeepSpeed's and the ranks' own.

The matmul rate is measured here on each rank's threads: GEMMs at the learner's own shapes (a
micro-batch's tokens x hidden against the MLP's and attention's weights) and a 2048-cube; the
best, times the ranks (each rank runs in its own process on its own cores), is the limit. Last
line:
``learner <model> <dtype>: X GFLOP/s of Y GFLOP/s matmul (Z%)``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def matmul_rate(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """GFLOP/s of ``[m, k] @ [k, n]`` in ``dtype`` on this thread (repeated for ``seconds``)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm-up: oneDNN's first call picks its kernel
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def model_flops(model_path: str, metrics: dict, batch) -> dict:
    """Model FLOPs of one update (module docstring) from the model's config and the update's
    token counts."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    h, layers, inter = c.hidden_size, c.num_hidden_layers, c.intermediate_size
    head = getattr(c, "head_dim", None) or h // c.num_attention_heads
    kv = c.num_key_value_heads * head
    per_layer = h * (c.num_attention_heads * head) * 2 + h * kv * 2 + 3 * h * inter
    decoder = layers * per_layer
    output = c.vocab_size * h
    lengths = batch.attention_mask.sum(1).double()
    attention = float((lengths * (lengths + 1) / 2).sum()) * 4 * h * layers  # causal contexts
    forward = (
        2 * decoder * metrics["perf/learner_decoder_tokens"]
        + 2 * output * metrics["perf/learner_tokens"]
        + attention
    )
    return {"forward": forward, "update": 3 * forward, "decoder_weights": decoder}


def step_batch(cfg, model_path: str, seed: int = 0):
    """One step's batch: the task's first ``prompts_per_step`` train prompts, as the engines see
    them, each with ``n_samples`` random responses (module docstring)."""
    from transformers import AutoTokenizer

    from launch.prompts import render
    from learner.batch import build_batch
    from reward.tasks import make_task
    from rollout.types import Group, Sample

    tok = AutoTokenizer.from_pretrained(model_path)
    problems = make_task(cfg.task).train[: cfg.trainer.prompts_per_step]
    rendered = render(
        problems, tok, chat_template=cfg.task.chat_template, system_prompt=cfg.task.system_prompt
    )
    rng, top = random.Random(seed), cfg.rollout.sampling.max_new_tokens
    groups = []
    for p in rendered:
        ids = tok(p.prompt)["input_ids"]
        samples = []
        for _ in range(cfg.rollout.n_samples):
            response = [rng.randrange(4, len(tok)) for _ in range(rng.randint(top // 4, top))]
            samples.append(Sample(response, [-1.0] * len(response), "", "length", 0))
        groups.append(Group(p.prompt, ids, samples))
    n = sum(len(g.samples) for g in groups)
    return build_batch(groups, torch.randn(n, generator=torch.Generator().manual_seed(seed)),
                       pad_id=tok.pad_token_id or 0)  # fmt: skip


KINDS = {  # profiler op names -> kind (the first pattern found in the name wins)
    "matmul": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "_scaled_dot_product"),
    "softmax": ("softmax", "logsumexp"),
    "norm": ("rms_norm", "layer_norm", "norm", "rsqrt", "pow", "mean"),
    "optimizer": ("adam", "_foreach", "lerp", "addcdiv", "addcmul"),
}


def kind_of(op: str) -> str:
    """The kind of a profiler op name (:data:`KINDS`), else ``other``.

    >>> kind_of("aten::addmm"), kind_of("aten::_log_softmax"), kind_of("aten::mul")
    ('matmul', 'softmax', 'other')
    """
    name = op.split("::")[-1].lower()
    for kind, patterns in KINDS.items():
        if any(name == p or name.startswith(p + "_") or name.startswith("_" + p) or
               name.endswith(p) for p in patterns):  # fmt: skip
            return kind
    return "other"


def profile_update(cfg, path: str, batch, dtype: str, threads: int, ranks: int) -> None:
    """One rank's share of the update in this process, plain PyTorch, under torch.profiler
    (module docstring): prints its seconds and the self CPU time by kind of op."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from learner.update import microbatch_loss

    torch.set_num_threads(threads)
    # the weights in the run's dtype, as DeepSpeed's bf16 mode holds them (its fp32 master copy
    # and optimizer apart: AdamW here steps the bf16 weights)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = list(range(0, len(batch), ranks))  # this rank's rows: one in ``ranks``
    size = cfg.learner.micro_batch_size or len(rows)
    micro = [batch.select(rows[i : i + size]) for i in range(0, len(rows), size)]
    tokens, seqs = float(batch.response_mask.sum()), float(len(batch))

    def update():
        for mb in micro:
            out, _ = microbatch_loss(
                model, mb, cfg.algorithm.loss,
                temperature=cfg.rollout.sampling.temperature, total_tokens=tokens,
                total_seqs=seqs, logits=cfg.learner.logits,
                shared_prefix=cfg.learner.shared_prefix, pack=cfg.learner.pack,
            )  # fmt: skip
            out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()  # warm-up
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update()
    seconds = time.perf_counter() - t0
    by_kind: dict[str, float] = {}
    for event in prof.key_averages():
        kind = kind_of(event.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_cpu_time_total / 1e6
    total = sum(by_kind.values())
    print(f"profile: one rank's share ({len(rows)} rows, {len(micro)} micro-batches) in plain "
          f"PyTorch, {threads} threads: {seconds:.2f} s under the profiler")  # fmt: skip
    for kind, sec in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<10} {sec:7.2f} s self CPU ({100 * sec / total:.0f}%)")
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    for event in top:
        print(f"    {event.key:<40} {event.self_cpu_time_total / 1e6:7.2f} s  x{event.count}")


def main() -> None:
    import ray

    from launch.models.bootstrap import ensure_model
    from learner.group import LearnerGroup
    from tests.helpers import load

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--profile", action="store_true", help="then profile one rank's share")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. learner.pack=off")
    args = parser.parse_args()
    overrides = ["experiment=smollm2_cpu"] if args.model == "smollm2" else []
    cfg = load(*overrides, f"model.dtype={args.dtype}", *args.overrides)
    path = ensure_model(cfg.model, log=lambda *_: None)
    batch = step_batch(cfg, path)
    ranks, cores = cfg.learner.num_ranks, len(os.sched_getaffinity(0))
    threads = max(1, cores // ranks)
    print(f"model {args.model} ({path}), {args.dtype}, {ranks} ranks x {threads} threads, "
          f"{len(batch)} rows, {int(batch.attention_mask.sum())} tokens")  # fmt: skip

    ray.init(address="local", num_cpus=max(cores, ranks), include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    group = LearnerGroup(
        cfg.learner, cfg.algorithm.loss, path, dtype=args.dtype,
        temperature=cfg.rollout.sampling.temperature, threads=[threads] * ranks,
    )  # fmt: skip
    mbt = group.micro_batch_tokens or int(batch.attention_mask.sum()) // ranks
    try:
        group.train_on(batch)  # warm-up
        runs = [group.train_on(batch) for _ in range(3)]
    finally:
        group.shutdown()
        ray.shutdown()
    seconds = statistics.median(m["timing_s/update"] for m in runs)
    flops = model_flops(path, runs[0], batch)
    achieved = flops["update"] / seconds / 1e9

    torch.set_num_threads(threads)
    dtype = getattr(torch, args.dtype)
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    rows = min(4096, mbt)  # a micro-batch's tokens: the rows of its projections' GEMMs
    shapes = {
        "mlp": (rows, c.hidden_size, c.intermediate_size),
        "attention": (rows, c.hidden_size, c.hidden_size),
        "cube 2048": (2048, 2048, 2048),
    }
    rates = {name: matmul_rate(*shape, dtype) for name, shape in shapes.items()}
    for name, rate in rates.items():
        print(f"matmul {name} {shapes[name]}: {rate:.1f} GFLOP/s per rank ({threads} threads)")
    best = max(rates.values()) * ranks
    print(f"update {seconds:.3f} s (median of 3), model FLOPs {flops['update'] / 1e9:.1f} G "
          f"(decoder tokens {runs[0]['perf/learner_decoder_tokens']:.0f}, response tokens "
          f"{runs[0]['perf/learner_tokens']:.0f})")  # fmt: skip
    print(f"learner {args.model} {args.dtype}: {achieved:.1f} GFLOP/s of {best:.1f} GFLOP/s "
          f"matmul ({100 * achieved / best:.0f}%)")  # fmt: skip
    if args.profile:
        profile_update(cfg, path, batch, args.dtype, threads, ranks)


if __name__ == "__main__":
    main()
