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
import yaml

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
    if "cap" in ns:                       # .max_rate, .replicas_needed, .notes
        cap = ns["cap"]
        assert cap.max_rate > 0 and len(cap.probes) > 0
        # a steady answer: no "probe too short" note (README's 3,000 requests a probe)
        assert cap.replicas_needed is not None and not cap.short_probe, cap.notes
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
        check_what_the_command_did(argv[1:], out, tmp_path)


def check_what_the_command_did(args: list[str], out: str, cwd: Path) -> None:
    """A README command gives what its line says: every folder or file it names as written
    is there, inside the folder it ran in; a compare prints one table row per variant; a
    ``--set`` reaches the scenario it saved; ``validate`` says ok; ``list policies`` lists
    every policy; a sweep's table has a row per point; a capacity search answers; a report
    has its page and figures."""
    import json

    import pandas as pd

    from simserve.config import file_kind, load_variants
    from simserve.plan.sweep import load_sweep
    from simserve.sched import POLICIES

    what = " ".join(args)
    named = [Path(p) for p in re.findall(r"(?:results in|table in|report:) (\S+?)/?(?:\s|$)",
                                         out)]
    if args[0] in ("run", "sweep", "capacity", "report"):
        assert named, f"{what}: names no output\n{out}"
    for path in named:
        assert path.exists(), f"{what}: names {path}, which is not there"
        assert (cwd / path).resolve().is_relative_to(cwd.resolve()), f"{what}: wrote {path}"
    sets = [a for prev, a in zip(args, args[1:]) if prev == "--set"]
    if args[0] == "run" and file_kind(args[1]) == "compare":
        labels = [label for label, _ in load_variants(args[1])]
        table = out.split("\n\n")[-1]             # the comparison, after the runs' lines
        rows = [line.split()[0] for line in table.splitlines()[1:] if line.strip()]
        assert set(labels) <= set(rows), f"{what}: table rows {rows}, variants {labels}"
        assert len(named) == len(labels)           # one results folder each
    elif args[0] == "run":
        summary = json.loads((named[0] / "summary.json").read_text())
        assert summary["completed"] > 0 and "requests" in out
        saved = yaml.safe_load((named[0] / "scenario.yaml").read_text())
        for override in sets:                      # engine.max_num_seqs=64 as saved
            field, value = override.split("=", 1)
            node = saved
            for part in field.split("."):
                node = node[part]
            assert node == yaml.safe_load(value), f"{what}: {field} saved as {node}"
    elif args[0] == "validate":
        assert out.startswith(f"{args[1]}: ok"), out
    elif args[0] == "list" and args[1] == "policies":
        listed = {line.split()[0] for line in out.splitlines() if line.strip()}
        assert listed == set(POLICIES), listed ^ set(POLICIES)
    elif args[0] == "sweep":
        table = pd.read_csv(named[0])
        assert len(table) == len(load_sweep(args[1]).scenarios())
        assert table["error"].isna().all()
    elif args[0] == "capacity":
        answer = json.loads((named[0] / "capacity.json").read_text())
        assert answer["max_rate"] > 0 and answer["replicas_needed"] >= 1, answer
        assert answer["target_rate"] == float(args[args.index("--target-rate") + 1])
    elif args[0] == "report":
        page = named[0].read_text()
        figures = sorted((named[0].parent / "figures").glob("*.png"))
        assert figures and page.count("<img") == len(figures), (len(figures), page.count("<img"))


def test_the_command_checks_catch_a_command_that_did_not_do_it(tmp_path, monkeypatch, capsys):
    """check_what_the_command_did fails where the output falls short of what the line says."""
    monkeypatch.chdir(tmp_path)
    assert main(["list", "policies"]) == 0
    listed = capsys.readouterr().out
    check_what_the_command_did(["list", "policies"], listed, tmp_path)
    with pytest.raises(AssertionError):                 # a policy missing from the list
        check_what_the_command_did(["list", "policies"], listed.split("\n", 1)[1], tmp_path)
    with pytest.raises(AssertionError):
        check_what_the_command_did(["validate", "s.yaml"], "s.yaml: error\n", tmp_path)
    with pytest.raises(AssertionError):                 # names a folder that is not there
        check_what_the_command_did(["run", "s.yaml"], "results in runs/s/\n", tmp_path)
    with pytest.raises(AssertionError):                 # names no output at all
        check_what_the_command_did(["sweep", "g.yaml"], "0 points\n", tmp_path)
    run = tmp_path / "runs" / "q"
    quick = str(ROOT / "scenarios" / "quickstart.yaml")
    assert main(["run", quick, "--no-report", "--out", str(run)]) == 0
    said = capsys.readouterr().out
    check_what_the_command_did(["run", quick], said, tmp_path)
    with pytest.raises(AssertionError):                 # a --set the saved scenario lacks
        check_what_the_command_did(["run", quick, "--set", "engine.max_num_seqs=7"], said,
                                   tmp_path)
