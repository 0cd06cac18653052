"""Real against simulated: the error table of one scenario run both ways (``simserve compare``).

(Not named ``compare``: ``simserve.compare`` is the public API that runs a scenario's variants.)

``simserve compare REAL_DIR [REAL_DIR ...] SIM_DIR`` reads the ``summary.json`` of a replayed run
(``simserve replay``) and of a simulated one (``simserve run``) and prints, per metric, the real
value, the simulated value and the relative error ``(sim - real) / real``. With several real
directories (repeats of one workload) the real value is their median and the min-max spread is
shown beside it; ``in spread`` says whether the simulated value falls inside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from typing import TYPE_CHECKING

from simserve.errors import DataError, SimserveError
from simserve.paths import check_out_dir

if TYPE_CHECKING:   # the CLI builds its parser from this module: keep importing it cheap
    import pandas as pd

# (label, summary key): the headline metrics of the fidelity benchmark first.
METRICS: tuple[tuple[str, str], ...] = (
    ("TTFT p50 ms", "median_ttft_ms"), ("TTFT p90 ms", "p90_ttft_ms"),
    ("TPOT p50 ms", "median_tpot_ms"), ("TPOT p90 ms", "p90_tpot_ms"),
    ("ITL p50 ms", "median_itl_ms"), ("E2EL p50 ms", "median_e2el_ms"),
    ("output tok/s", "output_throughput"),
    ("TTFT mean ms", "mean_ttft_ms"), ("TTFT p99 ms", "p99_ttft_ms"),
    ("TPOT mean ms", "mean_tpot_ms"), ("ITL mean ms", "mean_itl_ms"),
    ("E2EL p90 ms", "p90_e2el_ms"), ("req/s", "request_throughput"),
    ("duration s", "duration_s"), ("completed", "completed"),
)
HEADLINE = METRICS[:7]


WORK_KEYS = ("num_requests", "total_input_tokens", "total_output_tokens")   # compared as is


def load_summary(run_dir: str | Path) -> dict:
    """A run's ``summary.json``: a JSON object whose compared metrics are numbers (or null);
    DataError naming the file and the key otherwise (not a traceback from the arithmetic)."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(path, "not found (is this a `simserve run` or `simserve replay` "
                              "output directory?)") from None
    except (OSError, ValueError) as e:
        raise DataError(path, f"cannot read ({e})") from None
    except RecursionError:
        raise DataError(path, "cannot read (nested too deeply)") from None
    if not isinstance(data, dict):
        raise DataError(path, f"expected a JSON object of metrics, got {type(data).__name__}")
    for key in (*(k for _, k in METRICS), *WORK_KEYS):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise DataError(path, f"{key}: expected a number, got {value!r:.40}")
    if all(data.get(k) is None for _, k in METRICS):
        raise DataError(path, "holds none of the compared metrics (is this a `simserve run` or "
                              "`simserve replay` output directory?)")
    return data


def rel_error(sim: float | None, real: float | None) -> float:
    """``(sim - real) / real``; NaN when either is missing or real is 0."""
    if sim is None or real is None or real == 0:
        return math.nan
    return (sim - real) / real


def error_table(real: Sequence[Mapping] | Mapping, sim: Mapping,
                metrics: Sequence[tuple[str, str]] = METRICS) -> pd.DataFrame:
    """One row per metric: real (median of the real runs), min, max, sim, rel. error,
    in spread (min <= sim <= max)."""
    import numpy as np
    import pandas as pd
    reals = [real] if isinstance(real, Mapping) else list(real)
    rows = []
    for label, key in metrics:
        values = [r.get(key) for r in reals if r.get(key) is not None]
        s = sim.get(key)
        med = float(np.median(values)) if values else math.nan
        lo, hi = (min(values), max(values)) if values else (math.nan, math.nan)
        rows.append({"metric": label, "real": med, "real min": lo, "real max": hi,
                     "sim": math.nan if s is None else float(s),
                     "rel. error": rel_error(s, med if values else None),
                     "in spread": bool(values) and s is not None and lo <= s <= hi})
    return pd.DataFrame(rows).set_index("metric")


def format_table(table: pd.DataFrame, spread: bool) -> str:
    """The table as text: errors as signed percentages."""
    shown = table.copy()
    shown["rel. error"] = [("n/a" if math.isnan(e) else f"{100 * e:+.1f} %")
                           for e in table["rel. error"]]
    if not spread:
        shown = shown.drop(columns=["real min", "real max", "in spread"])
    else:
        shown["in spread"] = ["yes" if v else "no" for v in table["in spread"]]
    from simserve.fmt import human       # 11,150 rather than 1.115e+04
    return shown.astype(object).map(human).to_string()


def workload_mismatch(real: Mapping, sim: Mapping) -> list[str]:
    """Differences that mean the two runs did not see the same work."""
    out = []
    for key in WORK_KEYS:
        if real.get(key) != sim.get(key):
            out.append(f"{key}: real {real.get(key)}, sim {sim.get(key)}")
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="error table of real (replayed) runs against a "
                                              "simulated run of the same scenario")
    p.add_argument("dirs", nargs="+", metavar="DIR",
                   help="REAL_DIR [REAL_DIR ...] SIM_DIR: replay outputs (repeats of one "
                        "workload), then a `simserve run` output")
    p.add_argument("--csv", metavar="PATH", help="also write the table as CSV")
    p.set_defaults(handler=_cmd_compare)


def _cmd_compare(args) -> int:
    import sys
    for d in args.dirs:                  # (the other `compare`: a scenario file's variants)
        if Path(d).is_file() and Path(d).suffix in (".yaml", ".yml"):
            raise SimserveError(f"compare: {d} is a scenario file; `simserve compare` reads "
                                "output folders (replayed real runs, then a simulated one). "
                                f"To run a file's compare: variants, `simserve run {d}`")
    if len(args.dirs) < 2:
        raise SimserveError("compare: give at least one real directory and one simulated one")
    *real_dirs, sim_dir = args.dirs
    if args.csv:      # before the table is printed, not a traceback after it
        csv = Path(args.csv)
        if csv.is_dir():
            raise SimserveError(f"--csv: {csv} is a directory; give the file to write")
        check_out_dir(csv.parent)
    reals = [load_summary(d) for d in real_dirs]
    sim = load_summary(sim_dir)
    table = error_table(reals, sim)
    print(format_table(table, spread=len(reals) > 1))
    for r, d in zip(reals, real_dirs):
        diffs = workload_mismatch(r, sim)
        if r.get("num_failed"):
            print(f"warning: {d}: {r['num_failed']} requests failed "
                  f"({r.get('failed_by_error')})", file=sys.stderr)
        if diffs:
            print(f"warning: {d} and {sim_dir} did not run the same work: "
                  f"{'; '.join(diffs)}", file=sys.stderr)
    if args.csv:
        try:
            Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(args.csv, float_format="%.6g")
        except OSError as e:
            raise SimserveError(f"--csv: cannot write {args.csv} ({e.strerror or e})") from None
    return 0
