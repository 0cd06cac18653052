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


def check_what_the_block_says(ns: dict) -> int:
    """The block's comments as checks, for the names it defines; how many names it checked."""
    import pandas as pd

    import simserve
    from simserve.config import load_variants
    from simserve.plan.sweep import load_sweep
    checked = 0
    if "r" in ns:                         # one row per request, one per iteration, token times
        r = ns["r"]
        assert isinstance(r.requests, pd.DataFrame)
        assert len(r.requests) == r.summary["num_requests"] > 0
        assert len(r.steps) == r.summary["num_steps"] > 0
        assert len(r.token_times[0]) == r.requests["num_output_tokens"].iloc[0]
        checked += 1
    if "results" in ns:                   # {label: Result}, one per compare variant
        labels = [label for label, _ in load_variants("scenarios/compare_policies.yaml")]
        assert list(ns["results"]) == labels
        assert all(isinstance(v, simserve.Result) for v in ns["results"].values())
        checked += 1
    if "table" in ns:                     # one row per sweep point
        points = len(load_sweep("scenarios/sweep_rate.yaml").scenarios())
        assert list(ns["table"]["point"]) == list(range(points))
        checked += 1
    if "cap" in ns:                       # .max_rate, .probes
        assert ns["cap"].max_rate > 0 and len(ns["cap"].probes) > 0
        checked += 1
    return checked


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_blocks_run(index, monkeypatch):
    monkeypatch.chdir(ROOT)               # README's paths are relative to the repository
    ns: dict = {}
    exec(compile(PYTHON[index], f"README.md python block {index}", "exec"), ns)
    # ...and give what their comments say (a new block that defines none of these names
    # needs its own checks above)
    assert check_what_the_block_says(ns) > 0


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
