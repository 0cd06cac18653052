"""Every ```yaml block of docs/scenario.md is a valid scenario as written: read by the strict
loader (a key given twice is an error) and checked by `simserve validate`, as a user who pastes
it into a file would. A block that is only a section (``workload:``, ``slo:``...) is checked on
top of a small base scenario; a block that gives a section replaces the base's section whole,
so a snippet must be complete in itself. Also: every repository file that the README or a docs
page names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from simserve import safeyaml
from simserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scenario.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
BASE = {"model": "Llama-3.1-8B", "hardware": "H100-SXM",
        "workload": {"rate": 4, "num_requests": 10, "prompt": {"dist": "fixed", "value": 100},
                     "output": {"dist": "fixed", "value": 10}}}


def test_the_doc_has_yaml_blocks():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_yaml_block_validates(index, tmp_path, capsys):
    text = BLOCKS[index]
    block = safeyaml.parse(text, f"{DOC}: yaml block {index}")   # strict: duplicate keys fail
    assert isinstance(block, dict), text
    raw = {**BASE, **block}
    path = tmp_path / "snippet.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    (tmp_path / "traces").symlink_to(ROOT / "scenarios" / "traces")   # paths as in the docs
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 0, f"docs/scenario.md yaml block {index}:\n{text}\n{err}"



# a repository file the README or a docs page names ("tests/unit/test_moe.py", cited as
# tests/test_moe.py after the tests moved); vLLM's own paths and the README's placeholder aside
CITED = re.compile(r"(?<![\w/])((?:tests|benchmarks|simserve|scenarios|profiler|notebooks)/"
                   r"[\w./-]+\.(?:py|yaml|md|csv|json|jsonl|ipynb))\b")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_repository_file_the_docs_name_exists():
    cited = {(page.name, path) for page in PAGES
             for path in CITED.findall(page.read_text(encoding="utf-8"))}
    assert len(cited) > 50
    missing = sorted((page, path) for page, path in cited
                     if path != "tests/unit/test_x.py" and not (ROOT / path).exists())
    assert missing == []
