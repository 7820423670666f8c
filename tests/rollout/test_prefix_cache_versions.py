"""Version-true prefix caches on real vLLM replicas: after a weight update no request decodes on KV the old weights
computed, in keep mode (a request frozen across the update) and abort mode, standalone and hybrid; the prefix cache
still serves requests within a version."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.weights.push import push_weights_async

pytestmark = pytest.mark.slow

#: A shared prefix (a chat template's system prompt, a group's prompt) of two whole 128-token KV blocks (vLLM's CPU
#: block size) and a bit more.
SHARED = [1] + [5 + (i * 37) % 100 for i in range(300)]
BEFORE, AFTER = [*SHARED, 10, 11], [*SHARED, 12, 13, 14]  # served before the update / admitted after it
FROZEN_PROMPT, FROZEN_TOKENS = [1, 7, 14, 8, 18], 200
GREEDY = SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True)
#: Weight noise strong enough that greedy decoding depends on which weights computed the prefix's KV (at 0.5 the tiny
#: model repeats one token whatever the KV).
STRENGTH = 2.0


def _scenario(replicas: list[Any], model_dir: Any, hf_reference: Any, run_async: Any, keep: bool) -> dict[str, Any]:
    """Old weights serve ``BEFORE``; a long request runs while the new weights arrive (keep: frozen across the push;
    abort: the hybrid path, parked and woken around it); then ``AFTER`` (twice) under the new weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    state_old = hf_reference.perturbed_state(model, seed=61, scale=STRENGTH)
    ref = {"old_frozen": hf_reference.greedy(model, FROZEN_PROMPT, FROZEN_TOKENS)}
    state_new = hf_reference.perturbed_state(model, seed=62, scale=STRENGTH)
    ref["new_after"] = hf_reference.greedy(model, AFTER, GREEDY.max_tokens)
    replica = replicas[0] if keep else replicas[1]

    async def go() -> dict[str, Any]:
        v = (await replica.health())["weight_version"] + 1
        await push_weights_async(state_old, [replica], version=v)
        out: dict[str, Any] = {"v": v}
        out["before"] = await replica.generate("pc-before", BEFORE, GREEDY)
        out["before_hit"] = await replica.generate("pc-before-hit", [*SHARED, 20], GREEDY)
        spec = SamplingSpec(max_tokens=FROZEN_TOKENS, temperature=0.0, ignore_eos=True)
        frozen = asyncio.ensure_future(replica.generate("pc-frozen", FROZEN_PROMPT, spec))
        while (await replica.health())["tokens_in_flight"] < 8:
            await asyncio.sleep(0.005)
        if keep:
            await push_weights_async(state_new, [replica], version=v + 1, keep=True)
        else:  # a hybrid replica's deactivation and activation: park (aborts), wake, then the new weights
            await replica.sleep()
            await replica.wake_up()
            await push_weights_async(state_new, [replica], version=v + 1)
        out["after"] = await replica.generate("pc-after", AFTER, GREEDY)
        out["frozen"] = await frozen
        out["after_again"] = await replica.generate("pc-after-again", AFTER, GREEDY)
        return out

    out = run_async(go())
    if keep:  # the frozen request from its prompt and tokens so far, from scratch, under the new weights
        ((split, _),) = out["frozen"].info["version_splits"]
        ref["new_frozen"] = hf_reference.greedy(
            model, FROZEN_PROMPT + list(out["frozen"].token_ids[:split]), FROZEN_TOKENS - split
        )
    return {"out": out, "ref": ref}


@pytest.fixture(scope="module")
def keep_run(vllm_replicas, tiny_model_dir, hf_reference, run_async) -> dict[str, Any]:
    return _scenario(vllm_replicas, tiny_model_dir, hf_reference, run_async, keep=True)


@pytest.fixture(scope="module")
def abort_run(vllm_replicas, tiny_model_dir, hf_reference, run_async) -> dict[str, Any]:
    return _scenario(vllm_replicas, tiny_model_dir, hf_reference, run_async, keep=False)


@pytest.mark.parametrize("mode", ["keep", "abort"])
def test_a_request_admitted_after_an_update_decodes_what_the_new_weights_give_from_scratch(
    mode: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(f"{mode}_run")
    out, ref = run["out"], run["ref"]
    assert out["before_hit"].cached_prompt_tokens >= 256  # the shared prefix was cached under the old weights
    after = out["after"]
    assert after.weight_version == out["v"] + 1
    assert list(after.token_ids) == ref["new_after"]
    assert after.cached_prompt_tokens == 0  # none of the old weights' KV served it
    again = out["after_again"]  # within the new version the prefix cache serves again, with the same result
    assert again.cached_prompt_tokens >= 256 and list(again.token_ids) == ref["new_after"]


def test_a_frozen_request_resumes_with_the_new_weights_own_tokens_none_lost_or_repeated(keep_run) -> None:
    out, ref = keep_run["out"], keep_run["ref"]
    frozen = out["frozen"]
    assert frozen.finish_reason == "length" and len(frozen.token_ids) == FROZEN_TOKENS
    ((split, version),) = frozen.info["version_splits"]
    assert version == out["v"] + 1 and 8 <= split < FROZEN_TOKENS
    tokens = list(frozen.token_ids)
    assert tokens[:split] == ref["old_frozen"][:split]  # the old weights' own continuation up to the update
    assert tokens[split:] == ref["new_frozen"]  # then the new weights', as from scratch: no token lost or repeated
    assert tokens[split:] != ref["old_frozen"][split:]  # (the weights differ enough to tell)
