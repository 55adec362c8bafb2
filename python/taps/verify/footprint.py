"""What running a plan on an engine takes, estimated before it runs (docs/errors.md): the
memory of XLA's replay of every simulated device in this one process, the threads and address
space its devices need, and the memory of the torch engine's gloo ranks. A run that would not fit
is refused with :class:`~taps.errors.ResourceError` and the estimate in one line, instead of
growing until the kernel kills it or aborting inside XLA.

The estimates are linear in what a plan makes an engine hold, each coefficient calibrated on the
high side against the peak resident memory measured in a fresh process (the numbers are in
docs/errors.md): the dense tensors (``dense``: every tensor of the graph whole, at the run's
element size; the unsharded reference and its gradients hold them) and the devices' blocks
(``spread``: each tensor's largest block over every device, replicated copies included).
"""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Sequence

from taps._core import Layout
from taps._support.limits import check_memory
from taps.errors import ResourceError, VerifyError
from taps.plan.plan import Plan
from taps.verify.result import check_dtype

#: The most devices XLA's CPU backend runs in one program (more: "Multiprocess computations
#: aren't implemented on the CPU backend").
XLA_MAX_DEVICES = 2048
#: XLA's replay: a fixed part (JAX, XLA and the compiler), bytes per dense byte and per byte of
#: the devices' blocks, and bytes per device (its runtime and buffers).
XLA_BASE = 640 * 2**20
XLA_PER_DENSE = 2.5
XLA_PER_SPREAD = 3.2
XLA_PER_DEVICE = 6 * 2**20
#: Threads XLA's CPU client starts: one per device, a pool of up to 256, and the process's own.
XLA_POOL = 256
THREADS_BASE = 64
#: The torch engine's gloo ranks: torch itself once (the ranks are forked from one process and
#: share its pages), and per rank its own runtime and bytes per dense byte (the dense module, its
#: gradients and the rank's own blocks).
GLOO_BASE = 2**30
GLOO_PER_RANK = 192 * 2**20
GLOO_PER_DENSE = 2

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def dense_bytes(plan: Plan, dtype: str) -> int:
    """Every tensor of ``plan``'s graph whole, at ``dtype``'s element size."""
    check_dtype(dtype)
    return _ITEMSIZE[dtype] * sum(math.prod(t.shape) for t in plan.graph.tensors.values())


def spread_bytes(plan: Plan, dtype: str) -> int:
    """Every device's block of every tensor, at ``dtype``'s element size: each tensor counted at
    the largest block any of its layouts in ``plan`` gives a device."""
    block: dict[str, int] = {}
    candidates = plan.candidates
    for op in plan.graph.ops:
        chosen = candidates[op.name]
        for x, layout in zip([*op.inputs, op.output], [*chosen.inputs, chosen.output]):
            block[x.tensor] = max(block.get(x.tensor, 0), math.prod(layout.shard_shape))
    return _ITEMSIZE[dtype] * plan.cluster.num_devices * sum(block.values())


def xla_bytes(devices: int, dense: int, spread: int) -> int:
    """The peak memory of XLA's replay on ``devices`` simulated devices of tensors of ``dense``
    bytes whole and ``spread`` bytes over the devices' blocks, estimated high."""
    return round(
        XLA_BASE + XLA_PER_DENSE * dense + XLA_PER_SPREAD * spread + XLA_PER_DEVICE * devices
    )


def gloo_bytes(plan: Plan, ranks: int, dtype: str) -> int:
    """The peak memory of the torch engine's ``ranks`` gloo ranks on ``plan``'s graph."""
    return GLOO_BASE + ranks * (GLOO_PER_RANK + GLOO_PER_DENSE * dense_bytes(plan, dtype))


def check_xla(plan: Plan, dtype: str, programs: int = 1) -> None:
    """Refuse, before JAX starts its devices, a replay of ``plan`` (:func:`taps.verify`) that XLA
    cannot run here (:func:`check_xla_run`). ``programs``: how many programs of the plan's
    tensors run in turn in this process (2 for ``taps verify --gspmd``: the replay, then XLA's
    own partitioning, :func:`taps.verify.compare_gspmd`, holding as much again)."""
    check_xla_run(
        plan.cluster.num_devices,
        programs * dense_bytes(plan, dtype),
        programs * spread_bytes(plan, dtype),
    )


def check_xla_layouts(layouts: Sequence[Layout], dtype: str) -> None:
    """Refuse, before JAX starts its devices, a replay of tensors in ``layouts`` (one device
    count) that XLA cannot run here (:func:`check_xla_run`)."""
    check_dtype(dtype)
    size = _ITEMSIZE[dtype]
    check_xla_run(
        layouts[0].num_devices,
        size * sum(math.prod(x.shape) for x in layouts),
        size * layouts[0].num_devices * sum(math.prod(x.shard_shape) for x in layouts),
    )


def check_xla_run(devices: int, dense: int, spread: int) -> None:
    """Refuse a replay on ``devices`` simulated devices (``dense`` and ``spread`` as in
    :func:`xla_bytes`) with more devices than XLA's CPU backend takes, more threads than this
    process may start, or more memory than it may use."""
    if devices > XLA_MAX_DEVICES:
        raise VerifyError(
            f"the plan has {devices:,} devices and XLA's CPU backend runs at most "
            f"{XLA_MAX_DEVICES:,} in one program; verify it on fewer nodes"
        )
    if _xla_running(devices):
        # JAX, XLA and the devices' threads are running: already in what this process uses.
        need = xla_bytes(devices, dense, spread) - XLA_BASE
        _check(f"running the plan on {devices:,} XLA devices", need, 0)
        return
    threads = devices + min(devices, XLA_POOL) + THREADS_BASE
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and threads > soft:
        raise ResourceError(
            f"replaying the plan on {devices:,} XLA devices starts about {threads:,} threads, "
            f"more than the {soft:,} processes this user may run (ulimit -u)"
        )
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stacks = threads * (8 * 2**20 if stack == resource.RLIM_INFINITY else stack)
    _check(
        f"replaying the plan on {devices:,} XLA devices",
        xla_bytes(devices, dense, spread),
        stacks,
    )


def _xla_running(devices: int) -> bool:
    """Whether this process's JAX has started its backends with at least ``devices`` devices:
    the plan runs here, on them (with fewer, :func:`taps.verify` starts a fresh process)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return (
        bool(xla_bridge.backends_are_initialized()) and sys.modules["jax"].device_count() >= devices
    )


def check_gloo(plan: Plan, ranks: int, dtype: str) -> None:
    """Refuse, before any rank starts, a numerics run of ``plan``'s graph on ``ranks`` gloo ranks
    that would not fit the memory this process may use."""
    _check(f"the numbers on {ranks} gloo ranks", gloo_bytes(plan, ranks, dtype), 0)


def _check(what: str, need: int, stacks: int) -> None:
    """``need`` bytes resident, and ``stacks`` more of address space only (threads' stacks are
    reserved, not used), against what this process may use."""
    check_memory(
        what,
        need,
        "verify on fewer devices or a smaller model (a smaller batch or fewer layers)",
        reserved=stacks,
    )
