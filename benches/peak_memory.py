"""The peak resident memory of one piece of work, run in a fresh interpreter."""

from __future__ import annotations

import multiprocessing
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any


def own_peak_mib() -> float:
    """This process's peak resident memory (MiB). Linux's ``ru_maxrss`` keeps the peak of the
    parent the interpreter was forked from, so the process's own map (``VmHWM``) is read where
    there is one."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_and_measure(work: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float]:
    out = work(*args)
    return out, own_peak_mib()


def _limited(limit: int | None) -> None:
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def in_fresh_process(
    work: Callable[..., Any], *args: Any, memory_limit: int | None = None
) -> tuple[Any, float]:
    """``work(*args)`` in a spawned interpreter (its address space capped at ``memory_limit``
    bytes if given): its result and that process's peak (MiB). A worker that dies (out of
    memory) raises ``BrokenProcessPool`` instead of hanging."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        1, mp_context=context, initializer=_limited, initargs=(memory_limit,)
    ) as pool:
        return pool.submit(_run_and_measure, work, args).result()
