"""Every ``rollout`` key that is handed down a layer arrives: the config -> ``vllm.LLM``'s
keywords and the engine's environment (rollout/vllm_engine.py ``llm_kwargs``, ``engine_env``),
a call's SamplingConfig -> ``vllm.SamplingParams``' keywords (``sampling_kwargs``) and the
transformers engine's decode, ``rollout.sampling`` -> a call's SamplingConfig, and the weight
sync's keys -> its transport (rollout/weight_sync.py). Each key is set to a value other than its
default and must change what the lower layer gets. No engine or actor is started, except the
transformers engine on the shipped tiny model (a second)."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

from rollout.config import RolloutConfig
from rollout.hf_engine import HFEngine
from rollout.seeding import prompt_seed
from rollout.types import SamplingConfig, SamplingSettings, Share
from rollout.vllm_engine import engine_env, llm_kwargs, sampling_kwargs
from rollout.weight_sync import CollectiveTransport, ObjectStoreTransport, WeightSync
from rollout.worker import make_engine
from tests.helpers import env_restored


def kwargs_of(device: str = "cpu", sleep_mode: bool = False, **settings) -> dict:
    cfg = RolloutConfig(**settings)
    return llm_kwargs(cfg, "/models/m", dtype="bfloat16", sleep_mode=sleep_mode, device=device)


# (rollout key and a non-default value, the device, what LLM(...) must get for it)
LLM_CASES = [
    ({"max_model_len": 96}, "cpu", {"max_model_len": 96}),
    ({"tensor_parallel_size": 2}, "cuda", {"tensor_parallel_size": 2}),
    ({"enforce_eager": False}, "cpu", {"enforce_eager": False}),
    ({"max_num_batched_tokens": 1024}, "cpu", {"max_num_batched_tokens": 1024}),  # null: unset
    ({"max_num_seqs": 64}, "cpu", {"max_num_seqs": 64}),
    ({"enable_prefix_caching": False}, "cpu", {"enable_prefix_caching": False}),  # null: unset
    ({"gpu_memory_utilization": 0.8}, "cuda", {"gpu_memory_utilization": 0.8}),  # GPUs only
]


@pytest.mark.parametrize(
    "settings, device, want", LLM_CASES, ids=[next(iter(c[0])) for c in LLM_CASES]
)
def test_each_engine_key_reaches_the_llm(settings, device, want):
    got, default = kwargs_of(device, **settings), kwargs_of(device)
    for name, value in want.items():
        assert got[name] == value
        assert default.get(name) != value, f"{name}: the default gives the same"


def test_the_llm_gets_the_model_its_dtype_and_the_engine_on_its_device():
    got = kwargs_of()
    assert (got["model"], got["dtype"]) == ("/models/m", "bfloat16")
    assert got["enable_chunked_prefill"] is False and "gpu_memory_utilization" not in got
    # tensor parallel on GPUs: vLLM's own multiprocessing executor; sleep mode as asked
    gpu = kwargs_of("cuda", sleep_mode=True, tensor_parallel_size=2)
    assert gpu["distributed_executor_backend"] == "mp" and gpu["enable_sleep_mode"] is True
    assert kwargs_of("cuda")["enable_sleep_mode"] is False
    assert "distributed_executor_backend" not in kwargs_of("cuda")


def test_max_num_seqs_is_capped_by_the_token_budget():
    # a scheduler step holds at most one token per sequence: min(512, 32)
    assert kwargs_of(max_num_batched_tokens=32)["max_num_seqs"] == 32
    assert "max_num_seqs" not in kwargs_of(max_num_seqs=None)  # null: vLLM's default


def test_kv_cache_gib_reaches_vllm_cpus_environment():
    assert engine_env(RolloutConfig(kv_cache_gib=3))["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert engine_env(RolloutConfig())["VLLM_CPU_KVCACHE_SPACE"] == "1"


# ---- one call's sampling parameters ----------------------------------------------------------

CALL = SamplingConfig(n=4, temperature=0.7, max_new_tokens=5, seed=11)


@pytest.mark.parametrize(
    "field, value, keyword",
    [("temperature", 0.7, "temperature"), ("max_new_tokens", 5, "max_tokens")],
)
def test_each_sampling_setting_reaches_vllms_request(field, value, keyword):
    share = Share(0, 0, 4)
    got = sampling_kwargs(CALL, share, 11)
    unset = dataclasses.replace(CALL, **{field: getattr(SamplingConfig(), field)})
    default = sampling_kwargs(unset, share, 11)
    assert got[keyword] == value != default[keyword]


def test_a_share_is_one_request_of_its_samples_seeded_with_its_first_stream():
    # samples 1 and 2 of the prompt at position 2: n = 2, stream prompt_seed(11, 2) + 1
    got = sampling_kwargs(CALL, Share(2, 1, 3), 11)
    assert got["n"] == 2 and got["seed"] == prompt_seed(11, 2) + 1
    assert got["top_p"] == 1.0 and got["logprobs"] == 0  # the whole tempered distribution


def test_rollout_sampling_settings_reach_the_call():
    settings = SamplingSettings(temperature=0.7, max_new_tokens=5)
    assert settings.params(n=4, seed=11) == CALL
    assert SamplingSettings().params(n=4, seed=11) != CALL


# ---- the transformers engine: the config's dtype, a call's settings --------------------------


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    return make_engine(RolloutConfig(engine="hf"), tiny_model_dir, "float32")


def test_make_engine_builds_the_configured_engine_in_the_dtype(tiny_model_dir):
    engine = make_engine(RolloutConfig(engine="hf"), tiny_model_dir, "bfloat16")
    assert isinstance(engine, HFEngine) and engine.model.dtype == torch.bfloat16


def test_the_hf_engine_samples_as_the_call_says(hf_engine):
    prompts = ["1+2=", "3+4="]
    call = SamplingConfig(n=3, temperature=0.5, max_new_tokens=1, seed=5)
    (a, b) = hf_engine.generate(prompts, call)
    assert [len(g.samples) for g in (a, b)] == [3, 3]  # n
    assert all(len(s.response_ids) == 1 for g in (a, b) for s in g.samples)  # max_new_tokens
    # the log-probs are those of softmax(logits / 0.5): what the model scores at T = 0.5
    for group in (a, b):
        for s in group.samples:
            scored = hf_engine.score(group.prompt_ids, s.response_ids, temperature=0.5)
            hot = hf_engine.score(group.prompt_ids, s.response_ids, temperature=1.0)
            assert s.logprobs == pytest.approx(scored, abs=1e-5)
            assert s.logprobs != pytest.approx(hot, abs=1e-5)
    # the seed: the same one draws the same samples, another one other samples
    again = hf_engine.generate(prompts, SamplingConfig(3, 0.5, 4, seed=5))
    other = hf_engine.generate(prompts, SamplingConfig(3, 0.5, 4, seed=6))
    first = hf_engine.generate(prompts, SamplingConfig(3, 0.5, 4, seed=5))
    ids = lambda groups: [s.response_ids for g in groups for s in g.samples]  # noqa: E731
    assert ids(again) == ids(first) != ids(other)


# ---- the weight sync --------------------------------------------------------------------------


def sync_for(**settings) -> WeightSync:
    # WeightSync reads only the rollout group's config when it is built
    return WeightSync(SimpleNamespace(cfg=RolloutConfig(**settings)), learner=None)


def test_weight_sync_keys_reach_the_transport():
    default = sync_for().transport
    assert isinstance(default, ObjectStoreTransport) and default.bucket_bytes == 256 * 2**20
    assert sync_for(weight_sync_bucket_mb=1.5).transport.bucket_bytes == 3 * 2**19  # 1.5 MiB
    collective = sync_for(weight_sync="collective").transport
    assert isinstance(collective, CollectiveTransport)
    assert (collective.backend, collective.bucket_bytes) == ("gloo", 256 * 2**20)  # auto, CPU
    bucket = sync_for(weight_sync="collective", weight_sync_bucket_mb=1.5).transport.bucket_bytes
    assert bucket == 3 * 2**19
    assert (
        sync_for(weight_sync="collective", weight_sync_backend="nccl").transport.backend == "nccl"
    )
    # auto: NCCL when the engines hold GPUs
    assert sync_for(weight_sync="collective", num_gpus_per_worker=1.0).transport.backend == "nccl"


# ---- the worker's own settings (rollout/worker.py RolloutWorker, no Ray, a stand-in engine) --


@pytest.fixture
def worker_for(monkeypatch):
    """Builds the actor body with ``make_engine`` recorded and the reserved device chosen; the
    environment (tests/helpers.py ``env_restored``), torch's thread count and dynamo's switch
    it sets are restored after (monkeypatch cannot read dynamo's config module's
    attributes)."""
    from torch._dynamo import config as dynamo_config

    import rollout.worker as worker_module

    keys = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING")
    threads, disabled = torch.get_num_threads(), dynamo_config.disable
    dynamo_config.disable = False
    made = []

    def build(cfg, device="cpu", **kwargs):
        monkeypatch.setattr("comm.devices.reserved_device", lambda gpus: device)
        monkeypatch.setattr(worker_module, "make_engine", lambda *a: made.append(a) or "engine")
        return worker_module.RolloutWorker(cfg, "/models/m", "bfloat16", **kwargs), made[-1]

    with env_restored(*keys):
        for key in keys:
            os.environ.pop(key, None)
        yield build
    torch.set_num_threads(threads)
    dynamo_config.disable = disabled


def test_the_worker_builds_its_engine_as_configured(worker_for):
    cfg = RolloutConfig(engine="hf")
    worker, args = worker_for(cfg, sleep_mode=True)
    assert args == (cfg, "/models/m", "bfloat16", True, "cpu") and worker.engine == "engine"
    assert worker_for(cfg, device="cuda")[1][-2:] == (False, "cuda")  # the reserved device


def test_num_cpus_per_worker_sets_torch_threads_unless_the_driver_says(worker_for):
    # 3 cores a worker: 3 torch threads (the default, 1 core: 1); a driver's count wins
    assert worker_for(RolloutConfig(num_cpus_per_worker=3))[0].threads == 3
    assert worker_for(RolloutConfig())[0].threads == 1
    assert worker_for(RolloutConfig(num_cpus_per_worker=3), threads=2)[0].threads == 2


def test_the_cores_a_cpu_engine_binds_to(worker_for):
    worker_for(RolloutConfig())
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # none given: vLLM's own choice
    worker_for(RolloutConfig(), cpus=[0, 1])
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"


def test_a_cpu_engine_runs_in_the_actors_process_a_gpu_one_in_its_own(worker_for):
    worker_for(RolloutConfig(), device="cuda")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    worker_for(RolloutConfig())
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_enforce_eager_turns_torch_compile_off_in_a_cpu_worker(worker_for):
    from torch._dynamo import config as dynamo_config

    worker_for(RolloutConfig(enforce_eager=False))
    assert dynamo_config.disable is False
    worker_for(RolloutConfig(enforce_eager=True), device="cuda")  # GPUs: vLLM's own choice
    assert dynamo_config.disable is False
    worker_for(RolloutConfig(enforce_eager=True))
    assert dynamo_config.disable is True
