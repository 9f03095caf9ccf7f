"""bench_vs_trl's precision switch: our side's config in bf16 is the workload's, in bf16."""

import pytest

from tests.benchmarks import bench_vs_trl


@pytest.fixture(scope="module")
def bench():
    return bench_vs_trl


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_each_workload_composes_to_what_it_checks(bench, name):
    """The benchmark refuses a config that is not its workload: the registered (fp32) one must
    pass (learner.old_logprobs defaults to auto, which the check does not take for bypass)."""
    workload = bench.WORKLOADS[name]
    assert bench.in_dtype(workload, "float32") is workload
    cfg = bench.compose(list(workload.overrides))
    want = {**bench.COMMON_WANT, **workload.want}
    assert {p: bench.lookup(cfg, p) for p in want} == want


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_bf16_composes_to_the_same_workload_in_bf16(bench, name):
    """Every check the benchmark makes holds for the bf16 config, which differs from the fp32
    one in the model's dtype only: old log-probs stay the engine's (TRL computes none)."""
    fp32 = bench.compose(list(bench.WORKLOADS[name].overrides))
    workload = bench.in_dtype(bench.WORKLOADS[name], "bfloat16")
    cfg = bench.compose(list(workload.overrides))
    want = {**bench.COMMON_WANT, **workload.want}
    assert want["model.dtype"] == "bfloat16"
    assert {p: bench.lookup(cfg, p) for p in want} == want
    assert cfg.model.dtype == "bfloat16" and cfg.learner.old_logprobs == "bypass"
    cfg.model.dtype = fp32.model.dtype
    assert cfg == fp32
