"""GPU check, Part A: the learner and the hf engine on a bare PyTorch GPU machine (torch,
transformers, numpy; no Ray, vLLM or Hydra), within 4 minutes on one H200, nothing downloaded:

    python tests/gpu/pack_wheels.py                      # here (tests/gpu/run_gpu_checks.sh
    # installs them there and runs Parts A and C in one go), then there:
    python tests/gpu/check_learner_gpu.py --out learner_gpu.json

    python tests/gpu/check_learner_gpu.py --device cpu   # the same items at small sizes (CI)

The learner runs in process (one ``LearnerRank``, world size 1, DeepSpeed over NCCL, or gloo on
the CPU) on a model built from a config with random weights: Qwen2.5-0.5B's geometry
(vocabulary 151,936, 24 layers, hidden 896) on the GPU, 2 small layers and 8,192 tokens on
the CPU. Each group of items runs in a child process (one DeepSpeed engine per
process); one PASS/FAIL line per item, the figures in the JSON file; exit 1 if any fails, or
if the global timeout (``--timeout``) ends the run.

Items:

- ``zero2`` / ``zero3``: one bf16 step of 64 x 1,224 tokens (GPU) with chunked logits, gradient
  checkpointing and sdpa: step time, peak memory, the self-checks' outcomes (chunked logits
  kept; the shared-prefix path off, as checkpointing rules it out). Then the poisoned batch (a
  NaN advantage): the step is skipped and every weight is bit-identical.
- ``zero3 export``: ``export_weights`` equals the parameters gathered bucket by bucket.
- ``zero0``: one bf16 step at ZeRO-0 (its own finiteness flag, all-reduced on the device).
- ``sync group``: the weight-sync group's constructor (NCCL on the GPU) and one header and one
  bucket broadcast at world size 1; ``sync reopen``: that group closed (its ``abort()``) and
  its next generation opened on the same store and used, as after an engine's restart.
- ``engine_seeded``: the hf engine loads the learner's weights after its steps (policy version
  2), then seeded sampling on the device (same seed, same tokens; another seed, other tokens).
- The log-prob items (tests/gpu/logprob_checks.py): ``bf16_vs_fp32`` (zero2's child: each
  side's bf16 error against an fp32 copy of the weights, with the bf16 gap, its floor and the
  engine on the learner's micro-batches as figures), ``engine_gap_fp32`` and
  ``stale_weights_control`` (a child of their own: both sides in fp32, TF32 off).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SIZES = {
    # Qwen2.5-0.5B: vocabulary 151,936, 24 layers, hidden 896, 14 heads (2 KV), MLP 4,864, tied
    # embeddings
    "cuda": dict(vocab=151_936, layers=24, hidden=896, heads=14, kv_heads=2, mlp=4864, rows=64,
                 prompt=200, response=1024, micro=8, timeout=240, lr=1e-5),
    "cpu": dict(vocab=8192, layers=2, hidden=64, heads=2, kv_heads=1, mlp=128, rows=4,
                prompt=24, response=72, micro=2, timeout=600, lr=1e-3),
}  # fmt: skip
# lr: one update must move the learner's log-probs of the samples it trained on far past the
# fp32 limit (logprob_checks.py's stale control). Adam moves every weight by ~lr, so the move
# grows with the weights' count: in fp32 on this CPU, one update at 1e-5 moved the 0.5B
# geometry's by 0.44 nats and the 0.6M CPU model's by 0.0011; 100x the rate for ~800x fewer.


def build_model(out: Path, size: dict) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from launch.models.tiny_model import build_tokenizer

    tok = build_tokenizer(vocab_size=size["vocab"])
    config = Qwen2Config(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["mlp"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1e6,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


# ---- in a child process -------------------------------------------------------------------


def start_rank(model: str, device: str, zero_stage: int, micro: int, dtype: str = "bfloat16"):
    from learner.config import LearnerConfig
    from learner.loss import LossConfig
    from learner.rank import LearnerRank

    cfg = LearnerConfig(
        num_ranks=1,
        zero_stage=zero_stage,
        lr=SIZES[device]["lr"],
        micro_batch_size=micro,
        mini_batch_size=None,
        logits="chunked",
        gradient_checkpointing=True,
        attn_implementation="sdpa",
        dtype=dtype,
        num_gpus_per_rank=1.0 if device == "cuda" else 0.0,
        timeout_s=120,
    )
    rank = LearnerRank(0, 1, cfg, LossConfig(), model, dtype=dtype)
    rank.init(*rank.address("127.0.0.1"))
    return rank, cfg


def step(rank, cfg, batch, learner_version=None) -> dict:
    from learner.update import split_for_ranks, summarize_ranks

    per_rank, totals, plans = split_for_ranks(batch, cfg, None)
    out = rank.train(per_rank[0], totals, plans[0], 1, learner_version)
    return summarize_ranks([out], cfg)


def synthetic_batch(size: dict, seed: int = 0):
    """``rows`` sequences of ``prompt`` + ``response`` random tokens; engine log-probs of a
    uniform policy, -log V (the random model's are within ~0.1 of it: importance ratios near
    1, so the clipped objective passes gradients)."""
    from learner.batch import build_batch
    from rollout.types import Group, Sample

    g = torch.Generator().manual_seed(seed)
    groups, per_group = [], min(8, size["rows"])
    for _ in range(size["rows"] // per_group):
        prompt = torch.randint(4, size["vocab"], (size["prompt"],), generator=g).tolist()
        samples = [
            Sample(torch.randint(4, size["vocab"], (size["response"],), generator=g).tolist(),
                   [-math.log(size["vocab"])] * size["response"], "", "length", 0)
            for _ in range(per_group)
        ]  # fmt: skip
        groups.append(Group("", prompt, samples))
    advantages = torch.randn(size["rows"], generator=g)
    return build_batch(groups, advantages, pad_id=0)


def peak_memory_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def weights(rank) -> dict[str, torch.Tensor]:
    return rank.export_weights()


def item_step(model: str, device: str, size: dict, zero_stage: int) -> dict:
    """One bf16 step and the poisoned batch at ``zero_stage``; at ZeRO-3 also the export."""
    rank, cfg = start_rank(model, device, zero_stage, size["micro"])
    # chunked logits pass their check; the shared-prefix path is off (checkpointing rules it out)
    checks = {"logits": rank.logits, "shared_prefix": rank.shared_prefix}
    out: dict = {"self_checks": {"ok": checks == {"logits": "chunked", "shared_prefix": False}}}
    out["self_checks"] |= checks
    batch = synthetic_batch(size).to("cpu")
    step(rank, cfg, synthetic_batch(size, seed=1))  # warm-up (kernels, allocator)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    m = step(rank, cfg, batch)
    if device == "cuda":
        torch.cuda.synchronize()
    out["step"] = {
        "ok": m["actor/skipped_steps"] == 0 and 0 < m["actor/grad_norm"] < float("inf"),
        "seconds": time.perf_counter() - t0,
        "tokens": int(batch.attention_mask.sum()),
        "peak_memory_gib": peak_memory_gib(device),
        "grad_norm": m["actor/grad_norm"],
        "pg_loss": m["actor/pg_loss"],
    }
    before = weights(rank)
    poisoned = synthetic_batch(size, seed=2)
    poisoned.advantages[1] = float("nan")
    m = step(rank, cfg, poisoned)
    after = weights(rank)
    same = all(torch.equal(before[k], after[k]) for k in before)
    out["poisoned"] = {"ok": m["actor/skipped_steps"] == 1 and same, "skipped": m[
        "actor/skipped_steps"], "weights_unchanged": same}  # fmt: skip
    if zero_stage == 3:
        from comm.weight_protocol import TensorSpec, plan_buckets

        specs = [TensorSpec(n, d, s) for n, d, s in rank.weight_specs()]
        gathered = {}
        for named in rank.export.gathered_buckets(plan_buckets(specs, 64 * 2**20)):
            gathered |= {n: p.data.detach().to("cpu", copy=True) for n, p in named}
        equal = list(gathered) == [n for n, _ in rank.engine.module.named_parameters()] and all(
            torch.equal(gathered[n], after[n]) for n in gathered
        )
        out["export"] = {"ok": equal, "tensors": len(gathered)}
    if zero_stage == 2:
        from tests.gpu.logprob_checks import item_bf16

        out |= item_sync_group(rank, device)
        out |= item_bf16(model, device, rank, cfg, lambda b, v: step(rank, cfg, b, v))
    return out


def item_sync_group(rank, device: str) -> dict:
    """``sync group``: the group opened at world size 1, a header and buckets sent. ``sync
    reopen``: the group closed (``abort()``: NCCL frees its communicator) and its next
    generation opened on the same store, as a rebuilt group after an engine restart
    (rollout/weight_sync.py), then the same send and a close."""
    import dataclasses

    from comm.rendezvous import listen_socket
    from comm.weight_protocol import SyncGroup, TensorSpec, open_sender, sync_store

    backend = "nccl" if device == "cuda" else "gloo"
    listener = listen_socket("127.0.0.1")
    group = SyncGroup("127.0.0.1", listener.getsockname()[1], 1, backend, 60.0, 2**20)
    specs = [TensorSpec(n, d, s) for n, d, s in rank.weight_specs()][:3]
    store = sync_store(group, listener)
    params = dict(rank.engine.module.named_parameters())
    want = sum(s.nbytes for s in specs)

    def send(sender, version: int) -> int:
        sender.send_header(version)
        return sum(sender.send_bucket([params[s.name].data]) for s in specs)

    sender = open_sender(group, specs, store)
    sent = send(sender, 1)
    t0 = time.perf_counter()
    sender.close()
    closed = sender.group is None
    again = open_sender(dataclasses.replace(group, generation=1), specs, store)
    resent = send(again, 2)
    again.close()
    return {
        "sync_group": {"ok": sent == want, "backend": backend, "bytes": sent},
        "sync_reopen": {"ok": closed and resent == want and again.group is None,
                        "backend": backend, "bytes": resent, "generation": 1,
                        "seconds": time.perf_counter() - t0},
    }  # fmt: skip


def child(item: str, model: str, device: str) -> dict:
    size = SIZES[device]
    if item == "fp32":  # the log-prob defect test: both sides in fp32 (logprob_checks.py)
        from tests.gpu.logprob_checks import fp32_exact, item_fp32

        fp32_exact()
        rank, cfg = start_rank(model, device, 2, size["micro"], dtype="float32")
        return item_fp32(model, device, rank, cfg, lambda b, v: step(rank, cfg, b, v))
    stage = {"zero2": 2, "zero3": 3, "zero0": 0}[item]
    return item_step(model, device, size, stage)


# ---- the parent ---------------------------------------------------------------------------


def run_child(item: str, model: str, device: str, deadline: float) -> dict:
    left = deadline - time.monotonic()
    if left <= 5:
        return {item: {"ok": False, "error": "global timeout reached before it started"}}
    cmd = [sys.executable, __file__, "--child", item, "--model", model, "--device", device]
    # the repository first, then what the caller had (run_gpu_checks.sh: the installed wheels)
    paths = (str(ROOT), os.environ.get("PYTHONPATH"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
    except subprocess.TimeoutExpired:
        return {item: {"ok": False, "error": f"global timeout ({left:.0f} s left) reached"}}
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        return {item: {"ok": False, "error": (out.stderr or out.stdout)[-1500:]}}
    return json.loads(lines[-1].removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="the figures (JSON)")
    ap.add_argument("--timeout", type=float, default=None, help="global, seconds")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.model, args.device)), flush=True)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("FAIL setup: --device cuda but CUDA is not available", flush=True)
        return 1
    t0 = time.monotonic()
    deadline = t0 + (args.timeout or SIZES[args.device]["timeout"])
    figures: dict = {"device": args.device, "torch": torch.__version__}
    if args.device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", SIZES[args.device])
        figures["build_seconds"] = time.monotonic() - t0
        for item in ("zero2", "fp32", "zero3", "zero0"):
            for name, result in run_child(item, model, args.device, deadline).items():
                figures[f"{item} {name}"] = result
                ok = "PASS" if result.get("ok") else "FAIL"
                shown = {k: v for k, v in result.items() if k != "ok"}
                print(f"{ok} {item} {name}: {json.dumps(shown)[:600]}", flush=True)
    figures["seconds"] = time.monotonic() - t0
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    failed = [k for k, v in figures.items() if isinstance(v, dict) and "ok" in v and not v["ok"]]
    print(f"{'FAIL' if failed else 'PASS'} all: {figures['seconds']:.0f} s, failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
