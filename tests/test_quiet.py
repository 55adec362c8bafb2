"""Third-party noise: torch logs warnings and whole tracebacks to stderr around taps' one line
(a data-dependent model, inputs that do not fit, a corrupt archive). The command prints its one
line only, unless asked with ``-v``; taps' own notes still come through."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

FACTORIES = textwrap.dedent(
    """
    import torch

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.l(x)
            return y * 2 if y.sum() > 0 else y

    def branchy():
        return Branchy(), torch.randn(4, 8)

    def misfit():
        return torch.nn.Linear(8, 8), torch.randn(4, 9)
    """
)


def _taps(args: list[str], cwd) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", "from taps.cli import run; run()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("factories:branchy", "data-dependent"),
        ("factories:misfit", "same reduction dim"),
        ("corrupt.pt2", "cannot load torch.export archive"),
    ],
)
def test_torch_failures_are_one_line(tmp_path, source, message):
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "corrupt.pt2").write_bytes(b"not a zip archive" * 64)
    done = _taps(["import", source, "g.json"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("taps import: error: ") and message in done.stderr
    assert not (tmp_path / "g.json").exists()


def test_an_archive_torch_cannot_read_says_why(tmp_path):
    # torch logs the reason (hidden without -v) and raises "check the warnings above".
    import zipfile

    import torch

    good, bad = tmp_path / "good.pt2", tmp_path / "bad.pt2"
    program = torch.export.export(torch.nn.Linear(4, 4), (torch.zeros(2, 4),))
    torch.export.save(program, str(good))
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for member in zin.namelist():
            data = b"zz" if member.endswith(".data/version") else zin.read(member)
            zout.writestr(member, data)
    done = _taps(["import", "bad.pt2", "g.json"], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot load torch.export archive" in done.stderr
    assert "warnings above" not in done.stderr and "version zz" in done.stderr


def test_verbose_shows_what_torch_logs(tmp_path):
    (tmp_path / "corrupt.pt2").write_bytes(b"not a zip archive" * 64)
    done = _taps(["import", "corrupt.pt2", "g.json", "-v"], tmp_path)
    assert done.returncode == 2
    assert "Traceback" in done.stderr  # torch's own log of the failed read, as asked
    assert done.stderr.splitlines()[-1].startswith("taps import: error: cannot load")


def test_notes_of_taps_itself_still_reach_stderr(tmp_path):
    args = ["--from", "2,2:0,-1", "--to", "2,2:1,0", "--shape", "8,8"]
    done = _taps(["plan", *args, "--nodes", "1", "--devices-per-node", "4"], tmp_path)
    assert done.returncode == 0
    assert done.stderr == "taps plan is now taps redistribute (the old name still works)\n"
