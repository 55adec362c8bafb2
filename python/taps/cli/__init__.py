"""The ``taps`` command line (the parser and its commands: :mod:`taps.cli.parser`) and the one
rule for errors (docs/errors.md): bad input or a failed read or write is one line and exit code 2,
Ctrl-C one line and 130, SIGTERM one line and 143, anything else one line asking for a bug report
(``TAPS_DEBUG=1`` shows the traceback).

This module imports nothing heavy at its top: :func:`run` takes charge of the signals first, and
everything else (numpy, SCIP, rich, torch) is imported inside the handled block, so an interrupt
at any moment, import time included, ends the same way."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

#: Exit codes (docs/errors.md).
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, like Ctrl-C: every path that cleans up after an
    interrupt (temporary outputs, a SCIP solve, the Rust kernels' signal checks) cleans up after
    it too."""


#: Seconds between raising a stop again until the command has taken it.
_AGAIN = 0.25
#: The stop signal raised and not yet taken by the command (``None``: none).
_pending: int | None = None


def _raise(signum: int) -> None:
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _stop(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or SIGTERM: raised where the program is, then raised again every
    :data:`_AGAIN` seconds until :func:`_command` takes it. Code that catches every exception
    (a library's bare ``except:`` at import time, a finalizer, a C function that clears errors
    while it runs Python) would otherwise lose it, and the command would run on."""
    global _pending
    _pending = signum
    signal.setitimer(signal.ITIMER_REAL, _AGAIN, _AGAIN)
    _raise(signum)


def _again(signum: int, frame: FrameType | None) -> None:
    """The timer's tick: the pending stop raised again, unless it is being handled right now
    (cleaning up on its way out, which a second raise would cut short) or the signals are held
    (outputs moving into place: the stop is acted on once they are in)."""
    if _pending is None or isinstance(sys.exc_info()[1], KeyboardInterrupt):
        return
    if signal.getsignal(signal.SIGINT) is not _stop:
        return
    _raise(_pending)


def _taken() -> None:
    """The command has taken the pending stop: no more ticks."""
    global _pending
    _pending = None
    signal.setitimer(signal.ITIMER_REAL, 0)


def _take_signals() -> None:
    """Ctrl-C raises KeyboardInterrupt even where the parent asked to ignore it (a background
    job of a script: whoever sends SIGINT to taps means it), and SIGTERM raises
    :class:`Terminated`. Main thread only (signals are delivered there)."""
    signal.signal(signal.SIGALRM, _again)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(error: BaseException) -> str:
    """An error as one line: an OSError by its file and reason, anything else by its message."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        return f"{where}{error.strerror}"
    return _one_line(str(error)) or type(error).__name__


def _bad_input(error: Exception) -> bool:
    """Whether ``error`` is the user's (bad input, a failed read or write, no memory left)."""
    from taps._core import TapsError

    return isinstance(error, (TapsError, OSError, MemoryError))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``taps`` with ``argv`` (default: the command line); returns the exit code."""
    return _command(argv)[1]


def _command(argv: Sequence[str] | None) -> tuple[str, int]:
    """:func:`main`, and the program's name in its messages (``taps search``)."""
    prog = "taps"
    try:
        from taps._support.quiet import hidden_stderr
        from taps.cli.args import CommandConsole, attach_values
        from taps.cli.parser import build_parser

        parser = build_parser()
        args = parser.parse_args(attach_values(parser, sys.argv[1:] if argv is None else argv))
        prog = f"taps {args.command}"
        # Wide enough for the tables when the output is a file or a pipe.
        console = CommandConsole(width=None if sys.stdout.isatty() else 160)
        # A command returns nothing, or an exit code (``taps verify``: 1 on a mismatch).
        # torch, jax, XLA and gloo log to stderr around the one line taps prints: hidden but
        # with -v (taps' own notes still come through).
        with hidden_stderr(not args.verbose):
            code = args.run(args, console)
    except Terminated:
        _taken()
        sys.stderr.write(f"{prog}: terminated\n")
        return prog, EXIT_TERMINATED
    except KeyboardInterrupt:
        _taken()
        sys.stderr.write(f"{prog}: interrupted\n")
        return prog, EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`taps search ... | head`): nothing left to say to it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return prog, EXIT_BAD_INPUT
    except SystemExit as e:
        if prog == "taps":  # argparse: --help, --version or a bad argument (said already)
            raise
        # Code run inside a command that ended the program (a user's module calling
        # sys.exit): the command did not finish.
        sys.stderr.write(f"{prog}: error: the command was ended by sys.exit({e.code!r})\n")
        return prog, EXIT_BAD_INPUT
    except Exception as e:
        if os.environ.get("TAPS_DEBUG"):
            import traceback

            traceback.print_exc()
        if _bad_input(e):
            message = "out of memory" if isinstance(e, MemoryError) else _describe(e)
            sys.stderr.write(f"{prog}: error: {message}\n")
            return prog, EXIT_BAD_INPUT
        sys.stderr.write(
            f"{prog}: internal error ({type(e).__name__}: {_one_line(str(e))[:200]}); this is a "
            "bug in taps, please report it with the command line (TAPS_DEBUG=1 shows the "
            "traceback)\n"
        )
        return prog, EXIT_INTERNAL
    return prog, code or 0


def run() -> None:
    """The ``taps`` program: :func:`main` on the command line, then exit."""
    prog = "taps"
    try:
        _take_signals()
        prog, code = _command(None)
    except Terminated:  # in the instants before main's own handlers
        _taken()
        sys.stderr.write("taps: terminated\n")
        code = EXIT_TERMINATED
    except KeyboardInterrupt:
        _taken()
        sys.stderr.write("taps: interrupted\n")
        code = EXIT_INTERRUPTED
    except SystemExit as e:  # argparse: --help, --version, a bad argument
        code = e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    _exit(prog, code)


def _exit(prog: str, code: int) -> None:
    """End the process with ``code`` at once, without the interpreter's teardown: it takes
    seconds after a large SCIP model or torch (1.5 s after ``taps import``), and a signal in it
    would be lost or kill the process without a word. The exit handlers still run (temporary
    directories, logging), with Ctrl-C and SIGTERM recorded meanwhile: one that came after the
    command's work is still reported, exit 130 or 143, like one held back while its outputs
    moved into place."""
    _taken()
    caught: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: caught.append(signum))
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A reader gone away, a closed stream: nothing to add.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if caught and code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        interrupted = caught[0] == signal.SIGINT
        sys.stderr.write(f"{prog}: {'interrupted' if interrupted else 'terminated'}\n")
        sys.stderr.flush()
        code = EXIT_INTERRUPTED if interrupted else EXIT_TERMINATED
    os._exit(code)


if __name__ == "__main__":
    run()
