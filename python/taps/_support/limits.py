"""What a search will need, known before it runs: the number of candidate strategies of every
operator (counted, not enumerated) and the memory of the cost tables, so that a search too large
for the machine is refused up front with the estimate instead of being killed (docs/errors.md).
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Sequence

from taps.errors import ResourceError

#: The most candidate strategies the search takes for one operator (its tables, layouts and ILP
#: rows grow with them; the built-in models need at most a few thousand).
MAX_CANDIDATES = 1_000_000
#: Bytes per candidate strategy while the tables are built: the strategy, its rows of the degree
#: and device-map arrays, costs and memory, and the layout of each operand (measured: about 300
#: bytes per strategy for the enumeration alone, 1,840 to 1,880 of resident peak per strategy
#: for a whole search of one operator of 103,520 and 215,790 candidates; issue 25).
CANDIDATE_BYTES = 2048
#: Address space the core's threads map without filling: a malloc arena (64 MiB) and a stack
#: (2 MiB) each. Counted against an address-space limit only (measured: a search of one small
#: operator maps 196 MiB more than it started with on 4 threads, 394 MiB on 8).
THREAD_ADDRESS_BYTES = 66 * 2**20
#: Bytes per pair of strategies across an edge: an upper bound of the edge's cost matrix, which
#: has one float per pair of layout classes.
PAIR_BYTES = 8
#: The memory of the ILP SCIP solves: a fixed part (SCIP's own tables) and bytes per variable (a
#: selection binary or a flow, with its two nonzeros, SCIP's copies and PySCIPOpt's objects).
#: Measured on GPT blocks and AlexNet: 92 to 115 MiB at 24,000 variables, 181 MiB at 52,000,
#: 1,007 MiB at 350,000, 1,121 MiB at 390,000 (tests/test_memory_estimates.py); a fresh
#: environment measured 256 MiB at the same 52,000, so the bytes per variable err high.
ILP_BASE_BYTES = 64 * 2**20
ILP_VARIABLE_BYTES = 4_800
#: The optimal planner's own memory (``Pricing(planner="optimal")``): its searches' layouts, index
#: and heap, and its memo of paths. Measured as the resident peak of ``taps search gpt --planner
#: optimal`` over the paper planner's (GPT-3's layer, 2 threads): 20 MiB at 64 devices, 53 MiB at
#: 256, 44 MiB at 1,024, 320 MiB at 4,096, 381 MiB at 16,384 (1 thread: 36 and 299 MiB at 1,024
#: and 4,096). It grows with the device count (the layouts a search holds) up to its bounds: 2**21
#: layouts a search, about 222 MiB with their index and heap, per thread, and 2**18 paths
#: (about 256 MiB) in the memo. (A base of 32 MiB was 1 MiB under the measured at 256 devices.)
OPTIMAL_BASE_BYTES = 40 * 2**20
OPTIMAL_DEVICE_BYTES = 80 * 2**10
OPTIMAL_SEARCH_BYTES = 222 * 2**20
OPTIMAL_MEMO_BYTES = 256 * 2**20


def _twos(size: int) -> int:
    """How many times 2 divides ``size``."""
    return (size & -size).bit_length() - 1


def candidate_count(sizes: Sequence[int], num_devices: int, replicas: bool = False) -> int:
    """How many strategies ``enumerate_strategies(sizes, num_devices, replicas)`` returns, counted.

    A strategy splits some ``i`` of the axes by powers of two whose product is the device count
    ``2**n`` (a composition of ``n`` into ``i`` positive parts, each at most the power of two
    dividing its axis) and orders the ``i`` split axes on the device matrix (``i!`` orders). With
    every size divisible enough this is ``sum_i i! * C(p, i) * C(n - 1, i - 1)`` for ``p`` axes.
    With ``replicas``, each split over ``2**k < 2**n`` devices counts once more per place of the
    replica dim among its ``i`` split dims (``i + 1``).
    """
    n = num_devices.bit_length() - 1
    # ways[i][k]: unordered choices of i split axes whose exponents add up to k.
    ways = [[0] * (n + 1) for _ in range(len(sizes) + 1)]
    ways[0][0] = 1
    for axis, size in enumerate(sizes):
        most = min(_twos(size), n)
        for i in range(axis, -1, -1):
            for k in range(n, -1, -1):
                if ways[i][k]:
                    for e in range(1, min(most, n - k) + 1):
                        ways[i + 1][k + e] += ways[i][k]
    places = range(n) if replicas else range(0)
    return sum(
        math.factorial(i) * (ways[i][n] + sum((i + 1) * ways[i][k] for k in places))
        for i in range(len(sizes) + 1)
    )


def check_candidates(
    name: str, sizes: Sequence[int], num_devices: int, replicas: bool = False
) -> int:
    """The candidate count of operator ``name`` (partitionable axis ``sizes``), the replicated
    strategies included with ``replicas`` or where no split over every device exists (as
    :func:`taps.plan.candidates.strategies`); :class:`ResourceError` above
    :data:`MAX_CANDIDATES`."""
    count = candidate_count(sizes, num_devices, replicas) or candidate_count(
        sizes, num_devices, True
    )
    if count > MAX_CANDIDATES:
        raise ResourceError(
            f"operator {name!r}: {count:,} candidate strategies ({len(sizes)} partitionable axes "
            f"on {num_devices:,} devices, about {gib(count * CANDIDATE_BYTES)} of tables), more "
            f"than the {MAX_CANDIDATES:,} the search takes; make fewer axes partitionable or "
            "search fewer devices"
        )
    return count


def table_bytes(candidates: int, pairs: int) -> int:
    """An upper bound of the memory of cost tables over ``candidates`` strategies in all and
    ``pairs`` pairs of strategies across edges (the paper's |E_A|; counted once per direction
    priced: twice in the training step)."""
    return candidates * CANDIDATE_BYTES + pairs * PAIR_BYTES


def available_memory(reserved: int = 0) -> int | None:
    """Bytes of memory this process may still use: what the machine can still give (Linux's
    MemAvailable), less if its control group (a container) allows less or if its address-space
    limit (``ulimit -v``, RLIMIT_AS) leaves less room; None if unknown. ``reserved``: address
    space the work will map without filling (threads' stacks), taken from that room only."""
    room = _address_room()
    if room is not None:
        room = max(room - reserved, 0)
    known = [n for n in (_meminfo_available(), _cgroup_room(), room) if n is not None]
    if known:
        return min(known)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _address_room() -> int | None:
    """The address-space limit less the address space in use (VmSize), if there is a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (OSError, ValueError, IndexError):
        pass
    return soft


def _cgroup_room() -> int | None:
    """The control group's memory limit less its use (cgroup v2, else v1), if it has one."""
    for limit, used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit, encoding="ascii") as f:
                text = f.read().strip()
            if text == "max":
                return None
            with open(used, encoding="ascii") as f:
                return max(int(text) - int(f.read().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


def core_threads() -> int:
    """The threads of the core's pool (Rayon's: ``RAYON_NUM_THREADS``, else the CPUs this process
    may run on)."""
    try:
        return max(int(os.environ.get("RAYON_NUM_THREADS", "")), 1)
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def optimal_bytes(num_devices: int, threads: int) -> int:
    """An estimate, on the high side, of the optimal planner's own peak memory in a search on
    ``num_devices`` devices with ``threads`` threads of the core."""
    return min(
        OPTIMAL_BASE_BYTES + num_devices * OPTIMAL_DEVICE_BYTES,
        threads * OPTIMAL_SEARCH_BYTES + OPTIMAL_MEMO_BYTES,
    )


def check_table_memory(what: str, candidates: int, pairs: int, planner_bytes: int = 0) -> None:
    """Refuse, before any work, a search (``what``) whose tables, and ``planner_bytes`` of the
    optimal planner's own (:func:`optimal_bytes`), would not fit this machine's memory (with its
    threads' address space under an address-space limit)."""
    check_memory(
        f"the search of {what}",
        table_bytes(candidates, pairs) + planner_bytes,
        reserved=core_threads() * THREAD_ADDRESS_BYTES,
        detail=f" for its cost tables ({candidates:,} candidate strategies, {pairs:,} strategy "
        "pairs across edges and directions)"
        + (f" and the optimal planner's searches ({gib(planner_bytes)})" if planner_bytes else ""),
    )


def check_memory(
    what: str, need: int, advice: str = "", reserved: int = 0, detail: str = ""
) -> None:
    """Refuse, before it starts, work (``what``) that would need ``need`` bytes resident (for
    what ``detail`` says), and ``reserved`` more of address space only (threads' stacks), more
    than this process may use; the message ends with ``advice``, if any."""
    have = available_memory(reserved=reserved)
    if have is not None and need > have:
        raise ResourceError(
            f"{what} would need about {gib(need)}{detail}, more than the {gib(have)} available"
            + (f"; {advice}" if advice else "")
        )


def ilp_bytes(variables: int) -> int:
    """An estimate, on the high side, of SCIP's peak memory for an ILP of ``variables``."""
    return ILP_BASE_BYTES + variables * ILP_VARIABLE_BYTES


def check_ilp_memory(variables: int, constraints: int) -> None:
    """Refuse, before SCIP's model is built, an ILP of ``variables`` (selection binaries and
    flows) that would not fit the memory this process may use."""
    need = ilp_bytes(variables)
    have = available_memory()
    if have is not None and need > have:
        raise ResourceError(
            f"the ILP of {variables:,} variables and {constraints:,} constraints would need about "
            f"{gib(need)} in SCIP, more than the {gib(have)} available; search fewer devices "
            "or tie the repeated layers (Graph.tie)"
        )


def gib(n: float) -> str:
    """``n`` bytes in GiB, for messages."""
    return f"{n / 2**30:,.1f} GiB"
