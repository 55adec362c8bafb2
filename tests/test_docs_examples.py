"""The documentation's Python runs: every ```python block of README.md, docs/getting-started.md,
docs/plan.md and docs/pipeline.md, each file's blocks in order in one namespace, in a fresh
interpreter. A block that must not run (it needs the reader's own code) is preceded by an
``<!-- no-test -->`` line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import taps

ROOT = Path(__file__).parents[1]
DOCS = ["README.md", "docs/getting-started.md", "docs/plan.md", "docs/pipeline.md"]
SKIP = "<!-- no-test -->"
#: A fenced block: its opening fence's language, its first line number and its text.
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: The blocks verify plans on XLA: JAX must start with this many simulated devices.
DEVICES = 16

#: Runs the blocks given as (line, source) pairs in one namespace; a block that raises is
#: reported with the line of the document it starts on.
RUNNER = """
import sys, traceback
blocks = {blocks!r}
namespace = {{"__name__": "__main__"}}
for line, source in blocks:
    try:
        exec(compile(source, "{doc}:" + str(line), "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit("the block of {doc} at line " + str(line) + " raised")
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of ``text`` not marked ``<!-- no-test -->``: (first code line, code)."""
    out = []
    for match in FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        if before == SKIP:
            continue
        out.append((text.count("\n", 0, match.start(2)) + 1, match.group(2)))
    return out


def test_the_extraction_finds_blocks_and_honours_no_test():
    text = (
        "intro\n```python\nx = 1\n```\n\n```console\n$ taps\n```\n"
        f"{SKIP}\n```python\nimport mypkg\n```\n```python\ny = x + 1\n```\n"
    )
    assert python_blocks(text) == [(3, "x = 1\n"), (14, "y = x + 1\n")]


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_block_runs(doc, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    blocks = python_blocks((ROOT / doc).read_text(encoding="utf-8"))
    assert blocks, f"{doc} has no python block"
    script = tmp_path / "run_blocks.py"
    script.write_text(RUNNER.format(blocks=blocks, doc=doc), encoding="utf-8")
    # The taps this test imports, whatever the working directory and PYTHONPATH say.
    path = os.pathsep.join([str(Path(taps.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}",
    }
    # The blocks write files (plan.json): in a directory of their own.
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
