"""``simserve`` command line: run scenarios, validate them, list what ships.

Input errors (a ``SimserveError``) print one line, ``error: <where>: <what>``, and exit 2 with no
traceback. Results already computed are printed before anything is written, so a failure to
write files loses nothing that was on screen.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from simserve.errors import SimserveError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simserve", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="simulate a scenario and write its results")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", help="output directory (default: the scenario's output_dir, "
                                   "else runs/<scenario name>)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a scenario field, e.g. --set engine.max_num_seqs=64 "
                          "(repeatable)")
    run.add_argument("--quiet", action="store_true", help="do not print the summary table")
    run.add_argument("--tokens", action="store_true",
                     help="also write tokens.csv: the time of every output token")

    val = sub.add_parser("validate", help="check a scenario without running it")
    val.add_argument("scenario")
    val.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")

    lst = sub.add_parser("list", help="list shipped model cards, hardware specs or policies")
    lst.add_argument("what", choices=("models", "hardware", "policies"))
    return p


def _cmd_run(args) -> int:
    from simserve.config import load_variants
    from simserve.runner import comparison_table, run

    variants = load_variants(args.scenario, args.overrides)
    first = variants[0][1]
    root = Path(args.out) if args.out else (
        first.base_dir / first.output_dir if first.output_dir else
        Path("runs") / Path(args.scenario).stem)
    results = {}
    for label, scenario in variants:
        t0 = time.perf_counter()
        result = run(scenario)
        wall = time.perf_counter() - t0
        results[label] = result
        if not args.quiet:
            print(result.table())
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        out = root if len(variants) == 1 else root / label
        path = result.save(out, tokens=args.tokens)
        print(f"simulated {result.summary['num_requests']} requests, {len(result.steps)} steps "
              f"in {wall:.2f} s [latency: {result.latency_label}]; results in {path}/")
    if len(variants) > 1:
        table = comparison_table(results)
        print()
        print(table.to_string())
        table.to_csv(root / "comparison.csv", float_format="%.6g")
    return 0


def _cmd_validate(args) -> int:
    from simserve.config import load_scenario, num_kv_blocks

    s = load_scenario(args.scenario, args.overrides)
    blocks = num_kv_blocks(s)
    print(f"{args.scenario}: ok — {s.model.name} on {s.hardware.name}, policy {s.policy}, "
          f"{blocks} KV blocks of {s.engine.block_size} tokens "
          f"({blocks * s.engine.block_size} tokens) per replica")
    return 0


def _cmd_list(args) -> int:
    if args.what == "policies":
        from simserve.sched import POLICIES
        for name, cls in POLICIES.items():
            doc = sys.modules[cls.__module__].__doc__ or ""
            print(f"{name:10s} {doc.strip().splitlines()[0] if doc.strip() else ''}")
    elif args.what == "models":
        from simserve.cards import list_models
        print("\n".join(list_models()))
    else:
        from simserve.cards import list_hardware
        print("\n".join(list_hardware()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"run": _cmd_run, "validate": _cmd_validate, "list": _cmd_list}
    try:
        return handlers[args.command](args)
    except SimserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
