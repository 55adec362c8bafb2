"""The peak resident memory of one piece of work, run in a fresh interpreter (optionally with
the taps package of another git revision, to measure today's code against it in the same run)."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import taps


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
    work: Callable[..., Any],
    *args: Any,
    memory_limit: int | None = None,
    package: Path | None = None,
) -> tuple[Any, float]:
    """``work(*args)`` in a spawned interpreter (its address space capped at ``memory_limit``
    bytes if given; importing taps from ``package``, a directory holding one, if given): its
    result and that process's peak (MiB). A worker that dies (out of memory) raises
    ``BrokenProcessPool`` instead of hanging."""
    context = multiprocessing.get_context("spawn")
    # A spawned interpreter starts with this one's sys.path, and imports the script (and so
    # taps) before it runs anything: the package goes first on the path while it starts.
    path = list(sys.path)
    if package is not None:
        sys.path.insert(0, str(package))
    try:
        with ProcessPoolExecutor(
            1, mp_context=context, initializer=_limited, initargs=(memory_limit,)
        ) as pool:
            future = pool.submit(_run_and_measure, work, args)
            sys.path[:] = path
            return future.result()
    finally:
        sys.path[:] = path


@contextlib.contextmanager
def package_at(revision: str) -> Iterator[Path]:
    """A directory holding the Python package taps as it is at git ``revision`` (with today's
    compiled core, whose interface the Python code must match), for :func:`in_fresh_process`."""
    here = Path(taps.__file__).parent

    def git(where: Path, *args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=where, check=True, capture_output=True).stdout

    # Run from a subdirectory, git archives only that subdirectory: run it from the top.
    top = Path(git(here, "rev-parse", "--show-toplevel").decode().strip())
    inside = here.relative_to(top).as_posix()
    archive = git(top, "archive", "--prefix=taps/", f"{revision}:{inside}")
    with tempfile.TemporaryDirectory(prefix="taps-at-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        package = Path(tmp)
        for core in here.glob("_core*.so"):
            shutil.copy(core, package / "taps" / core.name)
        yield package
