"""Typed, validated configuration with verl's parameter names (design/scheduling.md §2).

:class:`AsyncTrainingConfig` (``async_training``, with the derived sample counts of :func:`derived_counts`),
:class:`RolloutConfig` (``rollout``) and :class:`HybridRolloutConfig` (both, checked together). Every field's
attribute docstring is its LightningCLI ``--help`` text (docs/configuration.md has the full table); every bad value
gives one line naming the key, the value and the fix, collected into one :class:`ConfigError`.

Example::

    >>> cfg = HybridRolloutConfig.from_dict(
    ...     {"async_training": {"mini_batch_size": 32}, "rollout": {"n": 8, "standalone_replicas": 1}}
    ... )
    >>> cfg.async_training.max_required_samples  # int(32 * 1 * (0.1 + 1) * 4)
    140
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError as ConfigError  # re-exported

__all__ = [
    "BUILTIN_POLICIES",
    "DTYPES",
    "RUN_CONFIG_FILE",
    "AsyncTrainingConfig",
    "ConfigError",
    "DerivedCounts",
    "HybridRolloutConfig",
    "RolloutConfig",
    "TinyModelConfig",
    "derived_counts",
    "field_docs",
    "validate_run_config",
]

BUILTIN_POLICIES: tuple[str, ...] = ("default", "static_fully_async", "fixed_ratio")
"""The policies registered by ``lightning_hybrid_rollout.schedule`` on import (used only if it cannot be imported)."""

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "auto")
"""Accepted values of :attr:`RolloutConfig.dtype`."""

WEIGHT_TRANSPORTS: tuple[str, ...] = ("auto", "node_shm", "ray", "collective", "cuda_ipc")
"""Accepted values of :attr:`RolloutConfig.weight_transport` (the names of ``rollout/weights/factory.py``)."""

WEIGHT_ENCODINGS: tuple[str, ...] = ("auto", "full", "delta")
"""Accepted values of :attr:`RolloutConfig.weight_encoding` (``rollout/weights/delta.py``)."""

_C = TypeVar("_C", bound="_ConfigBase")


# --------------------------------------------------------------------------------------------------------------
# Validation helpers: each appends at most one message per key to `problems`.
# --------------------------------------------------------------------------------------------------------------


_suggest = did_you_mean


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Checker:
    def __init__(self, section: str) -> None:
        self.section = section
        self.problems: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.section}.{name}" if self.section else name

    def add(self, name: str, requirement: str, value: Any, fix: str) -> None:
        self.problems.append(f"{self.key(name)} must be {requirement}, got {value!r}. {fix}")

    def boolean(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            self.add(name, "a bool", value, f"Write `{name}: true` or `{name}: false` (no quotes).")

    def integer(self, name: str, value: Any, minimum: int, fix: str) -> None:
        if not _is_int(value):
            self.add(name, f"an integer >= {minimum}", value, fix)
        elif value < minimum:
            self.add(name, f">= {minimum}", value, fix)

    def real(
        self, name: str, value: Any, fix: str, *, low: float, high: float = math.inf, low_open: bool = False
    ) -> None:
        if math.isfinite(high):
            interval = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            interval = f"> {low:g}" if low_open else f">= {low:g}"
        if not _is_real(value) or value > high or value < low or (low_open and value == low):
            self.add(name, f"a number {interval}", value, fix)

    def choice(self, name: str, value: Any, choices: Iterable[str], fix: str) -> None:
        choices = tuple(choices)
        if value not in choices:
            self.add(name, f"one of {list(choices)}", value, fix + _suggest(value, choices))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


#: The run dir's copy of a fit's ``rollout`` and ``async_training`` settings, written by the callback at the start of a
#: fit beside ``trace.json`` (``lhr simulate --from-run`` reads it when there is no Lightning CLI ``config.yaml``).
RUN_CONFIG_FILE = "hybrid_rollout_config.yaml"

_OWN_KEYS = {"deactivate_ratio": "dynamic_schedule_deactivate_ratio", "only_hybrid": "only_hybrid"}


def policy_kwargs_problems(policy: Any, kwargs: Any) -> list[str]:
    """Problems of ``dynamic_schedule_policy_kwargs`` for ``policy`` (empty when they fit its constructor).

    Each problem reads as the rest of a sentence after the key, e.g. ``"has an unknown argument 'gate_margin' for
    policy rate_matched. Did you mean 'gate_margin_s'? ..."``.
    """
    if not isinstance(kwargs, Mapping):
        return [f"must be a mapping of the policy's constructor arguments, got {kwargs!r}."]
    if not kwargs:
        return []
    try:
        from lightning_hybrid_rollout.schedule import get_policy_class

        cls = get_policy_class(policy)
    except (ImportError, ValueError):
        return []  # an unknown policy name is reported on its own key
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    valid = [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    problems = []
    for name in kwargs:
        if name in _OWN_KEYS:
            problems.append(f"sets {name!r}: use async_training.{_OWN_KEYS[name]} instead.")
        elif not takes_any and name not in valid:
            knobs = [n for n in valid if n not in _OWN_KEYS]
            problems.append(
                f"has an unknown argument {name!r} for policy {policy}.{_suggest(str(name), knobs)} "
                f"Valid: {', '.join(knobs) or '(none)'}."
            )
    if problems:
        return problems
    try:
        cls(**kwargs)
    except (TypeError, ValueError) as err:
        return [f"is not accepted by policy {policy}: {err}"]
    return []


def _available_policies() -> tuple[str, ...]:
    try:  # lazy: the schedule package is pure Python, but config must not depend on its import order
        from lightning_hybrid_rollout.schedule import available_policies
    except ImportError:
        return BUILTIN_POLICIES
    return tuple(available_policies())


# --------------------------------------------------------------------------------------------------------------
# Shared dict round trip
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _ConfigBase:
    """Shared ``to_dict``/``from_dict`` (a dataclass itself, so jsonargparse treats subclasses as plain dataclasses)."""

    SECTION: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` (nested for :class:`HybridRolloutConfig`) that :meth:`from_dict` accepts back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_C], data: Mapping[str, Any]) -> _C:
        """Build from a mapping (e.g. a YAML section). Unknown keys are rejected, with the valid keys listed.

        Raises:
            ConfigError: unknown keys, or invalid values (see the class's field docs).
        """
        where = cls.SECTION or cls.__name__
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping of keys to values, got {data!r}.")
        valid = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise ConfigError(
                [f"{where} has no key {k!r}.{_suggest(k, valid)} Valid keys: {', '.join(valid)}." for k in unknown]
            )
        return cls(**cls._convert(dict(data)))

    @classmethod
    def _convert(cls, data: dict[str, Any]) -> dict[str, Any]:
        return data


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a config dataclass: ``{field name: docstring}`` (for docs and ``--help``).

    Example::

        >>> field_docs(AsyncTrainingConfig)["staleness_threshold"].split(".")[0]
        'Fraction of extra samples the rollouter may generate ahead of the trainer, under older weights'
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


# --------------------------------------------------------------------------------------------------------------
# async_training
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DerivedCounts:
    """The sample counts that follow from the ``async_training`` parameters (made by :func:`derived_counts` only).

    Args:
        required_samples: Samples per optimizer step: ``mini_batch_size * require_batches``.
        step_required_samples: Samples per sync cycle: ``required_samples * trigger_parameter_sync_step``.
        max_required_samples: The staleness budget per param version and the MessageQueue bound:
            ``int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)``.
        buffer_samples: Extra samples the policy may want buffered beyond the expected ones:
            ``int(step_required_samples * staleness_threshold)``.
    """

    required_samples: int
    step_required_samples: int
    max_required_samples: int
    buffer_samples: int


def derived_counts(
    *, mini_batch_size: int, trigger_parameter_sync_step: int, staleness_threshold: float, require_batches: int = 1
) -> DerivedCounts:
    """The derived sample counts of a run: the one formula the config, the runtime and the simulator share.

    ``max_required_samples`` is verl's expression in verl's order, so the float rounding matches its runs;
    ``buffer_samples`` follows verl's code (``step_required_samples * threshold``), not its doc.

    Args:
        mini_batch_size: Samples per mini-batch (``async_training.mini_batch_size``).
        trigger_parameter_sync_step: Optimizer steps per parameter version.
        staleness_threshold: Fraction of extra samples the rollouter may generate ahead of the trainer.
        require_batches: Mini-batches per optimizer step.

    Example::

        >>> derived_counts(mini_batch_size=128, trigger_parameter_sync_step=4, staleness_threshold=0.5)
        DerivedCounts(required_samples=128, step_required_samples=512, max_required_samples=768, buffer_samples=256)
    """
    required = mini_batch_size * require_batches
    step_required = required * trigger_parameter_sync_step
    return DerivedCounts(
        required_samples=required,
        step_required_samples=step_required,
        max_required_samples=int(required * (staleness_threshold + 1) * trigger_parameter_sync_step),
        buffer_samples=int(step_required * staleness_threshold),
    )


@dataclass
class AsyncTrainingConfig(_ConfigBase):
    """The ``async_training`` section (design/scheduling.md §2): dynamic resource scheduling and fully-async staleness.

    Derived sample counts (read these, never recompute them elsewhere): :attr:`required_samples`,
    :attr:`step_required_samples`, :attr:`max_required_samples`, :attr:`buffer_samples`, all from
    :func:`derived_counts` (:attr:`derived_counts` gives them together).
    """

    SECTION: ClassVar[str] = "async_training"

    # --- Parameters that control dynamic resource scheduling (design/scheduling.md §2, "Core Parameters")

    use_dynamic_resource_scheduling: bool = True
    """Lend hybrid replicas (on the trainer's devices) to rollout while the trainer waits. False = plain
    fully-async: standalone replicas only (then ``rollout.hybrid_replicas`` must be 0)."""

    dynamic_schedule_policy: str = "default"
    """Registered name of the policy deciding when hybrid replicas activate/deactivate: ``default``,
    ``static_fully_async`` (never lend), ``fixed_ratio``, ``rate_matched``, ``hysteresis_ratio`` or your own
    (docs/policies.md)."""

    dynamic_schedule_deactivate_ratio: float = 0.3
    """Initial deactivate ratio, in (0, 1]: hybrid replicas are deactivated once
    ``int(ratio * step_required_samples)`` samples are buffered. The ``default`` policy adapts it each step;
    ``only_hybrid`` forces 1.0."""

    dynamic_schedule_policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra constructor arguments of the policy, e.g. ``{gate_margin_fraction: 0.2}`` for ``rate_matched``; checked
    against its signature. ``deactivate_ratio`` and ``only_hybrid`` have their own keys."""

    dynamic_schedule_enable_rebalance: bool = True
    """After activating hybrid replicas, clear the load balancer's sticky cache and abort + resume in-flight requests
    so least-loaded routing moves load onto the newly active (empty) replicas."""

    overlap_sync: bool = False
    """Decide the activation *before* the standalone weight sync and, if it will activate, wake and sync the hybrid
    replicas concurrently with it. False = verl's order: standalone sync, then decide."""

    early_first_sync: bool = False
    """Also sync weights after the *first* optimizer step (a one-step first cycle), so the policy's first decision
    comes after one measured step instead of a whole cycle."""

    staged_standalone_sync: bool = False
    """Standalone weight sync in two phases: the buckets reach the replicas while they keep generating (stage), then
    each pauses once to load them (commit), so generation stops for the commit only. Costs one staged copy of the
    weights per node (CPU) or per engine (GPU) during the sync."""

    standalone_sync_mode: Literal["abort", "keep"] = "abort"
    """What a standalone weight sync does with in-flight requests: ``abort`` (verl's: they continue from their
    prefix, re-prefilled) or ``keep`` (frozen, and continued after the load in the same engine request, their KV
    recomputed by the new weights; the tokens after it are a new segment of the new version)."""

    # --- Parameters of fully-async training used by dynamic scheduling (design/scheduling.md §2)

    staleness_threshold: float = 0.1
    """Fraction of extra samples the rollouter may generate ahead of the trainer, under older weights. Sets
    ``max_required_samples`` (the queue bound) and ``buffer_samples``. 0 = no sample outlives one param version."""

    trigger_parameter_sync_step: int = 4
    """Optimizer steps per parameter version: weights are synced to the rollout replicas every this many steps
    (one sync cycle)."""

    require_batches: int = 1
    """Mini-batches gathered from the queue per optimizer step (``required_samples = mini_batch_size *
    require_batches``)."""

    partial_rollout: bool = True
    """Resume aborted requests (deactivation, rebalance, weight sync) from the tokens already generated instead of
    restarting them; the sample records the min/max weight version it was generated under."""

    mini_batch_size: int = 64
    """Samples per optimizer step (prompts × ``rollout.n``); must be a multiple of ``rollout.n``."""

    only_hybrid: bool = False
    """Colocated mode (verl: rollout nnodes = 0): every replica is hybrid, no standalone replicas; the trainer's
    devices alternate between rollout and training every cycle."""

    wait_timeout_s: float = 600.0
    """Longest the trainer waits for a batch (or for the deactivate threshold) before the fit fails with a clear
    error naming the queue size and the replica logs: the rollout side has stalled or produces far too slowly."""

    def __post_init__(self) -> None:
        c = _Checker(self.SECTION)
        c.boolean("use_dynamic_resource_scheduling", self.use_dynamic_resource_scheduling)
        policies = _available_policies()
        if not isinstance(self.dynamic_schedule_policy, str) or self.dynamic_schedule_policy not in policies:
            c.choice(
                "dynamic_schedule_policy",
                self.dynamic_schedule_policy,
                policies,
                "Use a built-in policy or import the module that registers yours with @register_policy first.",
            )
        c.real(
            "dynamic_schedule_deactivate_ratio",
            self.dynamic_schedule_deactivate_ratio,
            "Use a fraction such as 0.3 (verl's default); 1.0 waits for the whole cycle's samples.",
            low=0.0,
            high=1.0,
            low_open=True,
        )
        for problem in policy_kwargs_problems(self.dynamic_schedule_policy, self.dynamic_schedule_policy_kwargs):
            c.problems.append(f"{c.key('dynamic_schedule_policy_kwargs')} {problem}")
        c.boolean("dynamic_schedule_enable_rebalance", self.dynamic_schedule_enable_rebalance)
        c.boolean("overlap_sync", self.overlap_sync)
        c.boolean("early_first_sync", self.early_first_sync)
        c.boolean("staged_standalone_sync", self.staged_standalone_sync)
        c.choice("standalone_sync_mode", self.standalone_sync_mode, ("abort", "keep"), "Use abort or keep.")
        c.real(
            "staleness_threshold",
            self.staleness_threshold,
            "Use 0 for no off-policy samples, or a small fraction such as 0.1 (verl's default).",
            low=0.0,
        )
        c.integer(
            "trigger_parameter_sync_step",
            self.trigger_parameter_sync_step,
            1,
            "Sync weights every N >= 1 optimizer steps (verl's default: 4).",
        )
        c.integer("require_batches", self.require_batches, 1, "Use 1 (verl's default) or more mini-batches per step.")
        c.boolean("partial_rollout", self.partial_rollout)
        c.integer(
            "mini_batch_size",
            self.mini_batch_size,
            1,
            "Set it to prompts per step × rollout.n (e.g. 8 prompts × n=8 = 64).",
        )
        c.boolean("only_hybrid", self.only_hybrid)
        c.real(
            "wait_timeout_s",
            self.wait_timeout_s,
            "Give seconds, e.g. 600 (a slow first batch on a big model may need more).",
            low=0.0,
            low_open=True,
        )
        c.raise_if_any()

    @property
    def derived_counts(self) -> DerivedCounts:
        """All derived sample counts at once (:func:`derived_counts` of this section's values)."""
        return derived_counts(
            mini_batch_size=self.mini_batch_size,
            trigger_parameter_sync_step=self.trigger_parameter_sync_step,
            staleness_threshold=self.staleness_threshold,
            require_batches=self.require_batches,
        )

    @property
    def required_samples(self) -> int:
        """Samples per optimizer step: ``mini_batch_size * require_batches``."""
        return self.derived_counts.required_samples

    @property
    def step_required_samples(self) -> int:
        """Samples per sync cycle: ``required_samples * trigger_parameter_sync_step``."""
        return self.derived_counts.step_required_samples

    @property
    def max_required_samples(self) -> int:
        """Staleness budget and MessageQueue bound:
        ``int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)`` (verl's expression, in
        verl's order, so the float rounding matches)."""
        return self.derived_counts.max_required_samples

    @property
    def buffer_samples(self) -> int:
        """Extra samples the policy may want buffered beyond the expected ones:
        ``int(step_required_samples * staleness_threshold)``. verl's doc says ``expected_samples * threshold``,
        its code ``step_required_samples * threshold``; we follow the code (a per-cycle constant)."""
        return self.derived_counts.buffer_samples


# --------------------------------------------------------------------------------------------------------------
# rollout
# --------------------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------------------
# build_model (the CPU quickstart's tiny model)
# --------------------------------------------------------------------------------------------------------------


@dataclass
class TinyModelConfig(_ConfigBase):
    """The tiny random model the callback builds at ``rollout.model_path`` when it holds none (``build_model:``).

    Built only when the directory holds no model, and only inside the run's directory (``docs/security.md``); a
    random float32 ``LlamaForCausalLM`` with a character-level tokenizer
    (:func:`~lightning_hybrid_rollout.models.tiny_model.build_tiny_model`). ``build_model: true`` means these
    defaults.
    """

    SECTION: ClassVar[str] = "build_model"

    hidden: int = 128
    """Hidden size of the random model."""

    layers: int = 2
    """Decoder layers of the random model."""

    seed: int = 0
    """Seed of the random initialisation (a model built twice with the same keys is the same model)."""

    heads: int | None = None
    """Attention heads (None: ``hidden // 32``, at least 1: head dim 32; vLLM's CPU attention needs a head dim in
    {32, 64, 80, 96, 112, 128, ...})."""

    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None: as many as ``heads``)."""

    intermediate: int | None = None
    """MLP width (None: ``4 * hidden``)."""

    vocab_size: int = 128
    """Vocabulary size of the character-level tokenizer (>= 81)."""

    max_position_embeddings: int = 512
    """Longest sequence the model accepts (prompt + response)."""

    tie_word_embeddings: bool = True
    """Share the input embedding and the output head."""

    init_scale: float = 1.0
    """Scale of the random initialisation."""

    add_bos: bool = True
    """The tokenizer prepends a begin-of-sequence token."""

    format_warmup_steps: int = 0
    """Supervised warm-up steps on the task's answer *shape* (random answers) right after the build, so a
    random-init model learns the format before RL (design/notes.md §7). 0 disables it."""

    def __post_init__(self) -> None:
        c = _Checker(self.SECTION)
        for name in ("hidden", "layers", "max_position_embeddings"):
            c.integer(name, getattr(self, name), 1, "Use a small positive size, e.g. 128.")
        c.integer("vocab_size", self.vocab_size, 81, "The character-level tokenizer needs at least 81 ids: use 128.")
        c.integer("seed", self.seed, 0, "Use a non-negative integer.")
        for name in ("heads", "kv_heads", "intermediate"):
            if getattr(self, name) is not None:
                c.integer(name, getattr(self, name), 1, "Use a positive integer, or leave it out for the default.")
        c.boolean("tie_word_embeddings", self.tie_word_embeddings)
        c.boolean("add_bos", self.add_bos)
        c.real("init_scale", self.init_scale, "Use a positive scale such as 1.0.", low=0.0, low_open=True)
        c.integer("format_warmup_steps", self.format_warmup_steps, 0, "Use 0 to disable it, or e.g. 100.")
        c.raise_if_any()

    def build_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~lightning_hybrid_rollout.models.tiny_model.build_tiny_model`."""
        out = self.to_dict()
        out.pop("format_warmup_steps")
        return out

    @classmethod
    def resolve(cls, value: bool | TinyModelConfig | Mapping[str, Any] | None) -> TinyModelConfig | None:
        """``build_model:`` as given: True -> the defaults, False/None -> no build, a mapping -> its keys."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise ConfigError(
            f"build_model must be true, false or a mapping of TinyModelConfig keys, got {value!r}. Write "
            "`build_model: true` (the defaults) or e.g. `build_model: {hidden: 128, layers: 2, format_warmup_steps: "
            "100}`."
        )


@dataclass
class RolloutConfig(_ConfigBase):
    """The ``rollout`` section: replicas, their concurrency, sampling and engine settings."""

    SECTION: ClassVar[str] = "rollout"
    # vLLM engine argument -> the field of this section that sets it (refused in engine_kwargs)
    ENGINE_ARG_FIELDS: ClassVar[dict[str, str]] = {
        "model": "model_path",
        "dtype": "dtype",
        "max_model_len": "max_model_len",
        "kv_cache_memory_bytes": "kv_cache_memory_bytes",
        "enforce_eager": "enforce_eager",
        "seed": "seed",
        "max_num_seqs": "concurrent_samples_per_replica",
        "tensor_parallel_size": "tensor_parallel_size",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "enable_prefix_caching": "enable_prefix_caching",
    }
    # vLLM engine arguments the package sets itself (refused in engine_kwargs) -> why
    RESERVED_ENGINE_ARGS: ClassVar[dict[str, str]] = {
        "worker_extension_cls": "weight sync runs through the package's worker extension",
        "logprobs_mode": "the trainer's importance ratios need the log-probs of the distribution sampled from",
        "enable_sleep_mode": "hybrid replicas sleep and wake through the package (on when CUDA is available)",
    }

    # --- Parameters that control the replicas ------------------------------------------------------------------

    model_path: str = ""
    """Hugging Face model directory or hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``) the trainer and the engines
    load. A hub id is fetched into the Hugging Face cache once per node (``HF_HOME``; ``HF_HUB_OFFLINE=1`` reads the
    cache only). Required by the runtime; may stay empty for simulator-only configs."""

    model_revision: str | None = None
    """Branch, tag or commit of a hub id ``model_path`` (TRL's ``model_revision``); ``null``: its default branch.
    Ignored for a local directory."""

    standalone_replicas: int = 1
    """Always-on rollout replicas on dedicated devices (verl: rollout nodes). 0 with ``only_hybrid``."""

    hybrid_replicas: int = 1
    """Rollout replicas sharing the trainer's devices, lent to rollout while the trainer waits."""

    concurrent_samples_per_replica: int = 16
    """Concurrent samples one replica serves (``s`` in ``cap = min(servers * s, max_required_samples)``)."""

    # --- Parameters that control generation --------------------------------------------------------------------

    n: int = 8
    """Samples per prompt (the GRPO group size)."""

    response_length: int = 128
    """Maximum new tokens per sample (a resumed partial rollout counts the tokens it already has)."""

    prompt_length: int = 64
    """Maximum prompt tokens; longer prompts are rejected by the data path."""

    temperature: float = 1.0
    """Sampling temperature (>= 0; 0 = greedy)."""

    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]; 1.0 = disabled."""

    # --- Parameters that control which groups are trained on (dynamic sampling) -------------------------------

    filter_groups: bool | str = False
    """Drop finished groups before they reach the queue and admit a new prompt in each one's place, so every step
    still trains on its configured number of samples (DAPO's dynamic sampling). ``true``: drop groups whose rewards
    are all equal (zero advantage, no learning signal); a string ``"package.module:function"`` or
    ``"path/to/file.py:function"``: drop a group when ``function(samples)`` (its finished, rewarded ``Sample``
    list) returns False. ``false``: every group is trained on."""

    max_num_gen_batches: int = 10
    """Cap on generation per weight-sync cycle while ``filter_groups`` drops groups, in batches of the cycle's
    required samples (verl's ``max_num_gen_batches``): once the cycle's dropped samples reach ``(max_num_gen_batches
    - 1) x step_required_samples``, groups pass unfiltered until the next sync (one warning) instead of stalling the
    trainer. 0: no cap."""

    # --- Parameters that control the engine --------------------------------------------------------------------

    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Engine weight dtype. ``float32`` gives exact parity with transformers on CPU; ``auto`` follows the
    checkpoint (a float32 checkpoint then loads as bf16 in vLLM)."""

    kv_cache_memory_bytes: int = 256 * 1024**2
    """KV-cache bytes per replica (default 256 MiB). Always bounded: vLLM's default takes 0.9 of the device or node
    memory."""

    cpus_per_replica: int = 1
    """CPU cores per replica's Ray actor (a CPU replica is pinned to them)."""

    gpus_per_replica: float = 0.0
    """GPUs per replica's Ray actor (0 on CPU machines; may be fractional)."""

    ray_address: str | None = None
    """Address of a running Ray cluster; ``None`` starts a local Ray on 127.0.0.1."""

    enforce_eager: bool = True
    """Disable graph capture/compilation in the engine (faster start; compile does not pay off for tiny models)."""

    seed: int = 0
    """Seed of the engines' sampling (replica ``i`` uses ``seed + i``)."""

    tensor_parallel_size: int = 1
    """GPUs one engine shards the model over (vLLM ``tensor_parallel_size``). GPU only: 1 on CPU, and at most
    ``gpus_per_replica`` (a replica's actor must see all of its engine's GPUs)."""

    gpu_memory_utilization: float = 0.4
    """GPU only: fraction of each GPU's memory an engine may take for weights + KV cache, in (0, 1] (low, since a
    hybrid replica shares the GPU with the trainer). On CPU ``kv_cache_memory_bytes`` sizes the cache."""

    max_model_len: int | None = None
    """Longest prompt + response an engine accepts (vLLM ``max_model_len``). ``None``: ``prompt_length +
    response_length + 8``; if set, at least ``prompt_length + response_length`` and at most what the model
    supports (checked against its ``config.json`` before any replica starts)."""

    enable_prefix_caching: bool | None = None
    """Reuse the KV cache of shared prompt prefixes (a group's ``n`` samples share their prompt; vLLM
    ``enable_prefix_caching``). ``None``: vLLM's default for the model."""

    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """More vLLM engine arguments (``AsyncEngineArgs`` fields, e.g. ``{max_num_batched_tokens: 2048}``), passed to
    every engine and checked with vLLM's own code before any replica starts. A key a field of this section sets
    (e.g. ``max_model_len``, ``dtype``, ``max_num_seqs``) is refused: set that field instead."""

    pin_trainer: bool = True
    """CPU only: pin the trainer process to the hybrid replicas' cores (they take turns), leaving the other cores to
    the standalone replicas."""

    weight_transport: Literal["auto", "node_shm", "ray", "collective", "cuda_ipc"] = "auto"
    """How the trainer's weights reach the replicas at each sync: ``node_shm`` (a node-local shared-memory file),
    ``ray`` (Ray's object store), ``collective`` (a torch.distributed broadcast in a group of its own: gloo on CPU,
    NCCL on GPU), ``cuda_ipc`` (CUDA only: the hybrid replica on the trainer's GPU maps its tensors). ``auto``: per
    replica by placement; without CUDA ``node_shm`` on the trainer's node and ``ray`` elsewhere, with CUDA
    ``cuda_ipc`` for a hybrid replica on the trainer's GPU and ``collective`` otherwise. Every sync is verified by
    checksum; a named transport never falls back to another."""

    weight_encoding: Literal["auto", "full", "delta"] = "auto"
    """What each weight sync sends. ``auto``: ``delta`` to the replicas whose engine holds bfloat16 or float16
    weights, ``full`` to the others (a float32 engine's weights change almost everywhere under Adam: 99.9% of
    SmolLM2's per step, so a delta saves nothing and costs its encoding). ``delta``: the elements that changed
    since the version the replica holds, in
    the engine's dtype (int32 index + value per changed element, or the whole tensor where most changed), applied to
    a dense copy of the weights the replica keeps; the first sync, a restarted replica, one whose checksum disagreed
    and one too far behind (the chain of deltas bigger than a full sync) get the full weights in the engine's dtype.
    Exact: every sync is verified by the same checksum as a full one. Costs one copy of the weights in the engine's
    dtype on the trainer and on each replica. ``full``: the trainer's tensors as they are, every sync. A LoRA
    adapter-only sync (``lora_sync: adapter``) and ``cuda_ipc`` always send in full (docs/rollout.md)."""

    lora_sync: Literal["adapter", "merged"] = "adapter"
    """With a LoRA policy (``GRPOModule(peft=...)``), what each weight sync sends. ``adapter``: the adapter's
    ``lora_A`` / ``lora_B`` tensors only; the engines start with vLLM's LoRA on (``max_lora_rank`` from
    ``peft.r``), keep the base they loaded at start, and serve every request admitted after a sync with the new
    adapter. ``merged``: the full merged weights ``W + B @ A * scaling`` under the base names, to plain engines.
    Without ``peft`` every sync is a full one and this is ignored (docs/lora.md)."""

    lora_keep_base: bool = True
    """With ``lora_sync: adapter``, on GPU: a hybrid replica's deactivation releases its KV cache only and keeps the
    base weights on the device, so its activation costs the adapter push alone; false: vLLM's level-1 sleep (the
    weights go to host memory and are copied back at the wake). CPU engines never sleep (they park and keep
    everything), so there it changes nothing (docs/lora.md)."""

    # --- Parameters that control placement and failures --------------------------------------------------------

    standalone_resource: str | None = None
    """Ray resource a node must advertise to host standalone replicas (e.g. ``lhr_rollout``, set with ``ray start
    --resources '{"lhr_rollout": 8}'``; one unit per replica). ``None``: anywhere Ray finds room. Hybrid replicas
    always go to the trainer ranks' own nodes."""

    replica_health_timeout_s: float = 60.0
    """A replica that does not answer a health check within this many seconds is treated as dead: it is killed,
    its in-flight samples continue on other replicas, and a replacement starts."""

    max_replica_restarts: int = 3
    """Replacements tried per replica slot in a row before giving up on it (a successful one resets the count); with
    no replica left, the fit saves a checkpoint and stops with a ``ReplicaFailureError``."""

    deactivation_drain_s: float = 0.0
    """Drain budget in seconds when hybrid replicas are deactivated: requests expected to finish within it complete
    instead of being aborted (the others continue elsewhere from their prefix). The trainer waits meanwhile, so keep
    it near the abort's own cost (e.g. 0.15). 0 = verl's deactivation: abort everything at once."""

    def __post_init__(self) -> None:
        c = _Checker(self.SECTION)
        if not isinstance(self.model_path, str):
            c.add(
                "model_path", "a string", self.model_path, "Give a model directory or a hub id, e.g. 'Qwen/Qwen3-0.6B'."
            )
        if self.model_revision is not None and (not isinstance(self.model_revision, str) or not self.model_revision):
            c.add("model_revision", "null or a non-empty string", self.model_revision, "E.g. 'main' or a commit hash.")
        c.integer(
            "standalone_replicas",
            self.standalone_replicas,
            0,
            "Use 0 (with only_hybrid) or a positive count of dedicated rollout replicas.",
        )
        c.integer("hybrid_replicas", self.hybrid_replicas, 0, "Use 0 (plain fully-async) or a positive count.")
        c.integer(
            "concurrent_samples_per_replica",
            self.concurrent_samples_per_replica,
            1,
            "Use a positive count such as 16 (verl's default).",
        )
        c.integer("n", self.n, 1, "Use the group size, e.g. 8 samples per prompt.")
        c.integer("response_length", self.response_length, 1, "Give the maximum new tokens per sample, e.g. 128.")
        c.integer("prompt_length", self.prompt_length, 1, "Give the maximum prompt tokens, e.g. 64.")
        c.real("temperature", self.temperature, "Use 1.0 for plain sampling or 0 for greedy.", low=0.0)
        c.real("top_p", self.top_p, "Use 1.0 to disable nucleus sampling.", low=0.0, high=1.0, low_open=True)
        self._check_filter_groups(c)
        c.choice("dtype", self.dtype, DTYPES, "Use float32 on CPU for parity with transformers.")
        c.integer(
            "kv_cache_memory_bytes",
            self.kv_cache_memory_bytes,
            1,
            "Give a byte count, e.g. 268435456 (256 MiB).",
        )
        c.integer("cpus_per_replica", self.cpus_per_replica, 1, "Give at least one core per replica.")
        c.real("gpus_per_replica", self.gpus_per_replica, "Use 0 on CPU, or e.g. 1.0 per GPU replica.", low=0.0)
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            c.add(
                "ray_address",
                "null or a non-empty string",
                self.ray_address,
                "Use null for a local Ray, or e.g. 'ray://head:10001'.",
            )
        c.boolean("enforce_eager", self.enforce_eager)
        c.choice(
            "weight_transport",
            self.weight_transport,
            WEIGHT_TRANSPORTS,
            "Use 'auto' (chosen per replica by placement) unless you need one transport for every replica.",
        )
        c.choice(
            "weight_encoding",
            self.weight_encoding,
            WEIGHT_ENCODINGS,
            "Use 'auto' (deltas to 16-bit engines), 'delta' (send only the changed elements) or 'full' (send the whole "
            "weights every sync).",
        )
        c.choice(
            "lora_sync",
            self.lora_sync,
            ("adapter", "merged"),
            "Use 'adapter' (send only the LoRA adapter) or 'merged' (send the merged full weights).",
        )
        c.boolean("lora_keep_base", self.lora_keep_base)
        c.integer("seed", self.seed, 0, "Use a non-negative integer.")
        if self.standalone_resource is not None and (
            not isinstance(self.standalone_resource, str) or not self.standalone_resource
        ):
            c.add(
                "standalone_resource",
                "null or a Ray resource name",
                self.standalone_resource,
                "Use null (no placement constraint) or the resource your rollout nodes advertise, e.g. 'lhr_rollout'.",
            )
        c.real(
            "replica_health_timeout_s",
            self.replica_health_timeout_s,
            "Use seconds, e.g. 60 (longer than an engine's slowest step).",
            low=0.0,
            low_open=True,
        )
        c.integer(
            "max_replica_restarts",
            self.max_replica_restarts,
            0,
            "Use 0 (never replace a dead replica) or a small count such as 3.",
        )
        c.real(
            "deactivation_drain_s",
            self.deactivation_drain_s,
            "Use 0 (abort everything, verl's deactivation) or a small budget such as 0.15 seconds.",
            low=0.0,
        )
        self._check_engine_fields(c)
        c.raise_if_any()

    def _check_filter_groups(self, c: _Checker) -> None:
        f = self.filter_groups
        if isinstance(f, str):
            where, _, attr = f.strip().rpartition(":")
            if not where or not attr.isidentifier():
                c.add(
                    "filter_groups",
                    "true, false or 'package.module:function' / 'path/to/file.py:function'",
                    f,
                    "Name the function after a colon, e.g. 'my_filters.py:keep_group'.",
                )
        elif not isinstance(f, bool):
            c.add(
                "filter_groups",
                "true, false or 'package.module:function' / 'path/to/file.py:function'",
                f,
                "Use true (drop groups whose rewards are all equal) or a filter function's import path.",
            )
        c.integer(
            "max_num_gen_batches",
            self.max_num_gen_batches,
            0,
            "Use 0 (no cap) or a count of batches such as 10 (verl's default).",
        )

    def engine_max_model_len(self) -> int:
        """The engines' ``max_model_len``: the field if set, else ``prompt_length + response_length + 8``."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.prompt_length + self.response_length + 8

    def _check_engine_fields(self, c: _Checker) -> None:
        tp = self.tensor_parallel_size
        c.integer("tensor_parallel_size", tp, 1, "Use 1 (one GPU per engine), or the number of GPUs to shard over.")
        gpus = self.gpus_per_replica
        if _is_int(tp) and tp > 1 and _is_real(gpus) and gpus < tp:
            if gpus == 0:
                c.add("tensor_parallel_size", "1 on CPU (gpus_per_replica: 0)", tp, "Tensor parallelism is GPU only.")
            else:
                c.add(
                    "tensor_parallel_size",
                    f"<= gpus_per_replica ({gpus:g})",
                    tp,
                    f"A replica's actor must see all its engine's GPUs: set gpus_per_replica: {tp} or lower "
                    f"tensor_parallel_size.",
                )
        c.real(
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "Use a fraction of each GPU's memory, e.g. 0.4 (GPU only).",
            low=0.0,
            high=1.0,
            low_open=True,
        )
        mml = self.max_model_len
        if mml is not None:
            lengths = (self.prompt_length, self.response_length)
            need = sum(lengths) if all(_is_int(x) for x in lengths) else 0
            if not _is_int(mml):
                c.add("max_model_len", "null or an integer", mml, "Use null (prompt + response + 8) or e.g. 4096.")
            elif mml < need:
                c.add(
                    "max_model_len",
                    f">= prompt_length + response_length = {need}",
                    mml,
                    f"Use null ({need + 8}) or at least {need}, or lower prompt_length / response_length.",
                )
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            c.add(
                "enable_prefix_caching",
                "null, true or false",
                self.enable_prefix_caching,
                "Use null (vLLM's default), true or false (no quotes).",
            )
        kwargs = self.engine_kwargs
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            c.add(
                "engine_kwargs",
                "a mapping of vLLM engine argument names to values",
                kwargs,
                "Write e.g. `engine_kwargs: {max_num_batched_tokens: 2048}`.",
            )
            return
        for key, value in kwargs.items():
            if key in self.ENGINE_ARG_FIELDS:
                owner = self.ENGINE_ARG_FIELDS[key]
                c.problems.append(
                    f"{c.key('engine_kwargs')}.{key} is set by {c.key(owner)}: remove it from engine_kwargs and "
                    f"set `{owner}: {value!r}` in the {self.SECTION} section instead."
                )
            elif key in self.RESERVED_ENGINE_ARGS:
                c.problems.append(
                    f"{c.key('engine_kwargs')}.{key} cannot be set: lightning_hybrid_rollout sets it itself "
                    f"({self.RESERVED_ENGINE_ARGS[key]}). Remove it from engine_kwargs."
                )


# --------------------------------------------------------------------------------------------------------------
# both sections
# --------------------------------------------------------------------------------------------------------------


def _cross_field_problems(a: AsyncTrainingConfig, r: RolloutConfig) -> list[str]:
    problems: list[str] = []
    if a.only_hybrid and r.hybrid_replicas == 0:
        problems.append(
            "rollout.hybrid_replicas must be >= 1 when async_training.only_hybrid is true, got 0. Colocated mode "
            "generates on hybrid replicas only: set rollout.hybrid_replicas >= 1 or only_hybrid: false."
        )
    if a.only_hybrid and r.standalone_replicas > 0:
        problems.append(
            f"rollout.standalone_replicas must be 0 when async_training.only_hybrid is true, got "
            f"{r.standalone_replicas}. Colocated mode has no standalone replicas: set standalone_replicas: 0 or "
            f"only_hybrid: false."
        )
    if a.only_hybrid and not a.use_dynamic_resource_scheduling:
        problems.append(
            "async_training.use_dynamic_resource_scheduling must be true when async_training.only_hybrid is true, "
            "got false. Without scheduling the hybrid replicas never generate: enable it or set only_hybrid: false."
        )
    if not a.use_dynamic_resource_scheduling and r.hybrid_replicas > 0:
        problems.append(
            f"rollout.hybrid_replicas must be 0 when async_training.use_dynamic_resource_scheduling is false, got "
            f"{r.hybrid_replicas}. Set hybrid_replicas: 0, or keep scheduling on with dynamic_schedule_policy: "
            f"static_fully_async for a baseline that never lends them."
        )
    if r.standalone_replicas + r.hybrid_replicas == 0:
        problems.append(
            "rollout.standalone_replicas + rollout.hybrid_replicas must be >= 1, got 0 + 0. Nothing would generate "
            "samples: add at least one replica."
        )
    if a.mini_batch_size % r.n:
        prompts = max(1, round(a.mini_batch_size / r.n))
        problems.append(
            f"async_training.mini_batch_size must be a multiple of rollout.n={r.n}, got {a.mini_batch_size}. A "
            f"step trains whole groups: use e.g. {prompts * r.n} ({prompts} prompts × n={r.n})."
        )
    return problems


def validate_run_config(async_cfg: AsyncTrainingConfig, rollout_cfg: RolloutConfig) -> None:
    """Check what needs both sections (each section validated itself already).

    Raises:
        ConfigError: with one message per violated rule.
    """
    problems = _cross_field_problems(async_cfg, rollout_cfg)
    if problems:
        raise ConfigError(problems)


@dataclass
class HybridRolloutConfig(_ConfigBase):
    """A whole run's scheduling config: the ``async_training`` and ``rollout`` sections, checked together.

    Example::

        >>> HybridRolloutConfig(
        ...     AsyncTrainingConfig(only_hybrid=True), RolloutConfig(standalone_replicas=0, hybrid_replicas=2)
        ... ).rollout_capacity(2)  # min(2 * 16, int(64 * 1.1 * 4))
        32
    """

    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """The seed's ``async_training`` section."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Replicas, sampling and engine settings."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not isinstance(self.async_training, AsyncTrainingConfig):
            problems.append(
                f"async_training must be an AsyncTrainingConfig, got {self.async_training!r}. "
                f"Use HybridRolloutConfig.from_dict for plain mappings."
            )
        if not isinstance(self.rollout, RolloutConfig):
            problems.append(
                f"rollout must be a RolloutConfig, got {self.rollout!r}. Use HybridRolloutConfig.from_dict for plain "
                f"mappings."
            )
        if problems:
            raise ConfigError(problems)
        validate_run_config(self.async_training, self.rollout)

    @classmethod
    def _convert(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = dict(data)
        if isinstance(out.get("async_training"), Mapping):
            out["async_training"] = AsyncTrainingConfig.from_dict(out["async_training"])
        if isinstance(out.get("rollout"), Mapping):
            out["rollout"] = RolloutConfig.from_dict(out["rollout"])
        return out

    def rollout_capacity(self, active_servers: int) -> int:
        """The rollouter's concurrency cap with ``active_servers`` replicas routed:
        ``min(active_servers * concurrent_samples_per_replica, max_required_samples)`` (design/scheduling.md §4.2)."""
        from lightning_hybrid_rollout.metrics import rollout_capacity

        return rollout_capacity(
            active_servers, self.rollout.concurrent_samples_per_replica, self.async_training.max_required_samples
        )
