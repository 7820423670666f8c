"""The shared-prompt forward (``training/shared_prompt.py``): each distinct prompt runs once, and the log-probs and
gradients are the plain forward's; a model that cannot continue a prompt's cache falls back with one warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_hybrid_rollout.lightning.data import collate_samples
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.training.shared_prompt import prompt_buckets, shared_prompt_logprobs, shares_prompts
from tests.lightning.test_module import synthetic_samples, tiny_llama


def _batch(groups: int = 3, group_size: int = 4):
    # prompts of 3, 4, 5 tokens (one length bucket per group), responses of 1-4 tokens: right padding everywhere
    return collate_samples(synthetic_samples(7, groups=groups, group_size=group_size))


def _grads(module: GRPOModule, loss: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in module.parameters()]


def test_prompt_buckets_group_rows_by_their_prompt_tokens_not_by_group_id() -> None:
    samples = synthetic_samples(7, groups=3, group_size=4)
    samples[1].group_id = "another-id-same-prompt"  # same tokens: shared all the same
    batch = collate_samples(samples)
    buckets = prompt_buckets(batch)
    assert [b.prompt_len for b in buckets] == [3, 4, 5]
    assert [len(b.prompts) for b in buckets] == [1, 1, 1]
    assert [b.rows.tolist() for b in buckets] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert shares_prompts(buckets)
    lone = collate_samples(synthetic_samples(7, groups=3, group_size=1))  # one row per prompt: nothing to share
    assert not shares_prompts(prompt_buckets(lone))


def test_shared_prompt_logprobs_and_gradients_equal_the_plain_forward() -> None:
    module = GRPOModule(model=tiny_llama(), shared_prompt_forward=False)
    batch = _batch()
    mask = batch.response_mask[:, 1:]
    plain = module.token_logprobs(batch)
    shared = shared_prompt_logprobs(module.policy_model, batch)
    torch.testing.assert_close(shared[mask > 0], plain[mask > 0], atol=1e-5, rtol=1e-5)
    first = batch.response_mask.argmax(dim=1) - 1  # the column that predicts each row's first response token
    assert all(torch.all(shared[i, : int(first[i])] == 0) for i in range(len(batch)))  # prompt columns: 0
    g_plain = _grads(module, (plain * mask).sum())
    g_shared = _grads(module, (shared_prompt_logprobs(module.policy_model, batch) * mask).sum())
    for a, b in zip(g_plain, g_shared):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    # a temperature divides the logits the same way
    module.hparams.temperature = 0.7
    torch.testing.assert_close(
        shared_prompt_logprobs(module.policy_model, batch, temperature=0.7)[mask > 0],
        module.token_logprobs(batch)[mask > 0],
        atol=1e-5,
        rtol=1e-5,
    )


def test_grpo_module_runs_each_shared_prompt_once() -> None:
    """With ``shared_prompt_forward`` on the model sees each group's prompt once, not once per row."""
    module = GRPOModule(model=tiny_llama(), shared_prompt_forward=True)
    batch = _batch(groups=3, group_size=4)
    model = module.policy_model
    forward = model.forward
    seen: list[tuple[int, int]] = []

    def spy(*args, **kwargs):
        ids = kwargs["input_ids"]
        seen.append(tuple(ids.shape))
        return forward(*args, **kwargs)

    module.token_logprobs(batch)  # the first batch: the check against the plain forward
    assert module._shared_prompt_ok is True
    model.forward = spy
    try:
        logp = module.token_logprobs(batch)
    finally:
        del model.forward
    prompt_calls = [s for s in seen if s[0] == 1]
    assert sorted(prompt_calls) == [(1, 3), (1, 4), (1, 5)]  # one row per distinct prompt
    assert all(rows == 4 for rows, _ in seen if rows != 1)  # the responses: the group's 4 rows
    plain = GRPOModule(model=model, shared_prompt_forward=False).token_logprobs(batch)
    mask = batch.response_mask[:, 1:] > 0
    torch.testing.assert_close(logp[mask], plain[mask], atol=1e-5, rtol=1e-5)


def test_by_default_it_is_on_for_a_model_on_the_cpu_and_off_on_a_gpu() -> None:
    """``shared_prompt_forward=None`` reads the batch's device: on for the CPU (the CPU miniature's step takes
    0.59-0.64x the time), off on a GPU (a 135M model's step on an H200 took 1.2-2.0x); True and False decide."""
    batch = _batch()
    module = GRPOModule(model=tiny_llama())
    assert module._shared_prompt_wanted(batch) is True
    module.token_logprobs(batch)
    assert module._shared_prompt_ok is True
    on_gpu = type("OnGpu", (), {"input_ids": type("T", (), {"device": torch.device("cuda", 0)})()})()
    assert module._shared_prompt_wanted(on_gpu) is False
    assert GRPOModule(model=tiny_llama(), shared_prompt_forward=True)._shared_prompt_wanted(on_gpu) is True
    off = GRPOModule(model=tiny_llama(), shared_prompt_forward=False)
    assert off._shared_prompt_wanted(batch) is False
    off.token_logprobs(batch)
    assert off._shared_prompt_ok is None  # never checked: the plain forward serves


class _NoCache(torch.nn.Module):
    """A causal LM whose forward takes no cache (as a model under gradient checkpointing returns none)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, use_cache=False, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)


class _WrongPositions(torch.nn.Module):
    """Continues the cache but drops ``position_ids``: the responses sit at the wrong rotary positions."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, position_ids=None, **kwargs):
        if position_ids is not None:
            kwargs["position_ids"] = torch.zeros_like(position_ids)
        return self.inner(**kwargs)


@pytest.mark.parametrize(
    ("wrap", "says"), [(_NoCache, "cannot continue a prompt's cache"), (_WrongPositions, "differ from the plain")]
)
def test_a_model_that_cannot_share_falls_back_to_the_plain_forward_with_one_warning(wrap, says) -> None:
    inner = tiny_llama()
    module = GRPOModule(model=wrap(inner))
    batch = _batch()
    plain = GRPOModule(model=inner, shared_prompt_forward=False).token_logprobs(batch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = module.token_logprobs(batch)
        second = module.token_logprobs(batch)
    messages = [str(w.message) for w in caught if "shared_prompt_forward" in str(w.message)]
    assert len(messages) == 1 and says in messages[0], messages
    assert module._shared_prompt_ok is False
    mask = batch.response_mask[:, 1:] > 0
    torch.testing.assert_close(first[mask], plain[mask])
    torch.testing.assert_close(second[mask], plain[mask])


@pytest.mark.slow
def test_shared_prompt_forward_equals_the_plain_one_on_smollm2(smollm2_dir) -> None:
    """A real pretrained chat model (SmolLM2-135M-Instruct, tied embeddings, ChatML prompts of two lengths): the
    module keeps the shared path after its check, and its log-probs and gradients are the plain forward's.

    Compared in float64: there the log-probs agree exactly and the gradients to ~4e-7 of their norm (Llama's
    RMSNorm computes in float32, and the shared prompt sums its rows' gradients before that cast, the plain
    forward after it; reordering the plain forward's rows moves them by 1e-15). In float32 the same comparison
    gives ~1e-5 on the log-probs and up to 1e-4 on a norm weight's gradient: rounding, amplified by the sums.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    g = torch.Generator().manual_seed(0)
    samples = []
    for k, question in enumerate(("What is 2 + 3?", "Name a prime number larger than ten, please.")):
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tok(text, add_special_tokens=False).input_ids
        for i in range(3):
            n = 3 + 2 * i
            samples.append(
                Sample(
                    uid=f"{k}-{i}",
                    group_id=str(k),
                    prompt=question,
                    prompt_token_ids=list(prompt),
                    response_token_ids=torch.randint(100, 5000, (n,), generator=g).tolist(),
                    response_logprobs=[-5.0] * n,
                    reward=float(i % 2),
                )
            )
    batch = collate_samples(samples, pad_token_id=int(tok.pad_token_id or 0))
    module = GRPOModule(model_path=str(smollm2_dir), shared_prompt_forward=True)
    module.configure_model()
    module.policy_model.to(torch.float64)
    mask = batch.response_mask[:, 1:]
    plain = GRPOModule(model=module.policy_model, shared_prompt_forward=False)
    expected = plain.token_logprobs(batch)
    got = module.token_logprobs(batch)  # the first batch: checked against the plain forward, kept
    assert module._shared_prompt_ok is True
    torch.testing.assert_close(got[mask > 0], expected[mask > 0], atol=1e-9, rtol=1e-9)
    g_plain = _grads(module, (plain.token_logprobs(batch) * mask).sum())
    g_shared = _grads(module, (module.token_logprobs(batch) * mask).sum())
    worst = max(float((b - a).norm() / a.norm().clamp_min(1e-30)) for a, b in zip(g_plain, g_shared))
    assert worst < 1e-5, worst


def _smollm2_shaped_llama(layers: int = 30):
    """A random Llama of SmolLM2-135M's shape (hidden 576, 9 heads over 3 KV heads, tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def _long_batch(groups: int, n: int, prompt_tokens: int, response_tokens: int):
    g = torch.Generator().manual_seed(3)
    samples = []
    for k in range(groups):
        prompt = torch.randint(3, 49152, (prompt_tokens + 7 * k,), generator=g).tolist()
        for i in range(n):
            r = response_tokens - 5 * i
            samples.append(
                Sample(
                    uid=f"{k}-{i}",
                    group_id=str(k),
                    prompt="",
                    prompt_token_ids=prompt,
                    response_token_ids=torch.randint(3, 49152, (r,), generator=g).tolist(),
                    response_logprobs=[-5.0] * r,
                    reward=float(i % 2),
                )
            )
    return collate_samples(samples, pad_token_id=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_shared_prompt_forward_on_cuda_keeps_the_shared_path_and_the_plain_values(autocast: bool) -> None:
    """On a GPU (SDPA's CUDA kernels, a SmolLM2-shaped model, prompts of 200+ tokens): the check keeps the shared path,
    in float32 and under bf16 autocast (Lightning's ``precision="bf16-mixed"``), and the values are the plain ones."""
    module = GRPOModule(model=_smollm2_shaped_llama().cuda(), shared_prompt_forward=True)
    plain = GRPOModule(model=module.policy_model, shared_prompt_forward=False)
    batch = _long_batch(groups=3, n=4, prompt_tokens=200, response_tokens=60).to("cuda")
    mask = batch.response_mask[:, 1:]
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        got = module.token_logprobs(batch)
        expected = plain.token_logprobs(batch)
        assert module._shared_prompt_ok is True
        diff = float((got - expected).abs()[mask > 0].max())
        assert diff < (5e-2 if autocast else 1e-3), diff
        g_plain = _grads(module, (plain.token_logprobs(batch) * mask).sum())
        g_shared = _grads(module, (module.token_logprobs(batch) * mask).sum())
    worst = max(float((b - a).norm() / a.norm().clamp_min(1e-30)) for a, b in zip(g_plain, g_shared))
    assert worst < (5e-2 if autocast else 1e-3), worst
