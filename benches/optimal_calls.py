"""The optimal planner's kernel calls of one search, recorded and replayed on their own.

``record CASE FILE``: one optimal search of ``CASE`` (as ``benches/optimal_rounds.py`` names
them: ``gpt3``, a model family, or the start of a paper timing case's label) after a default one,
with every call of ``redistribution_table_bounds`` (the bounded tables),
``redistribution_pair_bounds`` (the full bounds of the rounds, ``tight``) and
``redistribution_pair_estimates`` (the rounds' pairs) pickled into ``FILE``.
``replay FILE bounds|tight|pairs [PASSES]``: those
calls made again in this process, ``PASSES`` times (each pass's ``dtype_bytes`` times
``1 + pass * 2^-40`` so that the planner's memos start empty; 0 passes: the loading alone, to
subtract), then their CPU seconds and a digest of the first pass's results (equal across builds
that price alike). Instructions, one thread::

    .venv/bin/python benches/optimal_calls.py record "AlexNet, 64 " /tmp/a64.pkl
    RAYON_NUM_THREADS=1 PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no \\
        .venv/bin/python benches/optimal_calls.py replay /tmp/a64.pkl bounds 1
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import time
import warnings
from typing import Any

import numpy as np

import taps
import taps._core as core
import taps.search.tables as tables
from optimal_rounds import case

#: The kernels recorded, by what ``replay`` calls their calls.
KERNELS = (
    ("pairs", "redistribution_pair_estimates"),
    ("bounds", "redistribution_table_bounds"),
    ("tight", "redistribution_pair_bounds"),
)


def record(name: str, path: str) -> None:
    graph, cluster = case(name)
    taps.search(graph, cluster)
    calls: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
        which: [] for which, _ in KERNELS
    }
    for which, attr in KERNELS:
        kernel = getattr(tables, attr)

        def kept(*a: Any, _kernel: Any = kernel, _into: list = calls[which], **k: Any) -> Any:
            # The time limit is the recording search's, not the replay's.
            _into.append((a, {x: y for x, y in k.items() if x != "time_limit"}))
            return _kernel(*a, **k)

        setattr(tables, attr, kept)
    result = taps.search(graph, cluster, taps.Pricing(planner="optimal"))
    with open(path, "wb") as f:
        pickle.dump(calls, f)
    print(
        f"{name}: cost {result.cost!r}, {len(calls['bounds'])} bound calls, "
        f"{len(calls['tight'])} full-bound calls, {len(calls['pairs'])} pair calls -> {path}"
    )


def replay(path: str, which: str, passes: int) -> None:
    with open(path, "rb") as f:
        calls = pickle.load(f)[which]
    # Where the bytes per element are among the positional arguments.
    at = 3 if which == "bounds" else 2
    kernel = getattr(core, dict(KERNELS)[which])
    digest = hashlib.sha256()
    t = time.process_time()
    for n in range(passes):
        for args, kwargs in calls:
            a = list(args)
            a[at] = _fresh(a[at], n)
            out = kernel(*a, **kwargs)
            out = out if isinstance(out, tuple) else (out,)
            if n == 0:
                for part in out:
                    digest.update(np.asarray(part).tobytes())
    print(
        f"{which}: {len(calls)} calls x {passes}, {time.process_time() - t:.3f} s CPU, "
        f"digest {digest.hexdigest()[:12]}"
    )


def _fresh(dtype: Any, n: int) -> Any:
    """``dtype`` (bytes per element: one or a list) made unlike earlier passes' (a memo miss),
    the first pass's as recorded."""
    scale = 1 + n * 2**-40
    return [d * scale for d in dtype] if isinstance(dtype, list) else dtype * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("case")
    rec.add_argument("file")
    rep = sub.add_parser("replay")
    rep.add_argument("file")
    rep.add_argument("which", choices=[which for which, _ in KERNELS])
    rep.add_argument("passes", type=int, nargs="?", default=1)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.verb == "record":
        record(args.case, args.file)
    else:
        replay(args.file, args.which, args.passes)


if __name__ == "__main__":
    main()
