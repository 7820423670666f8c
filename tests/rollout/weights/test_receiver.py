"""The weight receiver chain, without an engine: push → ``ReplicaHandle`` → ``ReplicaActor`` → ``VLLMEngine`` → the
vLLM worker extension. Every hop names the next by a string somewhere (a Ray method, a ``collective_rpc`` name, a
dotted class path), so these tests check that the names and signatures line up."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.replica import ReplicaActor, ReplicaHandle, ReplicaSpec
from lightning_hybrid_rollout.rollout.vllm import driver, weight_updates
from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
from lightning_hybrid_rollout.rollout.vllm.driver import WORKER_EXTENSION_CLS, VLLMEngine
from lightning_hybrid_rollout.rollout.vllm.worker_extension import LHRWorkerExtension
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from tests.rollout.fakes import FakeWeightReceiver


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in inspect.getmembers(protocol, inspect.iscoroutinefunction)}


def _without_ray_tracing(sig: inspect.Signature) -> inspect.Signature:
    """``ray.remote(ReplicaActor)`` adds a keyword-only ``_ray_trace_ctx`` to the class's methods in place."""
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "_ray_trace_ctx"])


def test_the_protocol_lists_the_push_methods() -> None:
    assert set(_methods(WeightReceiver)) == {
        "attach_node_staging",
        "begin_weight_update",
        "load_weight_from_node_staging",
        "load_weight_bucket",
        "stage_weight_bucket",
        "load_weight_from_staging",
        "receive_weights",  # every transport without staging files (collective, cuda_ipc): one generic entry
        "abort_weight_update",
        "finish_weight_update",
    }


@pytest.mark.parametrize("cls", [ReplicaHandle, ReplicaActor, VLLMEngine], ids=lambda c: c.__name__)
def test_handle_actor_and_engine_have_every_receiver_method_with_its_signature(cls: type) -> None:
    for name, sig in _methods(WeightReceiver).items():
        method = getattr(cls, name, None)
        assert method is not None and inspect.iscoroutinefunction(method), f"{cls.__name__}.{name}"
        got = _without_ray_tracing(inspect.signature(method))
        assert got == sig, f"{cls.__name__}.{name}{got} != {sig}"


def test_the_fake_implements_the_protocol() -> None:
    fake = FakeWeightReceiver("f")
    assert isinstance(fake, WeightReceiver)
    for name, sig in _methods(WeightReceiver).items():
        assert inspect.signature(getattr(FakeWeightReceiver, name)) == sig, name


def test_the_handle_has_no_string_call_left() -> None:
    assert not hasattr(ReplicaHandle, "call")


class _Actor:
    """A Ray actor handle stand-in: ``actor.<method>.remote(*args)`` records the call and returns an awaitable."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        calls = self.calls

        class _Method:
            @staticmethod
            def remote(*args: Any) -> asyncio.Future[str]:
                calls.append((name, args))
                done = asyncio.get_running_loop().create_future()
                done.set_result(f"{name}-result")
                return done

        return _Method


def test_every_handle_method_calls_the_actor_method_of_the_same_name(run_async) -> None:
    actor = _Actor()
    handle = ReplicaHandle(actor, ReplicaSpec("r0", "standalone", VLLMEngineConfig(model="unused")))
    assert isinstance(handle, WeightReceiver)

    async def go() -> None:
        for name, sig in _methods(WeightReceiver).items():
            args = [f"<{p}>" for p in list(sig.parameters)[1:]]
            got = await getattr(handle, name)(*args)
            assert actor.calls[-1] == (name, tuple(args))
            assert got == (None if sig.return_annotation == "None" else f"{name}-result")

    run_async(go())


def test_the_worker_extension_path_and_every_rpc_name_resolve() -> None:
    module, _, cls = WORKER_EXTENSION_CLS.rpartition(".")
    assert getattr(importlib.import_module(module), cls) is LHRWorkerExtension
    names = set()
    for mod in (driver, weight_updates):  # every collective_rpc name the engine driver sends to its worker
        names |= set(re.findall(r'"(lhr_[a-z_]+)"', Path(mod.__file__).read_text()))
    assert {"lhr_init", "lhr_begin_update", "lhr_finish_update", "lhr_load_spans"} <= names
    missing = sorted(n for n in names if not callable(getattr(LHRWorkerExtension, n, None)))
    assert not missing, missing
