"""A ``MAIN`` for :func:`taps.verify.torch.ranks.run_ranks` in the tests: ``prepare`` counts its
calls in the run's directory, each rank writes its rank and the process it ran in, and the
payload may ask a rank to fail (by raising, or killed by a signal) while the others fail as gloo
does on a closed peer, or to be killed once its work is done while the others end cleanly."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def prepare(payload: tuple[str, int, str]) -> tuple[str, int, str, int, int]:
    tmp, failing, how = payload
    with open(os.path.join(tmp, "prepared"), "a") as f:
        f.write("once\n")
    with open(os.path.join(tmp, "prepared")) as f:
        run = len(f.readlines())
    return tmp, failing, how, os.getpid(), run


def run_rank(rank: int, ranks: int, state: tuple[str, int, str, int, int]) -> Any:
    tmp, failing, how, parent, run = state
    if how == "abort once" and run > 1:
        failing = -1  # the second run goes through
    if rank == failing and how in ("abort", "abort once"):
        os.kill(os.getpid(), signal.SIGABRT)
    if rank == failing and how == "kill":
        print(f"rank {rank}: last words", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == failing and how == "raise":
        raise ValueError(f"rank {rank} of {ranks} was asked to fail")
    if failing >= 0 and rank != failing and how != "late":  # as gloo does on a closed peer
        raise RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:65242")
    with open(os.path.join(tmp, f"ran{rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()} {parent}")
    if rank == failing and how == "late":  # as gloo aborts a rank after the final barrier
        os.kill(os.getpid(), signal.SIGABRT)
