"""The command line's help as a newcomer reads it (`simserve --help`, each subcommand's
`--help`): every option says what it does, examples name things that exist, and what a
command writes is what its help says it writes; the Python API's names are listed."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from simserve.cli import _parser
from simserve.live.serve import write_record

ROOT = Path(__file__).resolve().parents[2]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser; `simserve profile` hands its arguments to the profiler's own
    parser, whose help is the one a user sees."""
    from profiler.cli import build_parser
    return {**_subparsers(_parser()), "profile": build_parser("simserve profile")}


def _help(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_help().split())      # argparse's line wrapping undone


def test_top_level_help_names_every_command_in_plain_text():
    parser = _parser()
    description = parser.description or ""
    assert "``" not in _help(parser)                   # a docstring's markup, not help text
    for name in _subparsers(parser):
        assert re.search(rf"\b{name}\b", description), name


def test_every_option_of_every_command_says_what_it_does():
    undocumented = []
    for name, sub in _commands().items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip():
                undocumented.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert undocumented == []


def test_profile_model_example_is_a_shipped_card():
    from simserve.cards import list_models
    text = _help(_commands()["profile"])
    example = re.search(r"shipped model card name \(e\.g\. ([\w.-]+)[;)]", text)
    assert example and example.group(1) in list_models()


def test_report_help_names_every_directory_kind_it_reads():
    text = _help(_subparsers(_parser())["report"])
    for kind in ("run", "compare", "sweep", "capacity", "plan"):
        assert re.search(rf"\b{kind}\b", text), kind


def test_serve_record_help_names_every_file_it_writes(tmp_path):
    write_record([], tmp_path)
    text = _help(_subparsers(_parser())["serve"])
    record = text[text.index("--record DIR"):]
    for path in sorted(tmp_path.iterdir()):
        assert path.name in record, path.name


def test_commands_that_exit_non_zero_on_results_say_so():
    subs = _subparsers(_parser())
    for name in ("run", "sweep", "plan"):
        assert "Exit status" in _help(subs[name]), name


def test_the_python_api_is_listed_by_dir_for_tab_completion():
    """`import simserve; simserve.<TAB>` (Jupyter, IPython: dir()) showed nothing, the names
    being imported on first use; dir() now lists the API."""
    import simserve
    names = dir(simserve)
    assert set(simserve.__all__) <= set(names)
    assert {"run", "compare", "sweep", "capacity", "plan", "ConfigError"} <= set(names)


def test_a_result_shows_as_one_line_in_a_notebook():
    """`r = simserve.run(...); r` in Jupyter printed the dataclass in full: the scenario, every
    card field and the whole summary dict, about 6,000 characters."""
    import simserve
    r = simserve.run(str(ROOT / "tests" / "data" / "tiny.yaml"), progress=False)
    text = repr(r)
    assert "\n" not in text and len(text) < 300, text
    assert "'tiny'" in text and f"{r.num_steps:,} steps" in text and "60 requests" in text
