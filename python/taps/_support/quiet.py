"""The command line's stderr while a command works: the log lines, warnings and tracebacks that
torch, jax, XLA and gloo print (Python's logging and warnings, and C++ logs written straight to
file descriptor 2) are dropped unless the user asks for them (``-v``); taps' own lines still
reach the terminal through :func:`note` and the error line printed after the command."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO

# Where taps' own lines go while the real stderr is hidden (None: not hidden).
_kept: TextIO | None = None


@contextlib.contextmanager
def hidden_stderr(hide: bool = True) -> Iterator[None]:
    """Send file descriptor 2 to the null device while the block runs (if ``hide``), then put it
    back; what taps itself says meanwhile goes through :func:`note`."""
    global _kept
    if not hide or _kept is not None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        _kept = os.fdopen(os.dup(saved), "w", encoding="utf-8", errors="replace")
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
        if _kept is not None:
            _kept.close()
        _kept = None


def note(text: str) -> None:
    """Write one line of taps' own to the user's stderr, hidden or not. (A ``sys.stderr`` that
    does not write to descriptor 2, such as a test's capture, is the user's stderr already.)"""
    try:
        on_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        on_fd2 = False
    stream = _kept if _kept is not None and on_fd2 else sys.stderr
    stream.write(text + "\n")
    stream.flush()
