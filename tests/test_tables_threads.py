"""The cost tables' two threads (``taps.search.tables._alongside``): the memo's jobs run in the
order handed in, a wait returns once every job touching its matrices has run, and an error on
either thread stops both and is raised on the caller's, leaving no thread behind."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import taps
from taps.search import tables


def test_jobs_run_in_order_on_the_calling_thread_and_waits_see_them():
    """Each wait returns only once the jobs touching its arrays have run (a plain record of the
    jobs run, read on the other thread), and the jobs all run on the caller's thread."""
    a, b, c = np.zeros(1), np.zeros(1), np.zeros(1)
    ran: list[tuple[str, int]] = []
    caller = threading.get_ident()

    def job(name: str, seconds: float) -> Any:
        def run() -> None:
            time.sleep(seconds)  # later jobs would overtake it if it ran apart
            ran.append((name, threading.get_ident()))

        return run

    seen = []

    def work(jobs: tables._Jobs) -> str:
        jobs.put(job("a", 0.05), [a])
        jobs.put(job("b", 0.0), [b, a])
        jobs.put(job("c", 0.05), [c])
        jobs.wait([a])
        seen.append([name for name, _ in ran])
        jobs.wait([c])
        seen.append([name for name, _ in ran])
        return "done"

    assert tables._alongside(work) == "done"
    assert [name for name, _ in ran] == ["a", "b", "c"]
    assert {ident for _, ident in ran} == {caller}
    assert seen[0][:2] == ["a", "b"]  # b reads a: a wait for a waits for b too
    assert seen[1] == ["a", "b", "c"]


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "taps-tables"}


def test_an_error_on_the_other_thread_drops_the_jobs_and_is_raised_here():
    ran = []

    def work(jobs: tables._Jobs) -> None:
        def until_stopped() -> None:
            end = time.monotonic() + 5
            while not jobs._stopped and time.monotonic() < end:
                time.sleep(0.001)

        jobs.put(until_stopped, [])
        jobs.put(lambda: ran.append(1), [])
        raise ValueError("laid out wrong")

    with pytest.raises(ValueError, match="laid out wrong"):
        tables._alongside(work)
    assert ran == []  # dropped: handed in, not run once the error stopped the jobs
    assert not _threads()


def test_an_error_in_a_job_stops_the_other_thread_and_is_raised_here():
    handed = []

    def fail() -> None:
        raise KeyboardInterrupt

    def work(jobs: tables._Jobs) -> None:
        jobs.put(fail, [])
        while True:  # lays out until stopped: put raises once the job has failed
            handed.append(1)
            jobs.put(lambda: None, [])
            time.sleep(0.001)

    with pytest.raises(KeyboardInterrupt):
        tables._alongside(work)
    assert not _threads()
    assert handed


def test_a_kernel_error_while_the_search_prices_its_edges_is_raised(monkeypatch):
    """A failing kernel call (the second) stops the tables: no call after it, the error raised
    by the search, no thread left."""
    calls = []
    kernel = tables.redistribution_costs

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise taps.TimeLimitError("the time limit ran out")
        return kernel(*args, **kwargs)

    monkeypatch.setattr(tables, "redistribution_costs", failing)
    with pytest.raises(taps.TimeLimitError):
        taps.search(taps.models.gpt(256, 4, 64, 4), taps.Cluster(2, 4))
    assert len(calls) == 2
    assert not _threads()


@pytest.mark.parametrize("step", ["training", "forward"])
def test_tables_priced_alongside_are_those_priced_in_turn(monkeypatch, step):
    """The search's tables with their matrices filled by the other thread equal, bit for bit,
    those filled as each is handed in."""
    graph, cluster = taps.models.gpt(256, 4, 64, 4), taps.Cluster(2, 4)
    pricing = taps.Pricing(step=step)
    threaded = tables.build_tables(graph, cluster, pricing)
    monkeypatch.setattr(tables, "_alongside", lambda work: work(tables._Jobs()))
    in_turn = tables.build_tables(graph, cluster, pricing)
    assert len(threaded.edges) == len(in_turn.edges)
    for a, b in zip(threaded.edges, in_turn.edges, strict=True):
        assert a.cost.tobytes() == b.cost.tobytes()
        assert (a.source_class == b.source_class).all()
        assert (a.target_class == b.target_class).all()
