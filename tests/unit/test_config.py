"""Hydra config: presets compose and validate; bad keys and values are rejected with their path."""

from __future__ import annotations

import subprocess

import pytest
from hydra.errors import ConfigCompositionException

from launch.config import TrainConfig
from launch.validation import ConfigError
from tests.helpers import ROOT, load, run_cli


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "avspo"])
def test_every_algorithm_preset_composes(name):
    cfg = load(f"algorithm={name}")
    assert cfg.algorithm.name == name and cfg.algorithm.estimator == name
    # no preset switches the trigger off: only AVSPO has one (learner/estimators.py)
    assert cfg.algorithm.trigger.policy == "adaptive"


def test_default_is_avspo_fast_differing_from_the_paper_only_in_the_trigger():
    """docs/ARCHITECTURE.md section 8: the embedded default may move the trigger faster; nothing
    else."""
    from dataclasses import asdict

    fast, paper = asdict(load().algorithm), asdict(load("algorithm=avspo").algorithm)
    assert (fast["name"], fast["trigger"]["tau_adapt_0"], fast["trigger"]["eta"]) == (
        "avspo_fast",
        0.3,
        0.05,
    )
    differ = {k for k in fast if fast[k] != paper[k]}
    assert differ == {"name", "trigger"}
    assert {k for k in fast["trigger"] if fast["trigger"][k] != paper["trigger"][k]} == {
        "tau_adapt_0",
        "eta",
    }


def test_avspo_preset_has_the_paper_values():
    a = load("algorithm=avspo").algorithm
    assert (a.estimator, a.avspo.alpha, a.avspo.strategy, a.avspo.r_anchor) == (
        "avspo",
        0.5,
        "stratified",
        0.1,
    )
    assert (a.trigger.tau_adapt_0, a.trigger.eta, a.trigger.tau_min, a.trigger.tau_max) == (
        0.5,
        0.01,
        0.1,
        0.9,
    )
    assert (a.eps, a.tau, a.unbiased_std, a.loss.clip_low, a.loss.clip_high) == (
        1e-6,
        1e-6,
        True,
        0.2,
        0.2,
    )


def test_overrides_apply():
    cfg = load("algorithm.avspo.k=4", "algorithm.avspo.strategy=opposite", "trainer.total_steps=7")
    assert (cfg.algorithm.avspo.k, cfg.algorithm.avspo.strategy, cfg.trainer.total_steps) == (
        4,
        "opposite",
        7,
    )


@pytest.mark.parametrize(
    "override",
    # rollout.sampling.n/seed: the group size and the seeds are rollout.n_samples and
    # trainer.seed; no key exists only to be rejected
    ["algorithm.avspo.alhpa=0.3", "rollout.sampling.n=4", "rollout.sampling.seed=1"],
)
def test_unknown_key_names_its_path(override):
    with pytest.raises(ConfigCompositionException) as err:
        load(override)
    assert override.split("=")[0] in str(err.value)


def test_wrong_type_names_its_path():
    with pytest.raises(ConfigCompositionException) as err:
        load("algorithm.avspo.alpha=abc")
    assert "algorithm.avspo.alpha" in str(err.value.__cause__) + str(err.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.avspo.alpha=-1", "algorithm.avspo.alpha: must be > 0.0"),
        ("algorithm.avspo.strategy=foo", "algorithm.avspo.strategy: 'foo' is not one of"),
        ("algorithm.estimator=ppo", "algorithm.estimator: 'ppo' is not one of"),
        ("algorithm.loss.aggregation=sum", "algorithm.loss.aggregation: 'sum' is not one of"),
        ("algorithm.trigger.policy=sometimes", "algorithm.trigger.policy"),
        ("algorithm.trigger.tau_adapt_0=0.95", "algorithm.trigger: tau_adapt_0=0.95 outside"),
        ("algorithm.avspo.k=0", "algorithm.avspo.k: must be >= 1"),
        ("trainer.total_steps=0", "trainer.total_steps: must be >= 1"),
        ("acr.ema_beta=1.0", "acr.ema_beta: must be < 1.0"),
        ("learner.zero_stage=4", "learner.zero_stage: must be <= 3"),
        ("rollout.sampling.temperature=0", "rollout.sampling.temperature: training samples"),
        ("rollout.weight_sync=nccl", "rollout.weight_sync: 'nccl' is not one of"),
        ("rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size: 2 needs GPUs"),
        ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization: must be <= 1.0"),
        ("rollout.max_num_seqs=0", "rollout.max_num_seqs: must be >= 1"),
        ("verifier.step_budget_s=900", "verifier.step_budget_s: 900 must be below verifier.call"),
        ("learner.old_logprobs=engine", "learner.old_logprobs: 'engine' is not one of"),
        ("learner.tis_cap=0.5", "learner.tis_cap: must be >= 1.0"),
    ],
)
def test_bad_values_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(override)


def test_overlong_buffer_must_fit_in_the_response_length():
    # L_max = max_new_tokens = 8: a buffer of 8 would punish every response from length 0
    with pytest.raises(ConfigError, match="algorithm.overlong.buffer_len: 8 must be below"):
        load("algorithm.overlong.shaping=true", "algorithm.overlong.buffer_len=8")
    assert load("algorithm.overlong.shaping=true").algorithm.overlong.buffer_len == 4


@pytest.mark.parametrize(
    "name, differs",
    [
        # each preset is a Hydra defaults-list difference from a base; these are all it changes
        # relative to the schema's defaults (the paper's AVSPO)
        ("avspo", {}),
        ("avspo_fast", {"name": "avspo_fast", "trigger.tau_adapt_0": 0.3, "trigger.eta": 0.05}),
        ("grpo", {"name": "grpo", "estimator": "grpo"}),
        (
            "dr_grpo",
            {
                "name": "dr_grpo",
                "estimator": "dr_grpo",
                "loss.aggregation": "seq-mean-token-sum-norm",
            },
        ),
        ("rloo", {"name": "rloo", "estimator": "rloo"}),
        (
            "dapo",
            {
                "name": "dapo",
                "estimator": "grpo",
                "loss.clip_high": 0.28,
                "dynamic_sampling.enabled": True,
            },
        ),
        (
            "avspo_release",
            {
                "name": "avspo_release",
                "estimator": "avspo_release",
                "eps": 1e-4,
            },
        ),
    ],
)
def test_presets_are_pinned_differences_from_the_schema(name, differs):
    from dataclasses import asdict

    from learner.config import AlgorithmConfig

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out |= flat(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
        return out

    got, base = flat(asdict(load(f"algorithm={name}").algorithm)), flat(asdict(AlgorithmConfig()))
    assert {k: v for k, v in got.items() if v != base[k]} == differs
    text = (ROOT / "conf" / "algorithm" / f"{name}.yaml").read_text()
    if name in ("avspo_fast", "dapo", "dr_grpo", "rloo"):  # built on a base preset
        assert "defaults:" in text


def run_train(*overrides: str, run_dir, ray_tmp=None) -> subprocess.CompletedProcess:
    """A plain ``launch.train`` (no ``--validate``) in this process, up to its first check."""
    env = {} if ray_tmp is None else {"RAY_TMPDIR": str(ray_tmp)}  # where Ray would leave files
    return run_cli("train", *overrides, f"hydra.run.dir={run_dir}", env=env)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "algorithm.avspo.alpha=-1",
            "config error: algorithm.avspo.alpha: must be > 0.0, got -1.0",
        ),
        ("trainer.resume=/nonexistent/ckpt", "config error: trainer.resume: resume path"),
        ("learner.zero_stage=4", "config error: learner.zero_stage: must be <= 3"),
    ],
)
def test_cli_rejects_bad_values_before_any_actor_starts(tmp_path, override, message):
    run_dir, ray_tmp = tmp_path / "run", tmp_path / "ray"
    bad = run_train(override, f"trainer.run_dir={run_dir}", run_dir=tmp_path, ray_tmp=ray_tmp)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    # the exit code the README and the configuration page state
    assert "exit 2" in (ROOT / "README.md").read_text()
    assert "exit code 2" in (ROOT / "docs" / "configuration.md").read_text()
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith(message), last
    assert "Traceback" not in bad.stderr
    # no Ray was started (so no actor): no Ray session files, no Ray start-up line
    assert not ray_tmp.exists() and "Started a local Ray instance" not in bad.stdout + bad.stderr


@pytest.mark.slow
def test_cli_rejects_an_unknown_key_before_anything_starts(tmp_path):
    ray_tmp = tmp_path / "ray"
    unknown = run_train("algorithm.avspo.alhpa=1", run_dir=tmp_path, ray_tmp=ray_tmp)
    assert unknown.returncode != 0 and "algorithm.avspo.alhpa" in unknown.stderr
    assert not ray_tmp.exists() and "Started a local Ray instance" not in unknown.stderr


def test_dataclass_defaults_are_the_embedded_default_presets():
    """One source of truth: the schema's defaults equal conf/*/ presets of the default run, so
    code that builds a config without Hydra gets the same run as `python -m launch.train`."""
    from dataclasses import asdict

    from launch.models.bootstrap import ModelConfig
    from learner.config import AlgorithmConfig
    from learner.trigger import TriggerConfig
    from reward.tasks import TaskConfig
    from rollout.config import RolloutConfig

    cfg = load()
    fast = AlgorithmConfig(name="avspo_fast", trigger=TriggerConfig(tau_adapt_0=0.3, eta=0.05))
    expected = TrainConfig(algorithm=fast, rollout=RolloutConfig(max_model_len=64))
    assert asdict(cfg) == asdict(expected)
    assert asdict(load("algorithm=avspo").algorithm) == asdict(AlgorithmConfig())  # the paper
    assert asdict(cfg.model) == asdict(ModelConfig())
    assert asdict(cfg.task) == asdict(TaskConfig())
    assert asdict(cfg.rollout) == asdict(RolloutConfig(max_model_len=64))


def test_model_presets_carry_their_lengths_and_lr():
    tiny = load()
    assert (tiny.rollout.max_model_len, tiny.rollout.sampling.max_new_tokens) == (64, 8)
    assert tiny.learner.lr == 1e-4
    smol = load("model=smollm2-135m")
    assert smol.rollout.sampling.max_new_tokens > 8 and smol.learner.lr < 1e-4
    # a model preset wins over the learner preset chosen with it (model comes later)
    assert load("model=smollm2-135m", "learner=zero3").learner.lr == smol.learner.lr


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model=smollm2-135m", "rollout.sampling.max_new_tokens=8", "rollout.max_model_len=64"],
            "rollout.max_model_len: rollout.max_model_len=64, rollout.sampling.max_new_tokens=8 "
            "are the tiny model's limits",
        ),
        (["model=smollm2-135m", "learner.lr=1e-4"], "learner.lr: 0.0001 is the tiny model's"),
        (["rollout.sampling.max_new_tokens=64"], "rollout.sampling.max_new_tokens: 64 leaves no"),
    ],
)
def test_a_real_model_with_the_tiny_models_limits_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(*overrides)


def test_lora_adapters_may_train_at_the_tiny_models_rate():
    """LoRA's usual learning rates (~1e-4) are not the full-tuning mistake the check catches."""
    cfg = load("model=smollm2-135m", "learner.lr=1e-4", "learner.lora.rank=16")
    assert cfg.learner.lora.rank == 16 and cfg.learner.lr == 1e-4


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_paper_experiment_preset_has_the_papers_values(size):
    """docs/ARCHITECTURE.md section 10, value by value; it validates here (a GPU is needed only
    from the point where the run reserves its GPU placement groups)."""
    cfg = load(f"experiment=paper_qwen2.5_math_{size}")
    assert cfg.model.name == f"qwen2.5-math-{size}" and cfg.model.dtype == "bfloat16"
    assert (cfg.task.name, cfg.task.answer_extraction, cfg.task.chat_template) == (
        "math",
        "boxed",
        True,
    )
    assert cfg.task.system_prompt == (
        "Please reason step by step, and put your final answer within \\boxed{}."
    )
    assert (cfg.rollout.n_samples, cfg.rollout.sampling.temperature) == (8, 1.0)
    assert cfg.rollout.sampling.max_new_tokens == 1024
    ln = cfg.learner
    assert (ln.lr, ln.weight_decay, ln.betas, ln.grad_clip, ln.zero_stage) == (
        1e-6,
        0.01,
        [0.9, 0.999],
        1.0,
        3,
    )
    assert (ln.old_logprobs, ln.tis_cap) == ("recompute", 2.0)
    a = cfg.algorithm
    assert (a.name, a.loss.clip_low, a.loss.clip_high, a.loss.kl_coef) == ("avspo", 0.2, 0.2, 0)
    assert (a.trigger.tau_adapt_0, a.trigger.eta, a.avspo.alpha, a.tau) == (0.5, 0.01, 0.5, 1e-6)
    t = cfg.trainer
    assert (t.total_steps, t.eval_max_new_tokens, t.seed) == (500, 2048, 42)
    assert sorted(t.eval_tasks) == sorted(
        ["math500", "gsm8k", "minerva_math", "olympiadbench", "amc23", "aime24", "mmlu_pro"]
    )
    assert all(tc.test_file for tc in t.eval_tasks.values())
    assert t.eval_tasks["mmlu_pro"].verifier == "choice"
    assert cfg.cluster.name == "gpu_node" and cfg.rollout.num_gpus_per_worker == 1


@pytest.mark.parametrize("cluster", ["gpu_node_split", "multi_node"])
def test_gpu_cluster_presets_use_the_collective_transport_and_validate(cluster):
    cfg = load(f"cluster={cluster}")
    assert cfg.rollout.weight_sync == "collective"
    from rollout.weight_sync import weight_sync_backend

    assert weight_sync_backend(cfg.rollout) == "nccl"  # engines hold GPUs


@pytest.mark.parametrize(
    "overrides, message",
    [
        # learner and engine on one GPU: NCCL refuses two ranks of a group on one device
        (
            ["cluster=gpu_node_split", "learner.num_gpus_per_rank=0.5"],
            "rollout.weight_sync: collective over NCCL cannot run with "
            "learner.num_gpus_per_rank=0.5",
        ),
        (
            ["cluster=gpu_node_split", "rollout.num_gpus_per_worker=0.25"],
            "rollout.num_gpus_per_worker=0.25: a fractional GPU",
        ),
        (
            ["rollout.weight_sync=collective", "rollout.weight_sync_backend=nccl"],
            "rollout.weight_sync_backend: nccl needs GPUs on both sides",
        ),
    ],
)
def test_a_collective_sync_that_nccl_refuses_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(*overrides)


def test_the_colocated_gpu_node_shares_each_gpu_and_refuses_what_cannot_share():
    from launch.cluster import actor_resources, stage_bundles

    cfg = load("cluster=gpu_node")
    assert cfg.cluster.colocate and cfg.rollout.weight_sync == "object_store"
    # 8 bundles of one GPU; engine i and rank i take half of bundle i each
    assert stage_bundles(cfg)["colocated"] == [{"CPU": 8, "GPU": 1}] * 8
    assert actor_resources(cfg, "rollout") == actor_resources(cfg, "learner") == (4.0, 0.5)
    with pytest.raises(ConfigError, match="collective over NCCL cannot run with cluster.colocate"):
        load("cluster=gpu_node", "rollout.weight_sync=collective")
    with pytest.raises(ConfigError, match=r"cluster.colocate: an engine with rollout.tensor_"):
        load("cluster=gpu_node", "rollout.tensor_parallel_size=2", "rollout.num_gpus_per_worker=2")
    with pytest.raises(ConfigError, match="cluster.colocate: engine and learner rank share one"):
        load("cluster=gpu_node", "learner.num_gpus_per_rank=0")
    split = load("cluster=gpu_node_split")
    assert not split.cluster.colocate and (split.rollout.num_workers, split.learner.num_ranks) == (
        4,
        4,
    )


def test_tensor_parallel_beyond_the_workers_gpus_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size: 4 shards need 4 GPUs"):
        load("cluster=gpu_node", "rollout.tensor_parallel_size=4")
    cfg = load("cluster=multi_node")  # tensor parallel 2 on 2 GPUs per worker
    assert (cfg.rollout.tensor_parallel_size, cfg.rollout.num_gpus_per_worker) == (2, 2)
    assert cfg.rollout.enforce_eager is False and cfg.rollout.enable_prefix_caching is True


def test_a_collective_sync_over_gloo_validates_on_cpu():
    cfg = load("rollout.weight_sync=collective")
    assert cfg.rollout.weight_sync_backend == "auto" and cfg.rollout.num_gpus_per_worker == 0


@pytest.mark.parametrize(
    "args, rc, last_line",
    [
        (["--validate"], 0, "config ok"),
        (
            ["--validate", "algorithm=avspo", "algorithm.avspo.alpha=-1"],
            2,
            "config error: algorithm.avspo.alpha: must be > 0.0, got -1.0",
        ),
        # Hydra's --cfg job used to print this config and exit 0
        (["--cfg", "job", "algorithm.avspo.alpha=-1"], 2, "config error: algorithm.avspo.alpha"),
        (
            ["--validate", "task=gsm8k", "task.test_file=/nonexistent/g.jsonl"],
            2,
            "data error: /nonexistent/g.jsonl: no such file",
        ),
        (["--validate", "rollout.tensor_parallel_size=2"], 2, "config error: rollout.tensor_par"),
    ],
)
def test_validate_only_and_cfg_job_check_the_whole_config(args, rc, last_line):
    out = run_cli("train", *args)
    assert out.returncode == rc, out.stderr[-2000:]
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert any(line.startswith(last_line) for line in lines), lines[-3:]
    assert "Traceback" not in out.stderr


def test_cfg_job_prints_the_config_without_its_data_and_names_the_missing_files(tmp_path):
    """On a fresh machine (no data yet) ``--cfg job`` prints the paper experiment's config and
    exits 0, then says which data files are missing; ``--validate`` still refuses them."""
    env = {"AVSPO_DATA": str(tmp_path)}
    out = run_cli("train", "experiment=paper_qwen2.5_math_1.5b", "--cfg", "job", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Qwen/Qwen2.5-Math-1.5B" in out.stdout and "data error" not in out.stderr
    note = out.stderr.strip().splitlines()[-1]
    # the task's train + test files and the 7 eval tasks' test files, math500 in both: 8
    assert note.startswith("note: 8 data file(s) not found"), note
    assert f"{tmp_path}/math_train.jsonl" in note and f"{tmp_path}/aime24.jsonl" in note
    assert note.count("math500.jsonl") == 1
    out = run_cli("train", "experiment=paper_qwen2.5_math_1.5b", "--validate", env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(f"data error: {tmp_path}/math_train")


def test_one_step_async_needs_split_devices_and_the_importance_correction():
    cfg = load("trainer.async=one_step", "cluster.colocate=false", "learner.old_logprobs=recompute")
    assert cfg.trainer.async_mode == "one_step" and load().trainer.async_mode == "off"
    with pytest.raises(ConfigError, match="trainer.async: one_step overlaps .* cluster.colocate"):
        load("trainer.async=one_step", "learner.old_logprobs=recompute")
    with pytest.raises(ConfigError, match="trainer.async: .*learner.old_logprobs=recompute"):
        load("trainer.async=one_step", "cluster.colocate=false")
    with pytest.raises(ConfigError, match=r"trainer.async: 'two_step' is not one of"):
        load("trainer.async=two_step")
    with pytest.raises(ConfigError, match=r"learner.tis_cap: null leaves trainer.async"):
        load(
            "trainer.async=one_step",
            "cluster.colocate=false",
            "learner.old_logprobs=recompute",
            "learner.tis_cap=null",
        )
    split = load("cluster=gpu_node_split")
    assert split.trainer.async_mode == "one_step"


def test_learner_seed_follows_trainer_seed():
    # issue 24: learner.seed was a fixed 0, so every trainer.seed of the `random` virtual-value
    # ablation drew the same values. null (default) derives it from trainer.seed.
    from launch.config import learner_seed

    assert load().learner.seed is None
    seeds = {learner_seed(load(f"trainer.seed={s}")) for s in range(5)}
    assert len(seeds) == 5
    assert learner_seed(load("trainer.seed=3", "learner.seed=7")) == 7  # an explicit seed wins
    # derived by blake2b-64 of "3\x1flearner", top 62 bits (rollout/seeding.py derive_seed): a
    # fixed number on every machine and Python, not a hash() that changes per process
    import hashlib

    digest = hashlib.blake2b(b"3\x1flearner", digest_size=8).digest()
    assert learner_seed(load("trainer.seed=3")) == int.from_bytes(digest, "little") >> 2


# The defaults list's groups in the order Hydra applies them (conf/config.yaml).
GROUP_ORDER = [
    "algorithm",
    "task",
    "rollout",
    "learner",
    "model",
    "cluster",
    "logger",
    "experiment",
]


def _preset_leaves(path):
    """``{full key: value}`` of a preset file (its package: the group, or ``_global_``)."""
    from omegaconf import OmegaConf

    text = path.read_text()
    node = OmegaConf.load(path)
    for key in ("defaults", "hydra"):
        node.pop(key, None)
    group = path.parent.name
    prefix = "" if path.name == "config.yaml" or "@package _global_" in text else f"{group}."

    def walk(n, at):
        if OmegaConf.is_dict(n):
            for k in n:
                if OmegaConf.is_missing(n, k):  # ??? (model=pretrained's model.path)
                    yield f"{at}{k}", "???"
                    continue
                yield from walk(n[k], f"{at}{k}.")
        else:
            yield at[:-1], OmegaConf.to_container(n) if OmegaConf.is_config(n) else n

    return dict(walk(node, prefix))


def test_presets_state_only_differences_from_the_schema():
    """One source of truth: a preset (and conf/config.yaml) sets a key only to a value other
    than the schema's default, unless a group applied before it may set that key too (then
    restating the default undoes that group's choice: cluster=gpu_node's rollout.engine)."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(TrainConfig)
    files = [ROOT / "conf" / "config.yaml"] + [
        p for g in GROUP_ORDER for p in sorted((ROOT / "conf" / g).glob("*.yaml"))
    ]
    set_by = {g: set() for g in GROUP_ORDER}
    for g in GROUP_ORDER:
        for p in sorted((ROOT / "conf" / g).glob("*.yaml")):
            set_by[g] |= set(_preset_leaves(p))
    restated = []
    for path in files:
        group = path.parent.name
        earlier = GROUP_ORDER[: GROUP_ORDER.index(group)] if group in GROUP_ORDER else []
        overridable = set().union(*(set_by[g] for g in earlier)) if earlier else set()
        for key, value in _preset_leaves(path).items():
            if key.endswith(".name") or key == "name" or key in overridable:
                continue  # a preset names itself; or it undoes an earlier group's value
            default = OmegaConf.select(schema, key)
            default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
            if value == default:
                restated.append(f"{path.relative_to(ROOT)}: {key}")
    assert not restated, restated
