"""The command line's own surface: --version and every built-in subcommand's help."""

from __future__ import annotations

import pytest

import simserve
from simserve.cli import main


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    out, err = capsys.readouterr()
    assert info.value.code == 0 and out == f"simserve {simserve.__version__}\n" and err == ""


@pytest.mark.parametrize("command, words", [
    ("validate", ["without running it", "scenario, compare or sweep YAML file",
                  "override a scenario field"]),
    ("list", ["model cards", "scheduler.policy"]),
])
def test_validate_and_list_explain_themselves(capsys, command, words):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())      # argparse wraps at the terminal width
    assert info.value.code == 0
    for w in words:
        assert w in out


def test_a_run_does_not_pay_for_the_version_lookup():
    """Building the command line (every run does) leaves importlib.metadata unimported: only
    ``--version`` looks the version up."""
    import subprocess
    import sys

    code = ("import sys; from simserve.cli import _parser; _parser('run'); _parser(); "
            "print('importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_the_console_entry_exits_with_mains_code_and_freezes_what_is_left(monkeypatch):
    """``simserve`` and ``python -m simserve`` end through ``console``: main's exit code, with
    the objects left alive frozen first so that shutdown skips collecting them."""
    import simserve.cli as cli

    seen = []
    monkeypatch.setattr(cli, "main", lambda: seen.append("main") or 3)
    monkeypatch.setattr(cli.gc, "freeze", lambda: seen.append("freeze"))
    with pytest.raises(SystemExit) as info:
        cli.console()
    assert info.value.code == 3 and seen == ["main", "freeze"]


def test_the_installed_script_and_python_m_call_the_console_entry():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["simserve"] == "simserve.cli:console"
    assert "console()" in (root / "simserve" / "__main__.py").read_text()
