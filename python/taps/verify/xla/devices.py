"""Simulated CPU devices for JAX: XLA's host platform makes as many as ``XLA_FLAGS`` asks for,
read once, when JAX starts its backends. So the count is set before that, and checked after."""

from __future__ import annotations

import os
import re
from typing import Any

from taps._support.extras import require
from taps.errors import VerifyError

_FLAG = "--xla_force_host_platform_device_count"


def simulate_cpu_devices(n: int) -> None:
    """Ask XLA for at least ``n`` host devices, unless JAX's backends already started (then
    :func:`jax_with_devices` says what to do). An existing larger count is kept."""
    import sys

    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return
    flags = os.environ.get("XLA_FLAGS", "")
    found = re.search(rf"{_FLAG}=(\d+)", flags)
    if found and int(found.group(1)) >= n:
        return
    flags = re.sub(rf"\s*{_FLAG}=\d+", "", flags)
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={n}".strip()


def have_devices(n: int) -> bool:
    """Whether JAX has (or, not started yet, will have) ``n`` devices."""
    simulate_cpu_devices(n)
    return bool(require("jax", "jax", "verifying a plan on XLA").device_count() >= n)


def jax_with_devices(n: int) -> Any:
    """``jax`` with at least ``n`` devices (simulated on CPU if need be), or a
    :class:`VerifyError` that says how to get them."""
    simulate_cpu_devices(n)
    jax = require("jax", "jax", "verifying a plan on XLA")
    have = jax.device_count()
    if have < n:
        raise VerifyError(
            f"the plan needs {n} devices and JAX started with {have}: set "
            f"XLA_FLAGS={_FLAG}={n} before JAX starts (or verify in a fresh process)"
        )
    return jax
