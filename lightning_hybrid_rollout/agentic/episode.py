"""One multi-turn episode's trained sequence: the prompt's tokens, each model turn's tokens exactly as the engine
generated them (never re-tokenized), and each tool/environment turn's tokens as the chat template renders that
message after the conversation so far; the loss mask, log-probs, weight versions, budget and checkpoint state."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_hybrid_rollout.errors import ChatTemplateError, ConfigError

__all__ = ["PLAIN_CHAT_TEMPLATE", "Episode", "EpisodeBudget", "Turn"]

logger = logging.getLogger(__name__)

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""The template used for a tokenizer without a chat template (the tiny CPU model's): ``role: content`` lines."""

#: A neutral conversation the fallback renders a new message after (see :meth:`Episode.add_message`).
_FALLBACK_BASE: tuple[dict[str, str], ...] = ({"role": "user", "content": "."}, {"role": "assistant", "content": "."})

STOP_REASONS = ("no_tool_call", "environment_done", "max_turns", "max_episode_tokens", "error")
"""Why an episode ends: the model called no tool, the environment said done, the turn or token budget ran out,
or the environment broke its contract (counted; the run goes on)."""


@dataclass(frozen=True)
class EpisodeBudget:
    """How long one episode may grow."""

    max_turns: int = 8
    """The most model turns (each followed by at most one tool/environment turn)."""
    max_episode_tokens: int = 4096
    """The most tokens of the whole trained sequence, prompt included."""

    def __post_init__(self) -> None:
        problems = [
            f"{key} must be an integer >= 1, got {value!r}"
            for key, value in (("max_turns", self.max_turns), ("max_episode_tokens", self.max_episode_tokens))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1
        ]
        if problems:
            raise ConfigError(problems)


@dataclass
class Turn:
    """One piece of the trained sequence.

    Args:
        role: ``"prompt"``, ``"assistant"`` (a model turn: trained) or the message's role (``"tool"``, ``"user"``).
        token_ids: Its tokens in the sequence.
        logprobs: A model turn's per-token log-probs under the engine that generated them; empty otherwise.
        weight_versions: A model turn's weight version per engine segment (one per partial-rollout retry).
        segment_starts: Where each of those segments starts, as a token index into ``token_ids``.
    """

    role: str
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)

    @property
    def trained(self) -> bool:
        """True for a model turn: its tokens carry loss mask 1."""
        return self.role == "assistant"


class Episode:
    """A multi-turn episode's conversation and its exact token sequence.

    Args:
        messages: The prompt's messages (a plain prompt: one user message), after an environment's reset text.
        prompt_token_ids: The prompt's tokens as the engine gets them (the prompt renderer's).
        tokenizer: The model's tokenizer (``apply_chat_template``, ``__call__``, ``decode``).
        budget: The turn and token budget.
        chat_template: A template to use instead of the tokenizer's (:data:`PLAIN_CHAT_TEMPLATE` if it has none).
        tools: JSON schemas passed as ``tools=`` to the template (only to templates that render them).

    Example::

        ep = Episode([{"role": "user", "content": "2+3?"}], prompt_ids, tok, EpisodeBudget(max_turns=4))
        ep.add_model_turn(ids, logprobs, weight_versions=[7])
        ep.add_message({"role": "tool", "content": "5"})   # the template's tokens for it + the generation prompt
        ep.token_ids  # what the engine continues from
    """

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        prompt_token_ids: Sequence[int],
        tokenizer: Any,
        budget: EpisodeBudget | None = None,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.budget = budget or EpisodeBudget()
        self.chat_template = chat_template or (
            None if getattr(tokenizer, "chat_template", None) else PLAIN_CHAT_TEMPLATE
        )
        self.tools = [dict(t) for t in tools] if tools else None
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.turns: list[Turn] = [Turn(role="prompt", token_ids=[int(t) for t in prompt_token_ids])]
        self.stop_reason: str | None = None
        self.template_fallbacks = 0
        """Tool/environment turns tokenized by the fallback (the template's earlier turns were not a prefix)."""
        if len(self.turns[0].token_ids) >= self.budget.max_episode_tokens:
            self.stop_reason = "max_episode_tokens"

    # ------------------------------------------------------------------------------------------------ the sequence

    @property
    def token_ids(self) -> list[int]:
        """The whole sequence: what the engine continues from, and what is trained."""
        return [t for turn in self.turns for t in turn.token_ids]

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt's tokens."""
        return list(self.turns[0].token_ids)

    @property
    def response_token_ids(self) -> list[int]:
        """Everything after the prompt: model and tool/environment turns, in order."""
        return [t for turn in self.turns[1:] for t in turn.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """One per response token: 1 on model tokens, 0 on tool/environment tokens."""
        return [int(turn.trained) for turn in self.turns[1:] for _ in turn.token_ids]

    @property
    def response_logprobs(self) -> list[float]:
        """One per response token: the engine's log-prob on model tokens, 0.0 on masked ones."""
        return [
            lp for turn in self.turns[1:] for lp in (turn.logprobs if turn.trained else [0.0] * len(turn.token_ids))
        ]

    @property
    def num_model_turns(self) -> int:
        """Model turns so far."""
        return sum(turn.trained for turn in self.turns)

    @property
    def weight_versions(self) -> list[int]:
        """Every model segment's weight version, in order."""
        return [v for turn in self.turns if turn.trained for v in turn.weight_versions]

    @property
    def min_weight_version(self) -> int | None:
        """The oldest segment's weight version: the episode's staleness is measured from it (None: no model turn)."""
        return min(self.weight_versions, default=None)

    @property
    def max_weight_version(self) -> int | None:
        """The newest segment's weight version (None: no model turn)."""
        return max(self.weight_versions, default=None)

    @property
    def remaining_tokens(self) -> int:
        """Tokens the episode may still grow by (the next model turn's ``max_tokens`` is at most this)."""
        return max(0, self.budget.max_episode_tokens - sum(len(turn.token_ids) for turn in self.turns))

    @property
    def done(self) -> bool:
        """True once the episode has ended (see :attr:`stop_reason`)."""
        return self.stop_reason is not None

    def finish(self, reason: str) -> None:
        """End the episode (the first reason given stays)."""
        if reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {reason!r}; use one of {', '.join(STOP_REASONS)}")
        if self.stop_reason is None:
            self.stop_reason = reason

    # ------------------------------------------------------------------------------------------------------ turns

    def add_model_turn(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        weight_versions: Sequence[int],
        segment_starts: Sequence[int] | None = None,
        text: str | None = None,
    ) -> None:
        """Append a model turn's tokens as generated; its text joins the conversation (for later templates).

        Args:
            token_ids: The generated tokens (the end token included if the engine returned it).
            logprobs: One per token.
            weight_versions: The weight version of each engine segment of the turn.
            segment_starts: Where each segment starts in ``token_ids`` (default: one segment at 0).
            text: The turn's text (default: ``token_ids`` decoded without special tokens).

        Ends the episode with ``max_turns`` or ``max_episode_tokens`` when the turn uses the last of either.
        """
        if self.done:
            raise RuntimeError(f"episode already ended ({self.stop_reason}); start a new one")
        ids = [int(t) for t in token_ids]
        starts = [0] if segment_starts is None else [int(s) for s in segment_starts]
        if len(logprobs) != len(ids) or not weight_versions or len(starts) != len(weight_versions):
            raise ValueError(
                f"a model turn needs one log-prob per token ({len(logprobs)} for {len(ids)}) and one weight version "
                f"per segment ({len(weight_versions)} for {len(starts)} segment starts)"
            )
        if text is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.turns.append(
            Turn("assistant", ids, [float(x) for x in logprobs], [int(v) for v in weight_versions], starts)
        )
        self.messages.append({"role": "assistant", "content": text})
        if self.remaining_tokens == 0:
            self.finish("max_episode_tokens")
        elif self.num_model_turns >= self.budget.max_turns:
            self.finish("max_turns")

    def add_message(self, message: Mapping[str, Any]) -> list[int] | None:
        """Append a tool/environment message: its tokens as the template renders it after the conversation so far,
        with the generation prompt of the next model turn.

        Returns:
            The tokens appended, or ``None`` if they do not fit the token budget (the episode then ends with
            ``max_episode_tokens`` and the message is dropped: the sequence still ends with a model turn).
        """
        return self.add_messages([message])

    def add_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """Append several messages answering one model turn (one per tool call) as one turn: the template's
        rendering of all of them after the conversation, then the generation prompt once.

        Returns:
            The tokens appended, or ``None`` if they do not fit (see :meth:`add_message`).
        """
        if self.done:
            raise RuntimeError(f"episode already ended ({self.stop_reason}); start a new one")
        new = [dict(m) for m in messages]
        if not new:
            raise ValueError("add_messages needs at least one message")
        ids = self._message_tokens(new)
        if len(ids) >= self.remaining_tokens:  # no room left for the next model turn's first token
            self.finish("max_episode_tokens")
            return None
        self.turns.append(Turn(role=str(new[0].get("role", "tool")), token_ids=ids))
        self.messages.extend(new)
        return ids

    def _render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _message_tokens(self, new: list[dict[str, Any]]) -> list[int]:
        """The token suffix the new messages (and the generation prompt) add to the conversation's rendering."""
        role = new[0].get("role")
        before = self._render(self.messages, add_generation_prompt=False)
        after = self._render([*self.messages, *new], add_generation_prompt=True)
        if after.startswith(before):
            tail = self._encode(self._model_turn_tail(before))
            before_ids, after_ids = self._encode(before), self._encode(after)
            if after_ids[: len(before_ids)] == before_ids:
                return tail + after_ids[len(before_ids) :]
            return tail + self._encode(after[len(before) :])  # a merge across the boundary: the delta text alone
        # The template renders earlier turns differently once a message follows (e.g. drops their reasoning): the
        # suffix is meaningless, so only the new message's own text is tokenized, after a neutral conversation.
        self.template_fallbacks += 1
        log = logger.warning if self.template_fallbacks == 1 else logger.debug
        log(
            "the chat template renders the conversation before a %r message differently once it follows; its "
            "tokens come from its own rendering after a neutral conversation (counted in template_fallbacks)",
            role,
        )
        base = self._render(_FALLBACK_BASE, add_generation_prompt=False)
        delta = self._render([*_FALLBACK_BASE, *new], add_generation_prompt=True)
        if not delta.startswith(base):
            raise ChatTemplateError(
                f"the chat template does not render a {role!r} message as text appended to the "
                "conversation before it, even after a neutral one; give a chat_template that does"
            )
        return self._encode(delta[len(base) :])

    def _model_turn_tail(self, rendered: str) -> str:
        """What the template renders after the last model turn's own text (ChatML: the ``\\n`` after ``<|im_end|>``;
        the end token itself for a turn cut by the length limit), so the next message follows it as in the template.

        Empty when the last turn is not a model turn or its text cannot be found at the end of the rendering.
        """
        last = self.turns[-1]
        if not last.trained or not last.token_ids:
            return ""
        generated = self.tokenizer.decode(last.token_ids, skip_special_tokens=False)
        at = rendered.rfind(generated) if generated else -1
        if at < 0:  # the template rewrites the turn (trims it, drops its reasoning): nothing to add
            text = self.messages[-1].get("content") or ""
            at = rendered.rfind(text) if text else -1
            generated = text
        return rendered[at + len(generated) :] if at >= 0 else ""

    # ------------------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The episode as plain data (lists, numbers, strings): everything but the tokenizer."""
        return {
            "messages": [dict(m) for m in self.messages],
            "turns": [asdict(turn) for turn in self.turns],
            "budget": asdict(self.budget),
            "chat_template": self.chat_template,
            "tools": self.tools,
            "stop_reason": self.stop_reason,
            "template_fallbacks": self.template_fallbacks,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the tokenizer is this episode's own)."""
        self.messages = [dict(m) for m in state["messages"]]
        self.turns = [Turn(**turn) for turn in state["turns"]]
        self.budget = EpisodeBudget(**state["budget"])
        self.chat_template = state["chat_template"]
        self.tools = state["tools"]
        self.stop_reason = state["stop_reason"]
        self.template_fallbacks = int(state["template_fallbacks"])

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], tokenizer: Any) -> Episode:
        """A new episode restored from :meth:`state_dict`'s output."""
        episode = cls(state["messages"], state["turns"][0]["token_ids"], tokenizer, EpisodeBudget(**state["budget"]))
        episode.load_state_dict(state)
        return episode
