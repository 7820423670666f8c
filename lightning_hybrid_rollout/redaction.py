"""Keep secrets out of what a run writes: saved configs, hyperparameters, traces, metrics and logs.

A *secret* is the value of an environment variable whose name says so (``WANDB_API_KEY``, ``HF_TOKEN``,
``*_SECRET*``, ``*PASSWORD*``, ...), the value of a config key whose name says so (``api_key:``, ``token:``, ...),
or anything passed to :func:`register_secret`. :func:`redact` replaces them in a config tree, and
:class:`RedactingFilter` in log records (the ``lhr`` script installs it on every handler; the callback does too).

Example::

    >>> register_secret("s3cr3t-value-123")
    >>> redact({"logger": {"settings": {"api_key": "abc"}}, "note": "key=s3cr3t-value-123"})
    {'logger': {'settings': {'api_key': '***'}}, 'note': 'key=***'}
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
SECRET_NAME = re.compile(r"(api[_-]?key|apikey|token|secret|passw(or)?d|credential|private[_-]?key)", re.IGNORECASE)
"""Names (environment variables, config keys) whose values are secrets."""
_NOT_SECRET_NAMES = {"TOKENIZERS_PARALLELISM", "RAY_AUTH_TOKEN_PATH", "pad_token", "eos_token", "bos_token"}
_MIN_SECRET_LEN = 6  # shorter values would mask ordinary words
_registered: set[str] = set()


def register_secret(value: str) -> None:
    """Treat ``value`` as a secret from now on (masked wherever :func:`redact` or the log filter sees it)."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LEN:
        _registered.add(value)


def is_secret_name(name: str) -> bool:
    """Whether a variable or key called ``name`` holds a secret (``WANDB_API_KEY``, ``api_key``, ``hf_token``)."""
    if name in _NOT_SECRET_NAMES or name.endswith(("_PATH", "_path", "_FILE", "_file")):
        return False
    return bool(SECRET_NAME.search(name)) and "tokenizer" not in name.lower() and not name.endswith("_tokens")


def secret_values() -> set[str]:
    """Secrets known now: registered ones and the values of secret-named environment variables."""
    found = {v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN}
    return found | _registered


def redact_text(text: str, secrets: set[str] | None = None) -> str:
    """``text`` with every known secret replaced by ``***``."""
    for s in sorted(secrets if secrets is not None else secret_values(), key=len, reverse=True):
        if s in text:
            text = text.replace(s, MASK)
    return text


def redact(value: Any, secrets: set[str] | None = None) -> Any:
    """A copy of a config tree (mappings, lists, scalars) with secrets masked.

    The value of a secret-named key becomes ``***``, and every string containing a known secret has it replaced.
    """
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v:
                out[k] = MASK
            else:
                out[k] = redact(v, secrets)
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, secrets) for v in value)
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


def collect_secrets(value: Any) -> None:
    """Register the values of secret-named keys in a config tree (so logs mask them too)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str):
                register_secret(v)
            else:
                collect_secrets(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            collect_secrets(v)


class RedactingFilter(logging.Filter):
    """A logging filter masking known secrets in each record's message (and exception text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = secret_values()
        if not secrets:
            return True
        message = record.getMessage()
        clean = redact_text(message, secrets)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, secrets)
        return True


def install_log_redaction(*logger_names: str) -> None:
    """Add one :class:`RedactingFilter` to every handler of the root logger and of ``logger_names``."""
    names = ("", "lightning.pytorch", "lightning.fabric", *logger_names)
    for name in names:
        for handler in logging.getLogger(name or None).handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())


def redact_logger_hyperparams(loggers: Any) -> None:
    """Mask secrets in what every logger writes: its hyperparameters (wrapped once) and the logs.

    ``hparams.yaml`` (CSV/TensorBoard) and the W&B run config are written from ``log_hyperparams``; each logger's
    method is wrapped once so what it receives is redacted.

    Args:
        loggers: The trainer's loggers (``trainer.loggers``).
    """
    install_log_redaction()
    for lg in loggers:
        if getattr(lg, "_lhr_redacted", False):
            continue
        original = lg.log_hyperparams

        def log_hyperparams(params: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if isinstance(params, Mapping):
                params = redact(dict(params))
            elif hasattr(params, "__dict__") and not isinstance(params, type):
                params = redact(dict(vars(params)))
            return _original(params, *args, **kwargs)

        lg.log_hyperparams = log_hyperparams
        lg._lhr_redacted = True
