"""docs/api.md, the Python API reference, held to the code: every exported name is in it,
every signature in a heading is the function's own (names, order, kinds and defaults), every
attribute it lists exists, and its links lead to headings that exist."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import simserve

DOCS = Path(__file__).parents[2] / "docs"
API = (DOCS / "api.md").read_text()
HEADINGS = re.findall(r"^### `simserve\.(\w+)\((.*)\)(?: -> (.*))?`$", API, re.M)


def _signature_text(f) -> str:
    """The signature as the doc writes it: the parameters with their defaults, ``*`` where
    keyword-only ones begin, no annotations."""
    parts, star = [], False
    for p in inspect.signature(f).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


def test_every_exported_name_is_documented():
    for name in simserve.__all__:     # (the whole name: not load_ inside load_scenario)
        assert re.search(rf"simserve\.{name}\b", API), f"docs/api.md lacks simserve.{name}"


@pytest.mark.parametrize("name, params, returns", HEADINGS, ids=[h[0] for h in HEADINGS])
def test_each_signature_is_the_functions_own(name, params, returns):
    f = getattr(simserve, name)     # (simserve.plan: the callable package, its signature)
    assert params == _signature_text(f)
    annotation = inspect.signature(f).return_annotation
    assert returns.replace("DataFrame", "pd.DataFrame") == annotation


def test_the_headings_cover_the_functions():
    # (a check that passed over no heading would hold nothing to the code)
    assert {h[0] for h in HEADINGS} == {"run", "compare", "sweep", "capacity", "plan",
                                        "load_scenario", "load_variants", "parse_scenario"}


def _listed(section: str) -> set[str]:
    """The names in `code` a section's first table or list names (before any parenthesis)."""
    return {m.split("(")[0] for m in re.findall(r"`([A-Za-z_][\w]*(?:\([^`]*\))?)`", section)}


def test_the_listed_attributes_exist():
    from simserve.plan.capacity import CapacityResult
    from simserve.plan.planner import PlanResult
    from simserve.runner import Result
    result_table = API.split("**`Result`**")[1].split("### ")[0]
    names = {re.match(r"\| `(\w+)", line).group(1) for line in result_table.splitlines()
             if line.startswith("| `")}
    names |= {n for line in result_table.splitlines() if line.startswith("| `")
              for n in re.findall(r"`(\w+)`", line.split("|")[1])}
    fields = {f.name for f in dataclasses.fields(Result)}
    assert len(names) >= 12
    for n in names:
        assert hasattr(Result, n) or n in fields, f"Result.{n}"
    for cls, marker in ((CapacityResult, "**`CapacityResult`**"), (PlanResult, "**`PlanResult`**")):
        section = API.split(marker)[1].split("[capacity.md]")[0]
        listed = _listed(section)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert len(listed) >= 10
        for n in listed:
            assert hasattr(cls, n) or n in fields, f"{cls.__name__}.{n}"


def test_links_lead_to_headings_that_exist():
    links = re.findall(r"\]\(([\w.]+\.md)(?:#([\w-]+))?\)", API)
    assert links
    for page, anchor in links:
        text = (DOCS / page).read_text()
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", text, re.M)}
            assert anchor in slugs, f"{page}#{anchor}"


def test_a_scenario_prints_in_one_line():
    # the dataclass repr ran to 3,663 characters in a notebook cell
    s = simserve.load_scenario(Path(__file__).parents[2] / "scenarios" / "quickstart.yaml")
    assert repr(s) == ("<Scenario quickstart: Llama-3.1-8B on H100-SXM, policy vllm_v1, seed 0; "
                       ".engine, .workload, .slo, .latency, .cluster>")
