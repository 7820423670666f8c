"""Check vLLM engine arguments with vLLM's own code, in the trainer process, before any replica starts: each unknown key
or rejected value is one :class:`~lightning_hybrid_rollout.errors.EngineArgsError`, and ``os.environ``, which
importing vLLM writes, is put back as it was.

Example::

    from lightning_hybrid_rollout.rollout.vllm.config import engine_config_from_rollout, engine_kwargs_for

    check_engine_args(engine_kwargs_for(engine_config_from_rollout(cfg.rollout, run_dir), on_cuda=False))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import EngineArgsError

__all__ = ["check_engine_args", "one_line_error"]

logger = logging.getLogger(__name__)


def one_line_error(err: BaseException) -> str:
    """vLLM's message of ``err`` on one line (a pydantic validation error as ``Config.field: message (got value)``)."""
    items = None
    if type(err).__name__ == "ValidationError" and callable(getattr(err, "errors", None)):
        with contextlib.suppress(Exception):
            items = err.errors()  # type: ignore[attr-defined]
    if items:
        title = str(getattr(err, "title", "") or "")
        parts = []
        for item in items:
            loc = ".".join(str(x) for x in item.get("loc", ()))
            where = ".".join(x for x in (title, loc) if x)
            value = item.get("input")
            got = f" (got {value!r})" if loc and isinstance(value, str | int | float | bool | type(None)) else ""
            parts.append(f"{where}: {item.get('msg', '')}{got}" if where else f"{item.get('msg', '')}{got}")
        return "; ".join(parts)
    lines = (ln.strip() for ln in (str(err) or type(err).__name__).splitlines())
    text = " ".join(ln for ln in lines if ln and not ln.startswith("For further information visit"))
    return f"{type(err).__name__}: {text}" if isinstance(err, TypeError | AssertionError | KeyError) else text


@contextlib.contextmanager
def _environ_restored() -> Iterator[None]:
    """Undo what the block changes in ``os.environ`` (vLLM's platform setup writes to it)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        after = dict(os.environ)
        for key in after.keys() - before.keys():
            del os.environ[key]
        for key, value in before.items():
            if after.get(key) != value:
                os.environ[key] = value


def _is_local_model(model: Any) -> bool:
    return isinstance(model, str | os.PathLike) and (Path(model) / "config.json").is_file()


def check_engine_args(
    kwargs: Mapping[str, Any], *, where: str = "rollout.engine_kwargs", create_config: bool | None = None
) -> None:
    """Validate vLLM engine arguments with vLLM's own code, starting nothing.

    Args:
        kwargs: ``AsyncEngineArgs`` keyword arguments, normally :func:`~.config.engine_kwargs_for` of the replicas'
            engine config.
        where: The config key named in the messages.
        create_config: Also run ``create_engine_config()`` (step 3 of the module doc). ``None``: when ``model`` is
            a local directory with a ``config.json``; a hub id or a model still to be built is not read (steps 1
            and 2 run with a stand-in for it).

    Raises:
        EngineArgsError: an unknown key (with the closest valid name), or a value vLLM refuses (its message).
    """
    with _environ_restored():  # importing vLLM and its platform setup both write to os.environ
        _check(kwargs, where, create_config)


def _check(kwargs: Mapping[str, Any], where: str, create_config: bool | None) -> None:
    t0 = time.perf_counter()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.version import __version__ as vllm_version

    valid = [f.name for f in dataclasses.fields(AsyncEngineArgs)]
    for key in kwargs:
        if key not in valid:
            hint = did_you_mean(key, valid)
            raise EngineArgsError(
                f"{where}: vLLM {vllm_version} has no engine argument {key!r}.{hint} Valid names are the fields of "
                f"vllm.AsyncEngineArgs (`vllm serve --help` shows them with dashes)."
            )
    local = _is_local_model(kwargs.get("model"))
    try:
        if local or "model" not in kwargs:
            args = AsyncEngineArgs(**kwargs)
        else:  # not built yet, or a hub id: with HF_HUB_OFFLINE vLLM would resolve it now; check the rest only
            with tempfile.TemporaryDirectory() as stand_in:
                args = AsyncEngineArgs(**{**kwargs, "model": stand_in})
    except Exception as err:
        raise EngineArgsError(f"{where}: vLLM refused the engine arguments: {one_line_error(err)}") from err
    if create_config is None:
        create_config = local
    elif create_config and not local:
        raise EngineArgsError(
            f"{where}: cannot check the engine arguments against the model {kwargs.get('model')!r}: it is not a "
            f"local directory with a config.json (build or download it first, or pass create_config=False)."
        )
    if create_config:
        t1 = time.perf_counter()
        try:
            args.create_engine_config()
        except Exception as err:
            raise EngineArgsError(f"{where}: vLLM refused the engine arguments: {one_line_error(err)}") from err
        logger.debug("create_engine_config passed in %.2f s", time.perf_counter() - t1)
    logger.debug("engine arguments checked in %.1f s (including the vLLM import)", time.perf_counter() - t0)
