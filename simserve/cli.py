"""``simserve`` command line: run scenarios, sweep and plan capacity, report, validate, list.

Input errors (a ``SimserveError``) print one line, ``error: <where>: <what>``, and exit 2 with no
traceback. Results already computed are printed before anything is written, so a failure to
write files loses nothing that was on screen.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from pathlib import Path

from simserve.errors import ConfigError, SimserveError


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``error: ...``, exit 2 (as every other input error)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} "
                     f"(see {self.prog} --help)\n")


# the commands defined here; the others live in modules that import asyncio or numpy
BUILTIN_COMMANDS = ("run", "report", "sweep", "capacity", "plan", "validate", "list")


def _version() -> str:
    """The installed package's version (the package root is not imported from here: it sits
    below the command line in the rooms of docs/architecture.md)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("simserve")
    except PackageNotFoundError:
        return "(not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for (importlib.metadata costs
    a tenth of the start-up of every run)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        sys.stdout.write(f"simserve {_version()}\n")
        parser.exit()


# `simserve --help`'s first line: every command, in plain words (not the docstring's markup)
DESCRIPTION = ("simserve, a simulator of LLM serving schedulers: run a scenario (or compare "
               "variants of one), sweep a grid, find the capacity, plan a deployment, report, "
               "validate, list what a scenario can name; replay a workload against a live "
               "server, compare the two, calibrate to it, serve a simulation as one; profile "
               "a model's kernels. Bad input: one error line, exit status 2.")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand is registered the same way: a ``register(subparsers)`` function adds its
    parser and sets ``handler`` (the built-in ones below; the live-server and profiler commands
    in their own modules). For one of the built-in ``command`` s only those are registered:
    the live-server modules import asyncio (a tenth of a second of a `simserve run`)."""
    p = _Parser(prog="simserve", description=DESCRIPTION)
    p.add_argument("--version", action=_VersionAction, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    registers = [_register_run, _register_report, _register_sweep, _register_capacity,
                 _register_plan, _register_validate, _register_list]
    if command not in BUILTIN_COMMANDS:
        from simserve import profiling
        from simserve.live import calibrate, fidelity, replay, serve
        registers += [replay.register, fidelity.register, calibrate.register,
                      profiling.register, serve.register]
    for register in registers:
        register(sub)
    return p


def _register_run(sub) -> None:
    run = sub.add_parser("run", help="simulate a scenario and write its results",
                         description="Simulate a scenario (or every variant of a compare "
                                     "file) and write its results. Exit status: 0 when it "
                                     "ran, whether or not the SLO was met; 2 bad input, or a "
                                     "compare variant that failed (the others are written).")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", help="output directory (default: the scenario's output_dir, "
                                   "else runs/<scenario file's name without .yaml>)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a scenario field, e.g. --set engine.max_num_seqs=64 "
                          "(repeatable)")
    run.add_argument("--quiet", action="store_true",
                     help="print only the one line saying where the results are (and "
                          "warnings): no progress bar, summary table or notes on how far "
                          "to trust the latencies")
    run.add_argument("--verbose", action="store_true",
                     help="with a compare: section, also print every variant's summary table "
                          "(by default only the comparison table)")
    run.add_argument("--stepwise", action="store_true",
                     help="simulate one iteration per event instead of fast-forwarding decode "
                          "stretches (same results, slower; for checking)")
    run.add_argument("--tokens", action="store_true",
                     help="also write tokens.csv: the time of every output token")
    steps = run.add_mutually_exclusive_group()
    steps.add_argument("--steps", dest="steps", action="store_true", default=None,
                       help="write steps.csv, one row per engine iteration, however many (by "
                            "default only for runs of at most 100,000 steps)")
    steps.add_argument("--no-steps", dest="steps", action="store_false",
                       help="do not write steps.csv")
    run.add_argument("--format", dest="fmt", choices=("csv", "parquet"), default=None,
                     help="table format of requests, steps and tokens (parquet needs pyarrow: "
                          "pip install 'simserve[parquet]'); by default CSV, Parquet for runs "
                          "of more than 1,000,000 requests when pyarrow is installed")
    run.add_argument("--metric-percentiles", metavar="P,P,...",
                     help="latency percentiles to report, e.g. 25,50,99 (as vllm bench serve; "
                          "same as --set metric_percentiles=[25,50,99])")
    _report_flags(run)
    run.set_defaults(handler=_cmd_run)


def _register_report(sub) -> None:
    rep = sub.add_parser("report", help="figures and report.html from output directories")
    rep.add_argument("dirs", nargs="+", metavar="RUN_DIR",
                     help="a run, compare, sweep, capacity or plan output directory")
    rep.add_argument("--out", help="where report.html and figures/ go (default: the one "
                                   "directory given; required for several)")
    rep.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    rep.add_argument("--title", help="the report's title")
    rep.set_defaults(handler=_cmd_report)


def _register_sweep(sub) -> None:
    swp = sub.add_parser("sweep", help="run a grid of scenario variants into one table",
                         description="Run every point of a sweep file's grid into one table "
                                     "(docs/capacity.md). Exit status: 0 when every point "
                                     "ran; 2 bad input, or a point that failed (the others "
                                     "are in the table).")
    swp.add_argument("grid", help="sweep file: base: or scenario:, then grid: and/or zip:")
    swp.add_argument("--out", help="output directory (default: runs/<sweep file name>, "
                                   "+<overrides> with --set)")
    swp.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="FIELD=VALUE",
                     help="override a field of the base scenario (repeatable)")
    swp.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local processes (default) or a Ray cluster")
    swp.add_argument("--address", help="Ray cluster address (default: start a local one)")
    swp.add_argument("--workers", type=int,
                     help="local processes (default: all cores; at most 4 per core)")
    swp.add_argument("--quiet", action="store_true", help="do not print the table")
    _report_flags(swp)
    swp.set_defaults(handler=_cmd_sweep)


def _register_capacity(sub) -> None:
    cap = sub.add_parser("capacity", help="highest request rate meeting the SLO target, and "
                                          "the fewest replicas for a target rate")
    cap.add_argument("scenario", help="scenario YAML file with an slo: section")
    cap.add_argument("--target-rate", type=float, metavar="R",
                     help="also find the fewest replicas that serve R req/s")
    cap.add_argument("--tolerance", type=float, default=0.05,
                     help="relative width of the final bracket (default 0.05)")
    cap.add_argument("--seeds", type=int, default=3,
                     help="seeds per probe near the knee; a rate passes if all meet the "
                          "target (default 3)")
    cap.add_argument("--max-replicas", type=int, default=256,
                     help="largest replica count tried for --target-rate (default 256)")
    cap.add_argument("--hold", choices=("requests", "duration"), default="requests",
                     help="what every probe keeps fixed while the rate moves: the request "
                          "count (default), or workload.duration's seconds of arrivals, as a "
                          "harness that runs each rate for a fixed time")
    cap.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    cap.add_argument("--out", help="output directory (default: runs/<scenario>-capacity, "
                                   "+<overrides> with --set)")
    cap.add_argument("--quiet", action="store_true", help="do not print each probe")
    _report_flags(cap)
    cap.set_defaults(handler=_cmd_capacity)


def _register_plan(sub) -> None:
    pl = sub.add_parser("plan", help="the cheapest deployment (hardware, parallelism, P:D, "
                                     "knobs, replicas) that serves a rate within the SLOs",
                        description="Exit status: 0 a deployment serves the rate; 3 none meets "
                                    "the SLOs at it (the closest are listed); 2 bad input. "
                                    "See docs/capacity.md.")
    pl.add_argument("scenario", help="scenario YAML file with an slo: section (and optionally "
                                     "a plan: section: the search space)")
    pl.add_argument("--target-rate", type=float, required=True, metavar="R",
                    help="the request rate to serve (req/s)")
    pl.add_argument("--plan", dest="space", metavar="FILE",
                    help="the search space from this file (its plan: section or whole "
                         "mapping) instead of the scenario's plan: section")
    pl.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    pl.add_argument("--executor", choices=("local", "ray"), default="local",
                    help="local processes (default) or a Ray cluster")
    pl.add_argument("--address", help="Ray cluster address (default: start a local one)")
    pl.add_argument("--workers", type=int, help="local processes (default: all cores)")
    pl.add_argument("--out", help="output directory (default: runs/<scenario>-plan)")
    pl.add_argument("--quiet", action="store_true", help="do not print each wave")
    _report_flags(pl)
    pl.set_defaults(handler=_cmd_plan)


def _check_address(args) -> None:
    """``--address`` names a Ray cluster: with the local executor it was ignored, silently."""
    if args.address is not None and args.executor != "ray":
        raise ConfigError("--address", "names a Ray cluster: give it with --executor ray")


def _cmd_plan(args) -> int:
    """Exit 0 with the cheapest deployment; 3 (``planner.EXIT_NOT_MET``) when none meets the
    SLOs at the rate (the closest are printed and saved); 2 on bad input."""
    from simserve.plan.planner import EXIT_NOT_MET, plan

    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers", f"must be >= 1, got {args.workers}")
    _check_address(args)
    from simserve.paths import OUTPUT_FILES, REPORT_FILES, check_out_dir, clear_other_outputs
    from simserve.runner import scenario_file_inputs
    out = Path(args.out) if args.out else Path("runs") / f"{Path(args.scenario).stem}-plan"
    inputs = [*scenario_file_inputs(args.scenario, args.overrides),
              *filter(None, [args.space])]
    check_out_dir(out, (*OUTPUT_FILES["plan"], *REPORT_FILES), inputs)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    t0 = time.perf_counter()
    try:
        result = plan(args.scenario, args.target_rate, space=args.space,
                      overrides=args.overrides, executor=args.executor, workers=args.workers,
                      address=args.address, log=log)
    except ConfigError as e:
        if e.field == "target_rate":
            raise ConfigError("--target-rate", e.message) from None
        raise
    print(result.answer())
    print(f"{len(result.table)} candidates, {result.simulated} simulated, "
          f"{len(result.probes)} runs in {time.perf_counter() - t0:.1f} s")
    _note(clear_other_outputs(out, "plan", inputs=inputs))
    result.save(out)
    print(f"results in {out}/ (plan.json, candidates.csv, probes.csv)")
    _report(args, out)
    return 0 if result.met else EXIT_NOT_MET


def _register_validate(sub) -> None:
    val = sub.add_parser("validate", help="check a scenario without running it",
                         description="Check a scenario, compare or sweep file as the command "
                                     "that runs it would (every variant or grid point, its "
                                     "workload, and whether the deployment fits the device), "
                                     "without running it: prints 'ok', or one error line and "
                                     "exits 2.")
    val.add_argument("scenario", help="scenario, compare or sweep YAML file")
    val.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a scenario field, e.g. --set engine.max_num_seqs=64 "
                          "(repeatable)")
    val.set_defaults(handler=_cmd_validate)


def _register_list(sub) -> None:
    lst = sub.add_parser("list", help="list shipped model cards, hardware specs or policies",
                         description="List what a scenario can name, one line each: model "
                                     "cards (size, weights, KV cache per token), hardware specs "
                                     "(memory, peak FLOP/s, bandwidth) or scheduling policies.")
    lst.add_argument("what", choices=("models", "hardware", "policies"),
                     help="models (for model:), hardware (for hardware:) or policies (for "
                          "scheduler.policy:)")
    lst.set_defaults(handler=_cmd_list)


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-report", dest="report", action="store_false",
                   help="do not write report.html and figures/ at the end")
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")


def _inputs(path: str, variants) -> list[Path]:
    """The files a run or compare read: its scenario file and the files each variant names."""
    from simserve.runner import run_inputs
    return [Path(path), *(f for _, s in variants for f in run_inputs(s))]


def _sweep_inputs(grid: str) -> list[Path]:
    """A sweep file, the base scenario it names (``base:``) and the files that names (a
    trace, a profile)."""
    from simserve import safeyaml
    from simserve.runner import scenario_file_inputs
    try:
        raw = safeyaml.load(grid)
    except SimserveError:
        raw = None
    base = raw.get("base") if isinstance(raw, dict) else None
    return [Path(grid), *(scenario_file_inputs(Path(grid).parent / base)
                          if isinstance(base, str) else [])]


def _note(note: str | None) -> None:
    """Say ``note`` (what a command replaces in its output folder) on stderr, if any."""
    if note:
        print(f"note: {note}", file=sys.stderr)


def _report(args, out: Path) -> None:
    if args.report:
        from simserve.report import write_report
        path = write_report([out], svg=args.svg)
        print(f"report: {path}")
    else:       # a reused folder must not keep the report of the results it held before
        from simserve.paths import clear_report
        removed = clear_report(out)
        if removed:
            print(f"note: removed the earlier report in {out}/ ({', '.join(removed)}): "
                  "it described other results", file=sys.stderr)


def _percentiles_flag(text: str) -> list[float]:
    """``--metric-percentiles 25,50,99``: refused naming the flag, not the field it sets."""
    values = []
    for item in text.split(","):
        try:
            p = float(item)
        except ValueError:
            p = math.nan
        if not 0 < p <= 100:        # NaN too
            raise ConfigError("--metric-percentiles", f"expected comma-separated percentiles "
                                                      f"in (0, 100], e.g. 25,50,99; got "
                                                      f"{text!r}")
        values.append(p)
    return values


def _cmd_run(args) -> int:
    from simserve.config import load_variants
    from simserve.paths import (OUTPUT_FILES, REPORT_FILES, check_out_dir, clear_other_outputs,
                                default_out, folder_name, replaced_note)
    from simserve.runner import check_variants, comparison_table, coinciding, run, scenario_yaml

    if args.metric_percentiles is not None:
        args.overrides.append(f"metric_percentiles={_percentiles_flag(args.metric_percentiles)}")
    variants = load_variants(args.scenario, args.overrides)
    check_variants(variants)              # every variant can exist before any of them runs
    if args.fmt == "parquet":     # before anything runs, not after the simulation
        from simserve.runner import need_pyarrow
        need_pyarrow()
    first = variants[0][1]
    root = Path(args.out) if args.out else default_out(
        first.base_dir / first.output_dir if first.output_dir else
        Path("runs") / Path(args.scenario).stem, args.overrides)
    several = len(variants) > 1
    run_files = (*OUTPUT_FILES["run"], *REPORT_FILES)
    check_out_dir(root, [f"{folder_name(v)}/{n}" for v, _ in variants for n in run_files]
                  + [*OUTPUT_FILES["compare"], *REPORT_FILES] if several else run_files,
                  _inputs(args.scenario, variants))
    results, failed = {}, []
    cleared = False               # (another output's files there: removed before the first save)
    for label, scenario in variants:
        t0 = time.perf_counter()
        try:
            result = run(scenario, record_tokens=args.tokens, fast_forward=not args.stepwise,
                         keep_steps=bool(args.steps),
                         progress=False if args.quiet else
                         (f"{label} ({len(results) + len(failed) + 1}/{len(variants)})"
                          if several else True))
        except SimserveError as e:          # the variants already run keep their results
            if not several:
                raise
            print(f"error: {label}: {e}", file=sys.stderr)
            failed.append(label)
            continue
        wall = time.perf_counter() - t0
        results[label] = result
        if not args.quiet and (args.verbose or not several):
            print(result.table())
        for warning in result.warnings:
            print(f"warning: {label + ': ' if several else ''}{warning}", file=sys.stderr)
        out = root / folder_name(label) if several else root
        if not cleared:
            cleared = True
            _note(clear_other_outputs(root, "compare" if several else "run",
                                      [folder_name(v) for v, _ in variants],
                                      _inputs(args.scenario, variants)))
        _note(replaced_note(out, scenario_yaml(result.scenario, out)))
        path = result.save(out, tokens=args.tokens, steps=args.steps, fmt=args.fmt)
        print(f"simulated {result.summary['num_requests']:,} requests, {result.num_steps:,} "
              f"steps in {wall:.2f} s [latency: {result.latency_label}]; results in {path}/")
        if not args.quiet and (args.verbose or not several):
            from simserve.config import async_allowed
            from simserve.latency.trust import run_trust_lines
            for line in run_trust_lines(result.summary, async_allowed(result.scenario)):
                print(line)
    if several and results:
        from simserve.fmt import format_table   # (pandas: only a compare needs it here)
        table = comparison_table(results)
        print()
        print(format_table(table))
        for group in coinciding(results):
            print(f"note: {' = '.join(group)}: identical schedules (every step the same) at "
                  "these knobs; docs/policies.md says when these policies coincide")
        table.to_csv(root / "comparison.csv", float_format="%.6g")
    if results:
        _report(args, root)
    return 2 if failed else 0


def _cmd_report(args) -> int:
    from simserve.report import write_report
    print(f"report: {write_report(args.dirs, args.out, svg=args.svg, title=args.title)}")
    return 0


SWEEP_SHOWN = ("error", "completed", "num_rejected", "request_throughput", "request_goodput",
               "slo_attainment", "p99_ttft_ms", "p99_tpot_ms")


def _cmd_sweep(args) -> int:
    from simserve.fmt import format_table
    from simserve.config import value_label
    from simserve.paths import (OUTPUT_FILES, REPORT_FILES, check_out_dir, clear_other_outputs,
                                default_out)
    from simserve.plan.sweep import (check_workers, load_sweep, replaced_sweep_note, save_sweep,
                                     sweep, sweep_inputs)

    check_workers(args.workers, "--workers")
    _check_address(args)
    spec = load_sweep(args.grid, args.overrides)
    out = Path(args.out) if args.out else default_out(Path("runs") / Path(args.grid).stem,
                                                      args.overrides)
    inputs = [*_sweep_inputs(args.grid), *sweep_inputs(spec)]
    check_out_dir(out, (*OUTPUT_FILES["sweep"], *REPORT_FILES), inputs)
    _note(replaced_sweep_note(out, spec))   # (said before the run: its table is to go)
    t0 = time.perf_counter()
    table = sweep(spec, executor=args.executor, workers=args.workers, address=args.address,
                  progress=True)
    wall = time.perf_counter() - t0
    failed = table[table["error"].notna()]
    if not args.quiet:
        shown = ["point", *spec.fields, *(c for c in SWEEP_SHOWN if c in table)]
        view = table[shown].copy()
        view["error"] = ["failed" if e else "ok" for e in table["error"].notna()]
        for f in spec.fields:           # an inline card by its name, as compare labels it
            view[f] = [value_label(v) if isinstance(v, (dict, list)) else v for v in view[f]]
        print(format_table(view, index=False))
    _note(clear_other_outputs(out, "sweep", inputs=inputs))
    save_sweep(table, spec, out)
    print(f"{len(table)} points ({len(failed)} failed) in {wall:.1f} s; table in "
          f"{out}/sweep.csv")
    if len(failed) < len(table):
        _report(args, out)
    for _, row in failed.iterrows():      # the points that ran are saved above
        where = ", ".join(f"{k}={row[k]}" for k in spec.fields)
        print(f"error: sweep point {row['point']} ({where}): {row['error']}", file=sys.stderr)
    return 2 if len(failed) else 0


def _cmd_capacity(args) -> int:
    from simserve.paths import (OUTPUT_FILES, REPORT_FILES, check_out_dir, clear_other_outputs,
                                default_out)
    from simserve.plan.capacity import capacity
    from simserve.runner import scenario_file_inputs

    out = Path(args.out) if args.out else default_out(
        Path("runs") / f"{Path(args.scenario).stem}-capacity", args.overrides)
    inputs = scenario_file_inputs(args.scenario, args.overrides)
    check_out_dir(out, (*OUTPUT_FILES["capacity"], *REPORT_FILES), inputs)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    t0 = time.perf_counter()
    try:
        result = capacity(args.scenario, target_rate=args.target_rate,
                          tolerance=args.tolerance, seeds=args.seeds, overrides=args.overrides,
                          max_replicas=args.max_replicas, log=log, progress=not args.quiet,
                          hold=args.hold)
    except ConfigError as e:      # the API's argument names as the options the user typed
        if e.field in ("tolerance", "seeds", "max_replicas", "target_rate", "hold"):
            raise ConfigError("--" + e.field.replace("_", "-"), e.message) from None
        raise
    print(result.table())
    print(f"{len(result.probes)} runs in {time.perf_counter() - t0:.1f} s")
    _note(_replaced_search(out, result.to_dict()))
    _note(clear_other_outputs(out, "capacity", inputs=inputs))
    result.save(out)
    print(f"results in {out}/ (capacity.json, probes.csv)")
    _report(args, out)
    return 0


def _replaced_search(out: Path, new: dict) -> str | None:
    """A sentence when ``out`` holds another capacity search's answer (other scenario, SLO,
    target, seeds, hold or result), naming what differs; None otherwise."""
    import json
    try:
        old = json.loads((out / "capacity.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old == new:
        return None
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return f"replacing another capacity search in {out}/ (differs in {', '.join(changed[:5])})"


def _cmd_validate(args) -> int:
    """Check any file the CLI accepts (a scenario, a compare file, a sweep file) as the command
    that runs it would, including whether each deployment can exist (simserve/deployment.py)."""
    from simserve.config import file_kind, load_variants
    from simserve.deployment import check
    from simserve.workload import build_workload

    kind = file_kind(args.scenario)
    if kind == "sweep":
        from simserve.plan.sweep import load_sweep
        spec = load_sweep(args.scenario, args.overrides)
        variants = [(f"sweep point {i}: " + ", ".join(f"{k}={v}" for k, v in point.items()), s)
                    for i, (point, s) in enumerate(zip(spec.points(), spec.scenarios()))]
        what = f"sweep of {len(variants)} points over {', '.join(spec.fields)}"
    else:
        variants = load_variants(args.scenario, args.overrides)
        what = (f"{len(variants)} variants: {', '.join(label for label, _ in variants)}"
                if kind == "compare" else "")
    requests: dict[str, int] = {}       # workloads (traces, lengths files) read once each
    planned = kind == "scenario" and (variants[0][1].source or {}).get("plan") is not None
    run_fails = ""      # a plan file whose own deployment `simserve run` would refuse
    for label, s in variants:
        try:
            if planned:         # (a plan replaces the deployment: its candidates are checked)
                try:
                    check(s)
                except ConfigError as e:
                    run_fails = str(e)
            else:
                check(s)
            key = repr((s.workload, s.seed, s.base_dir.resolve()))
            if key not in requests:
                requests[key] = len(build_workload(s.workload, s.seed, s.base_dir))
        except ConfigError as e:
            if kind == "scenario":
                raise
            where = label if kind == "sweep" else f"compare variant {label!r}"
            raise ConfigError(e.field, f"{e.message} (in {where})") from None
    if planned:
        # `simserve plan`'s search space, and its candidates built as the planner builds them
        from simserve.plan.planner import check_plan
        what = check_plan(args.scenario, args.overrides)
    print(f"{args.scenario}: ok" + (f" — {what}" if what else ""))
    if planned:
        print(f"  note: simserve run of this file would fail: {run_fails}" if run_fails
              else "  simserve run of this file: ok too")
        return 0
    for label, s in variants:
        s.replica.check_kv()
        blocks = s.replica.num_gpu_blocks
        n = requests[repr((s.workload, s.seed, s.base_dir.resolve()))]
        head = "" if kind == "scenario" else f"{label}: "
        print(f"  {head}{s.model.name} on {s.hardware.name}, policy {s.policy}, {blocks:,} KV "
              f"blocks of {s.engine.block_size} tokens ({blocks * s.engine.block_size:,} "
              f"tokens) per replica; {n:,} requests")
    return 0


def _cmd_list(args) -> int:
    """One line per entry saying what it is: a policy's first docstring line, a model's size
    and memory, a device's memory, peak FLOP/s and bandwidth."""
    if args.what == "policies":
        from simserve.sched import POLICIES
        rows = [(name, policy_line(cls)) for name, cls in POLICIES.items()]
    elif args.what == "models":
        from simserve.cards import list_models, load_model
        rows = []
        for name in list_models():
            m = load_model(name)
            active = (f", {_count(m.active_params)} active" if m.active_params != m.num_params
                      else "")
            rows.append((name, f"{_count(m.num_params)} parameters{active}, weights "
                               f"{m.weight_bytes / 1e9:.3g} GB, KV cache "
                               f"{m.kv_bytes_per_token / 1024:.4g} KiB a token, "
                               f"{m.num_layers} layers, up to {m.max_position_embeddings:,} "
                               "tokens"))
    else:
        from simserve.cards import list_hardware, load_hardware
        from simserve.latency.efficiency import load_curves
        from simserve.plan.space import default_prices
        prices = {k.lower(): v.per_hour for k, v in default_prices().items()}
        rows = []
        for name in list_hardware():
            h = load_hardware(name)
            fp8 = f" ({h.peak_flops_fp8 / 1e12:.4g} FP8)" if h.peak_flops_fp8 else ""
            # what a roofline run on it is timed by, and what `simserve plan` costs it at
            if h.efficiency:
                curves = load_curves(h.efficiency)
                on = (curves.corpus or {}).get("hardware")
                fitted = (f"fitted to measured vLLM runs on {on}"
                          + (" (transferred)" if on != name else "")) if on else "fitted"
                clock = (f"{h.efficiency} curves, "
                         + (fitted if curves.expected_error_pct else "an estimate"))
            else:
                clock = "spec sheet, an estimate"
            price = prices.get(name.lower())
            cost = f"; plan price ${price:g}/GPU-hour (default)" if price \
                else "; no plan price (simserve plan needs one: plan.prices)"
            rows.append((name, f"{h.kind}, {h.mem_bytes / 1e9:.4g} GB memory at "
                               f"{h.mem_bandwidth / 1e12:.3g} TB/s, {h.peak_flops / 1e12:.4g} "
                               f"TFLOP/s dense{fp8}, link {h.interconnect_bandwidth / 1e9:.3g} "
                               f"GB/s a direction; step times: {clock}{cost}"))
    width = max(len(name) for name, _ in rows)
    for name, line in rows:
        print(f"{name:<{width}}  {line}")
    return 0


def policy_line(cls) -> str:
    """What a policy does in one line: its module docstring's first line, or its class's where
    the module holds several policies."""
    from simserve.sched import POLICIES
    shared = sum(c.__module__ == cls.__module__ for c in POLICIES.values()) > 1
    doc = (cls.__dict__.get("__doc__") if shared else None) \
        or sys.modules[cls.__module__].__doc__ or ""
    lines = doc.strip().splitlines()
    line = lines[0].strip() if lines else ""
    return line.split(": ", 1)[1] if line.startswith("``") and ": " in line else line


def _count(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = words[0] if words else None
    if command in BUILTIN_COMMANDS and "numpy" not in sys.modules:
        # NumPy's BLAS threads (started when numpy is imported, spinning a while) cost these
        # commands CPU time and do nothing for them: no large matrix products here
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = _parser(command).parse_args(argv)
    try:
        return args.handler(args)
    except SimserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`simserve run x.yaml | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def console() -> None:
    """The ``simserve`` command and ``python -m simserve``: :func:`main`, then the process's
    exit. Whatever the command left alive is frozen first (``gc.freeze``) so that the
    interpreter's shutdown does not run the cyclic collector over it and free it piece by
    piece, which took 50–110 ms after a 10,000-request run (benchmarks/RESULTS.md); the
    operating system takes the memory back at once. Calls of :func:`main` from Python (tests,
    notebooks) are left as they are."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
