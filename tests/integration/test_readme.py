"""README's code runs as written: every Python block, and every command of its shell blocks
except those that need something a test machine has not got (said below, block by block).

The shell commands run with ``--no-report`` added where the command takes it: writing the
report is most of their time, it is tested in test_report.py, and the block's own `simserve
report` line still writes one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from simserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PYTHON = re.findall(r"```python\n(.*?)```", README, re.S)
SHELL = re.findall(r"```bash\n(.*?)```", README, re.S)
# Shell blocks not run here, by their first command, and why.
NOT_RUN = {
    "make demo": "the README's first two commands: `make test` is this suite; CI runs both",
    "simserve calibrate": "needs a live OpenAI-compatible server (docs/fidelity.md)",
}


def commands(block: str) -> list[list[str]]:
    out = []
    for line in block.splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.append(shlex.split(line))
    return out


def test_every_block_is_run_or_said_why_not():
    assert PYTHON and SHELL
    for block in SHELL:
        first = " ".join(commands(block)[0][:2]).replace(".venv/bin/", "")
        assert first.startswith("simserve") or first in NOT_RUN, first


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_blocks_run(index, monkeypatch):
    monkeypatch.chdir(ROOT)               # README's paths are relative to the repository
    exec(compile(PYTHON[index], f"README.md python block {index}", "exec"), {})


RUN = [b for b in SHELL if " ".join(commands(b)[0][:2]).replace(".venv/bin/", "") not in NOT_RUN]


@pytest.mark.parametrize("index", range(len(RUN)))
def test_shell_blocks_run(index, tmp_path, monkeypatch, capsys):
    # in a fresh folder that has the repository's scenarios, so runs/ lands in tmp_path
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    monkeypatch.chdir(tmp_path)
    for argv in commands(RUN[index]):
        assert argv[0].endswith("simserve"), argv
        quick = ["--no-report"] if argv[1] in ("run", "sweep", "capacity") else []
        code = main(argv[1:] + quick)
        out, err = capsys.readouterr()
        assert code == 0, f"{' '.join(argv)}: exit {code}\n{err}"
