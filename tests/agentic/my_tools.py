"""Tools loaded by file path in tests/agentic/test_tools.py."""

from __future__ import annotations

import asyncio
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


async def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: The key.
    """
    await asyncio.sleep(0)
    return {"key": key, "value": len(key)}


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "done"


async def slow_async(seconds: float) -> str:
    """Sleep on the loop, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "done"


def broken(x: int) -> int:
    """Always fail.

    Args:
        x: Ignored.
    """
    raise RuntimeError("the database is down")


def undocumented(x: int) -> int:
    return x


def untyped(x):
    """No type hint.

    Args:
        x: Anything.
    """
    return x
