"""Built-in reward functions, in TRL's calling convention: ``fn(completions, <columns>..., **kwargs) -> list``.

Each returns one value per completion: a float, or ``None`` when the sample cannot be scored ("does not apply",
left out of the weighted sum). Completions are a string each (plain prompts) or a message list each (chat prompts,
``[{"role": "assistant", "content": text}]``); :func:`completion_text` reads both.

* :func:`math_verify`: 1.0 if the completion's final answer equals the ``solution`` (or ``answer``) column
  mathematically (Hugging Face ``math-verify``, as TRL's ``accuracy_reward``), ``None`` if the ground truth does not
  parse. Works in a worker thread (see its doc).
* :func:`exact_match`: 1.0 if the stripped completion equals the stripped ``answer`` column.
* :class:`FormatReward`: 1.0 if the completion matches a regular expression (a class: give it by ``class_path``).

Short names (usable in ``reward_funcs``) are in :data:`BUILTINS`. ``math-verify`` (and sympy) load on the first
call, not on import.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BUILTINS", "FormatReward", "completion_text", "exact_match", "math_verify"]

#: math-verify's own per-expression timeout (signal alarms) where signals work, i.e. in the main thread.
MAIN_THREAD_TIMEOUT_S = 5


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion, plain or chat.

    Args:
        completion: A string (plain prompts), a message dict, or a list of messages (chat prompts, TRL's
            ``[{"role": "assistant", "content": text}]``); the contents of several messages are concatenated.

    Raises:
        TypeError: For anything else.

    Example::

        >>> completion_text([{"role": "assistant", "content": "42"}]), completion_text("42")
        ('42', '42')
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence) and all(isinstance(m, Mapping) for m in completion):
        return "".join(_content_text(m.get("content")) for m in completion)
    raise TypeError(
        f"a completion must be a string or a list of chat messages ({{'role': ..., 'content': ...}}), "
        f"got {type(completion).__name__}: {completion!r:.80}"
    )


def _ground_truth(solution: Sequence[Any] | None, answer: Sequence[Any] | None, kwargs: Mapping[str, Any]) -> list:
    gold = solution if solution is not None else answer
    if gold is None:
        raise ValueError(
            "math_verify needs the ground truth in a 'solution' or 'answer' column, the data set has "
            f"{sorted(k for k in kwargs if k not in ('prompts', 'completion_ids')) or 'none'}; add one of them"
        )
    return list(gold)


def math_verify(
    completions: Sequence[Any],
    solution: Sequence[Any] | None = None,
    answer: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Accuracy: 1.0 if the completion's answer equals the ground truth mathematically, 0.0 if not, ``None`` if the
    ground truth cannot be parsed (TRL's ``accuracy_reward``).

    The completion is parsed as LaTeX (a ``\\boxed{...}`` answer first) or, failing that, as a plain expression
    (the last number of "... the answer is 14."). math-verify guards each step with a ``SIGALRM`` timeout, which
    only works in a process's main thread: there (e.g. a process-pool worker) it is kept at
    :data:`MAIN_THREAD_TIMEOUT_S` seconds; in any other thread (a thread-pool worker) it is switched off
    (``parsing_timeout=None``, ``timeout_seconds=None``) and the runner's ``reward_timeout_s`` bounds the call.

    Args:
        completions: One completion per sample (string or chat message list).
        solution: The ground truth per sample (TRL's column name); preferred over ``answer``.
        answer: The ground truth per sample, if there is no ``solution`` column.
        **kwargs: Other columns (ignored).

    Example::

        >>> math_verify(["so it is \\\\boxed{\\\\frac{1}{2}}", "0.3"], solution=["0.5", "$\\\\frac{1}{2}$"])
        [1.0, 0.0]
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = _ground_truth(solution, answer, kwargs)
    timeout = MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    target_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    rewards: list[float | None] = []
    for completion, truth in zip(completions, gold, strict=True):
        gold_parsed = parse(str(truth), extraction_mode="first_match", parsing_timeout=timeout)
        if not gold_parsed:
            rewards.append(None)
            continue
        parsed = parse(
            completion_text(completion),
            extraction_config=target_config,
            extraction_mode="first_match",
            parsing_timeout=timeout,
        )
        try:
            rewards.append(float(verify(gold_parsed, parsed, timeout_seconds=timeout)))
        except Exception:  # as TRL: a comparison that errors scores None, not the whole group
            rewards.append(None)
    return rewards


def exact_match(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 if the completion text, stripped, equals ``str(answer)`` stripped, else 0.0.

    Args:
        completions: One completion per sample (string or chat message list).
        answer: The expected answer per sample (the ``answer`` column).
        **kwargs: Other columns (ignored).

    Example::

        >>> exact_match([" 7\\n", "8"], answer=[7, "7"])
        [1.0, 0.0]
    """
    return [
        1.0 if completion_text(c).strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer, strict=True)
    ]


class FormatReward:
    """1.0 if the completion text matches a regular expression, else 0.0 (give it by ``class_path``).

    The whole completion must match (``re.fullmatch``), so a pattern states the complete shape of a response;
    ``search=True`` accepts a match anywhere instead (``re.search``). ``.`` matches newlines by default
    (``dotall``), since completions span lines.

    Args:
        pattern: The regular expression (Python ``re`` syntax); a bad one is refused when the class is built.
        search: Match anywhere in the completion instead of the whole of it.
        dotall: ``re.DOTALL``: ``.`` also matches a newline.
        ignore_case: ``re.IGNORECASE``.
        multiline: ``re.MULTILINE``: ``^``/``$`` also match at line boundaries.

    Example::

        >>> fmt = FormatReward(r"<think>.*</think>\\s*<answer>.*</answer>")
        >>> fmt(["<think>a\\nb</think> <answer>3</answer>", "3"])
        [1.0, 0.0]

    In a config: ``{class_path: format, init_args: {pattern: "<think>.*</think>\\\\s*<answer>.*</answer>"}}``.
    """

    def __init__(
        self,
        pattern: str,
        *,
        search: bool = False,
        dotall: bool = True,
        ignore_case: bool = False,
        multiline: bool = False,
    ) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"FormatReward: pattern must be a string, got {type(pattern).__name__} {pattern!r}")
        flags = (
            (re.DOTALL if dotall else 0) | (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
        )
        try:
            self.regex = re.compile(pattern, flags)
        except re.error as err:
            raise ValueError(f"FormatReward: pattern {pattern!r} is not a valid regular expression: {err}") from err
        self.search = search

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Score each completion: 1.0 if it matches the pattern, else 0.0."""
        match = self.regex.search if self.search else self.regex.fullmatch
        return [1.0 if match(completion_text(c)) else 0.0 for c in completions]

    def __repr__(self) -> str:
        return f"FormatReward({self.regex.pattern!r}, search={self.search})"


BUILTINS: dict[str, Any] = {"math_verify": math_verify, "exact_match": exact_match, "format": FormatReward}
"""Short name -> built-in: the functions are used as given (``"math_verify"``), the classes by ``class_path``."""
