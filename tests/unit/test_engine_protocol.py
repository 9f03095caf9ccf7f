"""Both engines implement rollout/engine.py ``Engine``: every method, with its parameters in
the same order (checked on the classes; no engine is started)."""

from __future__ import annotations

import inspect

import pytest

from rollout.engine import Engine
from rollout.hf_engine import HFEngine
from rollout.vllm_engine import VLLMEngine

METHODS = [n for n, v in vars(Engine).items() if inspect.isfunction(v) and not n.startswith("_")]


def test_the_protocol_lists_what_the_worker_calls():
    assert sorted(METHODS) == sorted(
        ["generate", "generate_stream", "score", "load_weights", "open_weight_group",
         "receive_weights", "weights_checksum", "sleep", "wake_up"]
    )  # fmt: skip


@pytest.mark.parametrize("engine", [HFEngine, VLLMEngine])
@pytest.mark.parametrize("method", METHODS)
def test_each_engine_implements_the_protocol(engine, method):
    want = list(inspect.signature(getattr(Engine, method)).parameters)
    got = list(inspect.signature(getattr(engine, method)).parameters)
    assert got[: len(want)] == want, (engine.__name__, method, got)
    assert all(
        p.default is not inspect.Parameter.empty
        for p in list(inspect.signature(getattr(engine, method)).parameters.values())[len(want) :]
    )  # extra parameters have defaults (the hf engine's score temperature)
