"""Ctrl-C: a real SIGINT stops a SCIP solve at once (exit 130, one line, no output file), an
interrupted ``taps reproduce`` leaves the old files, and the moment the files are moved into place
is not cut in half."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import taps
import taps.reproduce
from taps._support.outputs import Outputs, _deferred_interrupt
from taps.cli import main
from taps.reproduce import FILES


# SCIP needs long for this one: four distinct stacked GPT-3 layers on 64 devices under a memory
# limit halfway between the least memory and the unconstrained optimum's, searched untied: the
# price on memory leaves SCIP a core of 38 operators that takes it tens of seconds.
def _long_solve(tmp_path) -> list[str]:
    graph = tmp_path / "gpt4.json"
    graph.write_text(taps.models.gpt(12288, 96, 2048, 16, blocks=4).to_json(), encoding="utf-8")
    return [
        "search",
        str(graph),
        "--nodes",
        "8",
        "--devices-per-node",
        "8",
        "--memory",
        "6.72GB",
    ]


SCRIPT = textwrap.dedent(
    """
    import signal, sys
    # What an interactive shell gives a command (a test runner may start us with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import taps.solve.ilp
    solve = taps.solve.ilp._optimize
    def announced(model):
        print("SOLVING", flush=True)
        solve(model)
    taps.solve.ilp._optimize = announced
    from taps.cli import run
    run()
    """
)


def _interrupted(script: str, args: list[str], marker: str, wait: float) -> tuple[str, str, float]:
    """Run ``script`` with ``args``, send SIGINT ``wait`` seconds after it prints ``marker``: its
    stdout and stderr after that, and how long it took to end (it must exit 130)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == marker + "\n"
        time.sleep(wait)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        elapsed = time.perf_counter() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130
    return out, err, elapsed


def test_sigint_stops_scip_within_a_second(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = [*_long_solve(tmp_path), "--json", str(out_dir / "result.json")]
    out, err, elapsed = _interrupted(SCRIPT, args, "SOLVING", 0.5)  # well inside SCIP
    assert err == "taps search: interrupted\n"
    assert out == ""
    assert elapsed < 1.5, f"SCIP took {elapsed:.2f} s to stop"
    assert list(out_dir.iterdir()) == []


KERNEL_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import taps.search.tables
    kernel = taps.search.tables.redistribution_costs
    def announced(*args):
        print("PRICING", flush=True)
        return kernel(*args)
    taps.search.tables.redistribution_costs = announced
    from taps.cli import run
    run()
    """
)


def test_sigint_stops_the_optimal_planners_kernel_within_a_second(tmp_path):
    """The optimal planner's cost tables for a GPT-3 layer on 1,024 devices take about a minute
    here (so a faster machine is still inside them after 2 s), in calls to the Rust kernel of
    seconds each; Ctrl-C inside one stops it."""
    graph = tmp_path / "gpt.json"
    graph.write_text(taps.models.gpt(12288, 96, 2048, 16).to_json(), encoding="utf-8")
    args = [
        "search",
        str(graph),
        "--nodes",
        "128",
        "--devices-per-node",
        "8",
        "--planner",
        "optimal",
    ]
    _, err, elapsed = _interrupted(KERNEL_SCRIPT, args, "PRICING", 2)  # well inside the tables
    assert err == "taps search: interrupted\n"
    assert elapsed < 1.5, f"the kernel took {elapsed:.2f} s to stop"


def test_interrupted_reproduce_leaves_the_old_files(tmp_path, capsys, monkeypatch):
    for name in FILES:
        (tmp_path / name).write_text("old")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(taps.reproduce, "run", interrupted)
    assert main(["reproduce", "--quick", "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "taps reproduce: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    assert all((tmp_path / name).read_text() == "old" for name in FILES)


def test_reproduce_failing_late_writes_none_of_its_files(tmp_path, capsys, monkeypatch):
    (tmp_path / "results.csv").write_text("old")

    def failing(rows, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(taps.reproduce, "plot_ratio", failing)
    assert main(["reproduce", "--quick", "--out", str(tmp_path)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]
    assert (tmp_path / "results.csv").read_text() == "old"


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_ctrl_c_waits_until_every_file_is_in_place(tmp_path):
    with Outputs(tmp_path / "a.json", tmp_path / "b.png") as outputs:
        for f in outputs.files:
            f.write_text("new")
        with pytest.raises(KeyboardInterrupt), _deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the signal is handled by now, and held back
            outputs.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.png"]
    assert (tmp_path / "b.png").read_text() == "new"
