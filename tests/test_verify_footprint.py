"""``taps verify``'s engines estimated before they start (taps.verify.footprint, issue 25): the
XLA replay's estimate against the peak a fresh process measures, and every refusal one line
before JAX starts: more devices than XLA's CPU backend runs, more memory than the process may
use (an address-space cap), a redistribution too large; the gloo ranks' estimate likewise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import taps
from taps._support import limits
from taps.errors import ResourceError
from taps.verify import footprint

PYTHON = Path(__file__).resolve().parent.parent / "python"


def _fresh(code: str) -> list[int]:
    """Run ``code`` in a fresh interpreter; what it prints as JSON."""
    env = {**os.environ, "PYTHONPATH": str(PYTHON)}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def _capped(argv: list[str], cap: int) -> subprocess.CompletedProcess[str]:
    """``taps argv`` with its address space capped at ``cap`` bytes (set by the child itself: a
    ``preexec_fn`` would fork this process, whose JAX runs threads)."""
    code = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
        "from taps.cli import run; run()"
    )
    env = {**os.environ, "PYTHONPATH": str(PYTHON)}
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    "graph",
    [
        "taps.models.mlp(batch=256)",
        "taps.models.gpt(256, 4, 128, 4, blocks=2)",
    ],
)
def test_the_xla_estimate_is_within_a_factor_of_the_measured_peak(graph):
    estimate, peak = _fresh(
        f"""
        import json
        from taps.verify.xla.devices import simulate_cpu_devices
        simulate_cpu_devices(8)
        import taps
        from taps.verify import footprint
        plan = taps.search({graph}, taps.Cluster(2, 4)).plan
        estimate = footprint.xla_bytes(
            8, footprint.dense_bytes(plan, "float32"), footprint.spread_bytes(plan, "float32")
        )
        assert taps.verify(plan).ok
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would be the parent's.
        with open("/proc/self/status") as f:
            peak = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) * 1024
        print(json.dumps([estimate, peak]))
        """
    )
    # High, so that a run it lets through fits; within 2x, so that it refuses little that would.
    assert peak <= estimate <= 2 * peak


def test_more_devices_than_xla_runs_is_one_line():
    out = _capped(["verify", "mlp", "--nodes", "512", "--devices-per-node", "8"], 2**40)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "taps verify: error: the plan has 4,096 devices and XLA's CPU backend runs at most 2,048 "
        "in one program; verify it on fewer nodes"
    ]


def test_a_replay_over_the_address_space_cap_is_refused_before_jax_starts():
    plan = taps.search(taps.models.mlp(), taps.Cluster(8, 8)).plan
    need = footprint.xla_bytes(
        64, footprint.dense_bytes(plan, "float32"), footprint.spread_bytes(plan, "float32")
    )
    cap = 3 * 2**30
    assert need > cap
    out = _capped(["verify", "mlp", "--nodes", "8", "--devices-per-node", "8"], cap)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("taps verify: error: replaying the plan on 64 XLA devices would need")
    assert "available" in line


def test_a_redistribution_too_large_for_memory_is_refused():
    whole = taps.Layout([2**17, 2**16], [2, 2], [-1, -1])
    split = taps.Layout([2**17, 2**16], [2, 2], [1, 0])
    # 32 GiB dense, and four copies of it on the devices: more than this machine may give.
    with pytest.raises(ResourceError, match=r"would need about .* GiB"):
        taps.verify.verify_redistribution(whole, split)


def test_the_gloo_ranks_are_estimated_before_they_start(monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from torch_models import llama

    module, ids = llama()
    plan = taps.search(taps.from_torch(module, ids), taps.Cluster(1, 4)).plan
    need = footprint.gloo_bytes(plan, 4, "float32")
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: need - 1)
    with pytest.raises(ResourceError, match=r"the numbers on 4 gloo ranks would need about"):
        taps.verify.verify_torch(module, [ids], plan)
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: need)
    assert taps.verify.verify_torch(module, [ids], plan).ok


def test_verify_with_gspmd_counts_both_programs_before_the_first():
    # Under 4 GiB of address space the replay alone fits (its estimate, 2.0 GiB, passes) but
    # XLA's own partitioning after it does not: it ran 20 s and ended "out of memory" (peak 2.4
    # GiB resident, 4.5 GiB of address space). Both programs are now estimated before either.
    out = _capped(
        ["verify", "mlp", "--gspmd", "--nodes", "1", "--devices-per-node", "8"], 4 * 2**30
    )
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("taps verify: error: replaying the plan on 8 XLA devices would need")
