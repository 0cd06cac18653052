"""Write the docs' tables of shipped-scenario results from the scenarios themselves.

    python benchmarks/docs_tables.py           # rerun the scenarios, rewrite the marked blocks
    python benchmarks/docs_tables.py --check   # exit 1 naming each block that differs

A block in a docs page sits between ``<!-- docs_tables: NAME -->`` and
``<!-- /docs_tables: NAME -->``; everything between the two lines is this script's output for
NAME, never hand-edited. tests/integration/test_scenarios.py checks that every block equals what
the script writes now, so a change of the latency model that moves a number fails the test
until this script is rerun (one command, above), and the prose around the table is reread.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


@dataclass(frozen=True)
class Table:
    doc: str                                   # docs page, relative to the repository
    scenario: str                              # shipped scenario (a compare file)
    render: Callable[[dict], str]              # {label: summary} -> markdown


def _ms(x: float) -> str:
    return f"{x:.1f} ms"


def _s(x_ms: float) -> str:
    return f"{x_ms / 1000:.2f} s"


DISAGG_NAMES = {
    "colocated-v0": "colocated, vLLM v0 (prefill-first)",
    "colocated-chunked": "colocated, Sarathi chunked (512)",
    "disaggregated-1p3d": "disaggregated 1 prefill + 3 decode",
    "disaggregated-2p2d": "disaggregated 2 prefill + 2 decode",
}


def render_disaggregated(summaries: dict) -> str:
    rows = ["| variant | SLO attainment | goodput | p90 TPOT | p99 TTFT |",
            "|---|---|---|---|---|"]
    for label, name in DISAGG_NAMES.items():
        s = summaries[label]
        rows.append(f"| {name} | {100 * s['slo_attainment']:.1f} % | "
                    f"{s['request_goodput']:.2f} req/s | {_ms(s['p90_tpot_ms'])} | "
                    f"{_s(s['p99_ttft_ms'])} |")
    return "\n".join(rows)


def render_routing(summaries: dict) -> str:
    rows = ["| router | SLO attainment | p99 TTFT | completed max/mean |", "|---|---|---|---|"]
    order = sorted(summaries, key=lambda k: -summaries[k]["slo_attainment"])
    for label in order:
        s = summaries[label]
        rows.append(f"| `{label}` | {100 * s['slo_attainment']:.1f} % | "
                    f"{_s(s['p99_ttft_ms'])} | {s['load_imbalance_completed']:.3f} |")
    return "\n".join(rows)


def render_kv_offload(summaries: dict) -> str:
    rows = ["| variant | TTFT p50 | TTFT p99 | SLO attainment | preemptions |",
            "|---|---|---|---|---|"]
    for label, s in summaries.items():
        rows.append(f"| {label} | {_ms(s['median_ttft_ms'])} | {_s(s['p99_ttft_ms'])} | "
                    f"{100 * s['slo_attainment']:.1f} % | {s['total_preemptions']} |")
    return "\n".join(rows)


TABLES: dict[str, Table] = {
    "disaggregated": Table("docs/cluster.md", "disaggregated", render_disaggregated),
    "cluster_routing": Table("docs/cluster.md", "cluster_routing", render_routing),
    "kv_offload": Table("docs/models.md", "kv_offload", render_kv_offload),
}


def summaries(scenario: str) -> dict:
    """{label: summary} of every variant of a shipped scenario."""
    import simserve
    return {label: r.summary
            for label, r in simserve.compare(SCENARIOS / f"{scenario}.yaml").items()}


def block(name: str, body: str) -> str:
    return f"<!-- docs_tables: {name} -->\n{body}\n<!-- /docs_tables: {name} -->"


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"<!-- docs_tables: {re.escape(name)} -->\n(?:.*?\n)?"
                      rf"<!-- /docs_tables: {re.escape(name)} -->", re.S)


def current(name: str) -> str:
    """The block as the docs page holds it now (ValueError if the page has no such block)."""
    text = (ROOT / TABLES[name].doc).read_text(encoding="utf-8")
    found = _pattern(name).search(text)
    if found is None:
        raise ValueError(f"{TABLES[name].doc}: no block `{name}` (markers missing)")
    return found.group(0)


def expected(name: str, results: dict | None = None) -> str:
    t = TABLES[name]
    return block(name, t.render(results if results is not None else summaries(t.scenario)))


def write(name: str, new: str) -> bool:
    """Replace the block; True if the page changed."""
    path = ROOT / TABLES[name].doc
    text = path.read_text(encoding="utf-8")
    old = current(name)
    if old == new:
        return False
    path.write_text(text.replace(old, new), encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"blocks to write (default: all of {', '.join(TABLES)})")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in TABLES]
    if unknown:
        p.error(f"unknown block {unknown[0]!r}; expected one of: {', '.join(TABLES)}")
    stale = []
    for name in args.names or TABLES:
        new = expected(name)
        if args.check:
            if current(name) != new:
                stale.append(name)
        elif write(name, new):
            print(f"{TABLES[name].doc}: block {name} rewritten")
    for name in stale:
        print(f"{TABLES[name].doc}: block {name} differs from the scenario's results; rerun "
              "python benchmarks/docs_tables.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
