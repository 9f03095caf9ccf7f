"""The embedded default policy: a tiny Llama and its character tokenizer, built offline.

Built from nothing (no download): a character-level ``tokenizers`` tokenizer over the arithmetic
alphabet (digits, ``+ - * =``, space; ``<s>``, ``</s>``, ``<pad>``, ``<unk>``) saved as a
``PreTrainedTokenizerFast`` with a chat template, and a ``LlamaForCausalLM`` from a config (head
dim 32, which vLLM's CPU attention needs; tied embeddings; a vocabulary of 32, since per-token
log-probs over a large vocabulary are slow on CPU). A short supervised warm start on the
arithmetic task (loss on the answer tokens only) leaves it *partially* able to do the default
level, so that reward groups come out all-correct, all-incorrect and mixed: the regime ACR and
AVSPO are about. Everything is seeded; the result is saved with ``save_pretrained``.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from reward.arithmetic import sample_problems

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
ALPHABET = list("0123456789+-*= ")
VOCAB_SIZE = 32  # 19 used; rounded up


@dataclass
class TinyConfig:
    """Architecture and warm start of the tiny model (``conf/model/tiny.yaml``)."""

    hidden_size: int = field(default=256, metadata={"ge": 32})
    num_layers: int = field(default=4, metadata={"ge": 1})
    num_heads: int = field(default=8, metadata={"ge": 1})
    """hidden_size / num_heads must be >= 32 for vLLM's CPU attention."""
    intermediate_size: int = field(default=768, metadata={"ge": 1})
    max_positions: int = field(default=64, metadata={"ge": 16})
    sft_steps: int = field(default=500, metadata={"ge": 0})
    sft_batch_size: int = field(default=128, metadata={"ge": 1})
    sft_lr: float = field(default=2e-3, metadata={"gt": 0.0})
    sft_levels: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    """Arithmetic levels mixed (uniformly) in the warm start."""
    seed: int = 0

    def check(self) -> str | None:
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            return "hidden_size / num_heads must be an integer >= 32 (vLLM CPU attention)"
        return None


def build_tokenizer(vocab_size: int | None = None):
    """A character-level fast tokenizer with BOS added, EOS, pad and a plain chat template;
    ``vocab_size``: padded with ``<extra_i>`` tokens to that many (a model of a real vocabulary's
    size that samples any id, tests/gpu/check_learner_gpu.py)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIALS + ALPHABET
    tokens += [f"<extra_{i}>" for i in range((vocab_size or 0) - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def build_model(cfg: TinyConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def _batch(problems: list[tuple[str, int]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``<s>expr=value</s>`` ids [B, T] and labels (-100 except answer + EOS)."""
    rows, labels = [], []
    for expr, value in problems:
        prompt = tokenizer(expr + "=")["input_ids"]
        answer = tokenizer(str(value), add_special_tokens=False)["input_ids"]
        ids = prompt + answer + [tokenizer.eos_token_id]
        rows.append(ids)
        labels.append([-100] * len(prompt) + answer + [tokenizer.eos_token_id])
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, lab


def warm_start(model, tokenizer, cfg: TinyConfig, log=print) -> dict:
    """Supervised warm start on train-split arithmetic problems; returns timing and loss."""
    pools = {lv: sample_problems(lv, 20_000, split="train", seed=cfg.seed) for lv in cfg.sft_levels}
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.sft_lr, total_steps=max(cfg.sft_steps, 1), pct_start=0.1
    )
    model.train()
    t0, loss_value = time.perf_counter(), float("nan")
    for step in range(cfg.sft_steps):
        problems = [
            rng.choice(pools[rng.choice(cfg.sft_levels)]) for _ in range(cfg.sft_batch_size)
        ]
        ids, labels = _batch(problems, tokenizer)
        loss = model(
            input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id), labels=labels
        ).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = loss.item()
        if log and (step + 1) % max(1, cfg.sft_steps // 10) == 0:
            log(f"  warm start {step + 1}/{cfg.sft_steps}: loss {loss_value:.3f}")
    model.eval()
    return {"sft_seconds": time.perf_counter() - t0, "sft_final_loss": loss_value}


@torch.no_grad()
def sampled_accuracy(
    model, tokenizer, problems: list[tuple[str, int]], *, temperature: float = 1.0, seed: int = 0
) -> float:
    """pass@1 of one sample per problem (greedy when temperature is 0), transformers generate."""
    torch.manual_seed(seed)
    prompts = [expr + "=" for expr, _ in problems]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **enc,
        max_new_tokens=8,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(t.strip() == str(v) for t, (_, v) in zip(texts, problems, strict=True)) / len(
        problems
    )


# The weights ids (launch/models/bootstrap.py weights_id) of the two tiny models that ship with the
# project (launch/assets/): the default TinyConfig's and FAST_TINY's, built with the pins below on
# an AMD EPYC (AVX2 and AVX-512 both build these bytes). Every published result used the default's;
# the README names it. A run whose config is one of these loads the shipped files
# (launch/models/bootstrap.py); a rebuild (``model.rebuild=true``) on an Intel Xeon with AVX-512
# gives other ids under the same pins (docs/NOTES.md), and the run says its results are not
# comparable.
DEFAULT_WEIGHTS_ID = "4aa8613f"
FAST_TINY_WEIGHTS_ID = "5e521f73"

# A small tiny model for tests and debugging (shipped as launch/assets/tiny-fast): a model that
# emits EOS and mixes right and wrong answers on the easy levels, not a good one: 0.86M
# parameters, 150 warm-start steps (~50 s to rebuild).
FAST_TINY = TinyConfig(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    intermediate_size=384,
    sft_steps=150,
    sft_batch_size=128,
    sft_lr=3e-3,
    sft_levels=[0, 1, 2],
    seed=0,
)


def tiny_overrides(tiny: TinyConfig) -> list[str]:
    """Hydra overrides that select ``tiny`` instead of the default tiny model: its fields that
    differ, e.g. ``model.tiny.hidden_size=128`` for FAST_TINY (which a run then loads from
    launch/assets)."""
    default = TinyConfig()
    return [
        f"model.tiny.{f.name}={getattr(tiny, f.name)}"
        for f in fields(TinyConfig)
        if getattr(tiny, f.name) != getattr(default, f.name)
    ]


# The build's numerics, pinned so that the weights do not depend on the thread count or the
# vector ISA the CPU offers (made to give every x86-64 CPU with AVX2 the same weights; measured:
# it does within one CPU family, not between AMD AVX2 and Intel AVX-512, whose cause is not found):
# PyTorch's vectorised kernels (elementwise, reductions, the optimizer) are chosen per CPU
# (AVX-512 or AVX2) and differ in the last bits, which a warm start near a sharp transition
# amplifies into different models (docs/NOTES.md: three CPUs, three weights before the pins).
# A fixed thread count fixes how work is split (two: 1.7x faster than one here, the same weights
# as one in every build measured); MKL's conditional numerical reproducibility fixes its code
# path (COMPATIBLE,STRICT: the one path Intel documents as the same on Intel and non-Intel CPUs,
# 2.7x slower than MKL's AVX2 path on the tiny model), and oneDNN's ISA ceiling its own.
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "MKL_DYNAMIC": "FALSE",
}


def build_tiny_pinned(
    out_dir: Path,
    cfg: TinyConfig,
    log=print,
    *,
    env: dict | None = None,
    pins: dict | None = None,
) -> dict:
    """:func:`build_tiny` in a child process whose numerics are pinned (:data:`PINNED_ENV`,
    two threads, deterministic algorithms), so that the weights do not depend on the CPU and
    the pins do not touch the parent's (training) speed. ``env``: the child's environment
    before the pins (tests emulate other CPUs with it); ``pins``: instead of
    :data:`PINNED_ENV` (tests: what the pins remove). Returns the build facts."""
    import json
    import os
    import subprocess
    import sys
    from dataclasses import asdict

    child_env = {**(os.environ if env is None else env), **(PINNED_ENV if pins is None else pins)}
    child_env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "launch.models.tiny_model", str(out_dir), json.dumps(asdict(cfg))]
    proc = subprocess.Popen(
        cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, bar = [], _build_bar(cfg.sft_steps) if log else None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("  ") and log:
            (bar.write if bar else log)(line.rstrip("\n"))
            done = re.match(r"\s+warm start (\d+)/", line)
            if bar and done:
                bar.update(int(done.group(1)) - bar.n)
    if bar:
        bar.close()
    if proc.wait() != 0:
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"the tiny model's build failed (exit {proc.returncode}):\n{tail}")
    facts = json.loads((out_dir / FACTS).read_text())
    (out_dir / FACTS).unlink()
    return facts


FACTS = ".build_facts.json"


def _build_bar(total: int):
    """A progress bar over the warm-start steps on a terminal (None elsewhere: the lines say)."""
    import sys

    if not sys.stdout.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc="building the tiny model", dynamic_ncols=True)


def _child_main(argv: list[str]) -> None:
    """``python -m launch.models.tiny_model OUT_DIR CONFIG_JSON``: the pinned build's child."""
    import json
    import os

    out_dir, spec = Path(argv[0]), json.loads(argv[1])
    torch.use_deterministic_algorithms(True)  # threads: OMP_NUM_THREADS (2 when pinned)
    facts = build_tiny(out_dir, TinyConfig(**spec), log=lambda m: print(m, flush=True))
    facts["numerics"] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        **{k: os.environ[k] for k in PINNED_ENV if k in os.environ},
    }
    (out_dir / FACTS).write_text(json.dumps(facts))


def build_tiny(out_dir: Path, cfg: TinyConfig, log=print) -> dict:
    """Build, warm-start and save the tiny model into ``out_dir``; returns build facts."""
    tokenizer = build_tokenizer()
    model = build_model(cfg, tokenizer)
    facts = {"parameters": sum(p.numel() for p in model.parameters())}
    log(f"building the tiny model ({facts['parameters'] / 1e6:.2f}M parameters) in {out_dir}")
    facts.update(warm_start(model, tokenizer, cfg, log=log))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return facts


if __name__ == "__main__":
    import sys

    _child_main(sys.argv[1:])
