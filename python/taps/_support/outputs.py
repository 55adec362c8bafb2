"""Output files written whole or not at all.

A command checks where it will write before it works: each file gets a temporary file beside it
up front (so a missing directory, a directory in the way, a device such as /dev/full or a
read-only place fails at once), the results go into the temporary files, and only when every one
is written are they renamed over the targets (``os.replace``, atomic), with Ctrl-C and SIGTERM
held back for that moment. A failure or an interrupt removes the temporary files and leaves the old
outputs, or none."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from taps.errors import OutputError


def _mode(path: Path) -> int:
    """The permissions a new file gets (those of the file it replaces, if any)."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class OutputFile:
    """One output file, checked now and written by :meth:`Outputs.commit`: write into
    :attr:`temp` (which keeps the target's suffix, for libraries that go by it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise OutputError(f"cannot write {str(self.path)!r}: it is a directory")
        if self.path.exists() and not self.path.is_file():
            raise OutputError(f"cannot write {str(self.path)!r}: it is not a regular file")
        try:
            fd, temp = tempfile.mkstemp(
                dir=self.path.parent, prefix=f".{self.path.name}.", suffix=self.path.suffix
            )
        except OSError as e:
            raise OutputError(f"cannot write {str(self.path)!r}: {e.strerror}") from None
        except ValueError as e:  # a NUL in the path
            raise OutputError(f"cannot write {str(self.path)!r}: {e}") from None
        os.close(fd)
        self.temp = Path(temp)

    def write_text(self, text: str) -> None:
        """Write ``text`` (UTF-8) into the temporary file."""
        with self.writing():
            self.temp.write_text(text, encoding="utf-8")

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A block that writes the temporary file (or moves it into place): an OSError in it
        names the target, not the temporary file (its directory removed meanwhile, a full disk)."""
        try:
            yield
        except OSError as e:
            raise OutputError(f"cannot write {str(self.path)!r}: {e.strerror or e}") from None

    def write_json(self, doc: object) -> None:
        """Write ``doc`` as the commands write JSON: indented, and refused with a ValueError if
        it holds NaN or an infinity (JSON has neither, and no reader should meet them)."""
        self.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


class Outputs:
    """The output files of one command: ``with Outputs(paths) as out: ...; out.commit()``.
    Leaving the block without a commit (an error, Ctrl-C) removes every temporary file."""

    def __init__(self, *paths: str | os.PathLike[str] | None) -> None:
        given = [Path(p) for p in paths if p is not None]
        if len({os.path.abspath(p) for p in given}) < len(given):
            raise OutputError(f"two outputs go to the same file: {', '.join(map(str, given))}")
        self.files: list[OutputFile] = []
        try:
            for p in paths:
                if p is not None:
                    self.files.append(OutputFile(p))
        except BaseException:
            self.discard()
            raise

    def __getitem__(self, path: str | os.PathLike[str]) -> OutputFile:
        return next(f for f in self.files if f.path == Path(path))

    def __enter__(self) -> Outputs:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.discard()

    def commit(self) -> None:
        """Move every written file into place, all of them or, on an error, none."""
        with _deferred_interrupt():
            for f in self.files:
                with f.writing():
                    f.temp.chmod(_mode(f.path))
            for f in self.files:
                with f.writing():
                    os.replace(f.temp, f.path)
        self.files = []

    def discard(self) -> None:
        """Remove the temporary files."""
        for f in self.files:
            f.temp.unlink(missing_ok=True)
        self.files = []


@contextlib.contextmanager
def output_directory(out: Path) -> Iterator[None]:
    """A block that writes into the directory ``out``, created if missing; if the block fails,
    a directory it created is removed again when it is still empty."""
    made = not out.exists()
    if out.exists() and not out.is_dir():
        raise OutputError(f"output directory {str(out)!r} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create output directory {str(out)!r}: {e.strerror}") from None
    try:
        yield
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


#: The signals that stop a command: held back while outputs move into place.
_STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back until the block is done, then act on the first that came
    as its handler would have (main thread only; elsewhere they cannot come)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []
    hold = lambda n, f: caught.append((n, f))  # noqa: E731
    previous: dict[int, Any] = {s: signal.signal(s, hold) for s in _STOPS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signum, frame = caught[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
