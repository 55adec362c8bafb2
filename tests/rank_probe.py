"""A ``MAIN`` for :func:`taps.verify.torch.ranks.run_ranks` in the tests: ``prepare`` counts its
calls in the run's directory, each rank writes its rank and the process it ran in, and the
payload may ask a rank to fail."""

from __future__ import annotations

import os
from typing import Any


def prepare(payload: tuple[str, int]) -> tuple[str, int, int]:
    tmp, failing = payload
    with open(os.path.join(tmp, "prepared"), "a") as f:
        f.write("once\n")
    return tmp, failing, os.getpid()


def run_rank(rank: int, ranks: int, state: tuple[str, int, int]) -> Any:
    tmp, failing, parent = state
    if rank == failing:
        raise ValueError(f"rank {rank} of {ranks} was asked to fail")
    with open(os.path.join(tmp, f"ran{rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()} {parent}")
