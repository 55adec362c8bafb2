"""A few gloo ranks on this machine: one fresh Python process (``python -m
taps.verify.torch.ranks MAIN DIR RANKS``) imports torch, the caller's module ``MAIN`` and the
pickled payload in ``DIR`` once (the model's library with it), lets ``MAIN.prepare`` do what every
rank shares (the numerics export the model there), then forks one process per rank, each running
``MAIN.run_rank(rank, ranks, state)``.

Start-up is most of a gloo run's time: a fresh interpreter per rank imports torch and the model's
library (transformers pulls in torchvision and dynamo) and exports the model once per rank. One
interpreter forked after the imports pays for them once. The fork comes before any process group
exists and after torch is held to one thread (the ranks share this machine's cores, and a forked
child must not inherit a started OpenMP pool).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import re
import signal
import subprocess
import sys
import traceback

from taps.errors import VerifyError


def run_ranks(main: str, tmp: str, ranks: int) -> None:
    """Run ``main``'s ``run_rank`` on ``ranks`` gloo processes (module doc), the payload in
    ``tmp/payload.pkl``, and wait for them all; a rank that fails raises a VerifyError with the
    last line it printed."""
    for attempt in (1, 2):
        failure = _run_once(main, tmp, ranks)
        if failure is None:
            return
        # torch sometimes aborts a forked rank as its autograd engine starts a thread (an
        # internal assert, "Invalid thread pool!", from set_num_threads in Engine::thread_init:
        # about one run in ten at load 3, whatever the model). The run is deterministic, so it
        # is made once more; a second abort is reported.
        if attempt == 2 or " was killed by SIGABRT" not in failure:
            break
    raise VerifyError(f"a gloo rank failed: {failure}")


def _run_once(main: str, tmp: str, ranks: int) -> str | None:
    """One run of the ranks from a clean directory: None, or the failing rank's line."""
    left = (where(tmp, r) for r in range(ranks) for where in (_said, _stderr))
    for path in (os.path.join(tmp, "store"), *left):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    # The module's class must import in the child as it does here.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, "-m", __name__, main, tmp, str(ranks)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if not proc.returncode:
        return None
    said = [_read(_said(tmp, r)).strip() for r in range(ranks)]
    # A rank that fails closes its connections, so the others fail after it on a closed peer:
    # the cause is what the first rank to fail of its own said.
    causes = [s for s in said if s and not _PEER_GONE.search(s)]
    lines = causes or [s for s in said if s] or [*proc.stderr.strip().splitlines()[-1:]]
    tail = lines[0] if lines else "no output"
    return tail.removeprefix("taps.errors.")


#: What gloo says on a rank whose peer went away (a consequence, not a cause).
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|remote worker crash")


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def _said(tmp: str, rank: int) -> str:
    """Where ``rank`` writes the one line of its failure."""
    return os.path.join(tmp, f"rank{rank}.error")


def _stderr(tmp: str, rank: int) -> str:
    return os.path.join(tmp, f"rank{rank}.stderr")


def _fork_ranks(main: str, tmp: str, ranks: int) -> int:
    """The forking process: the shared state made once, one child per rank; 1 when a rank
    failed."""
    import torch

    from taps.verify.torch.values import replaying

    torch.set_num_threads(1)
    module = importlib.import_module(main)
    with open(os.path.join(tmp, "payload.pkl"), "rb") as f, replaying():
        payload = pickle.load(f)
        prepare = getattr(module, "prepare", None)
        state = prepare(payload) if prepare is not None else payload
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 0
            # torch rebuilds its thread pool on first use after a fork; two threads doing it at
            # once (the autograd engine's, at the first backward) fail an assert. Here, alone.
            torch.set_num_threads(1)
            # Each rank's own stderr, for the last words of one a signal kills.
            said = os.open(_stderr(tmp, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(said, 2)
            try:
                with replaying():
                    module.run_rank(rank, ranks, state)
                    _leave_together()
            except BaseException as e:  # said to the caller in one line, by file
                with open(_said(tmp, rank), "w") as out:
                    out.write(traceback.format_exception_only(e)[-1])
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    # A rank that ended cleanly passed the final barrier, which it passes only once every rank
    # has reached it: every rank's work was done. A rank killed after that (gloo aborts a
    # process whose peer closes a connection under it) lost nothing.
    done = 0 in codes
    for rank, code in enumerate(codes):
        if code < 0 and not done:  # killed by a signal: it wrote nothing, so say it here
            last = _read(_stderr(tmp, rank)).strip().splitlines()[-1:]
            words = f" ({last[0].strip()})" if last else ""
            with open(_said(tmp, rank), "w") as out:
                out.write(
                    f"rank {rank} of {ranks} was killed by {signal.Signals(-code).name}{words}"
                )
    failed = any(code > 0 for code in codes) or (not done and any(codes))
    return 1 if failed else 0


def _leave_together() -> None:
    """Wait until every rank is done, then leave without tearing the process group down.

    A rank that closes its connections while another still runs a collective (or is still
    waiting to tear its own group down) makes gloo fail there: "Connection closed by peer" in
    the collective, or ``std::terminate`` from the connection's destructor (SIGABRT). After the
    barrier no collective is pending anywhere, and the process exits at once (``os._exit``)
    without running those destructors."""
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.barrier()


if __name__ == "__main__":
    sys.exit(_fork_ranks(sys.argv[1], sys.argv[2], int(sys.argv[3])))
