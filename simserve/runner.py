"""The Python API: ``simserve.run(scenario) -> Result`` with pandas DataFrames.

Builds replicas (block manager + policy + latency model) from a scenario, runs the engine, and
turns what the recorder saw into columns and the summary. The DataFrames (``Result.requests``,
``steps``, ``tokens()``) are built from those columns on first use: a caller that needs only
the summary (a capacity search, a sweep) never imports pandas. Writing files is
``Result.save``'s job alone.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import gc
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from simserve import deployment
from simserve.config import Scenario, as_scenario, check_overrides, load_variants
from simserve.engine import Replica, simulate
from simserve.engine.build import build_replicas, engine_options, scenario_curves
from simserve.errors import ConfigError, SimserveError
from simserve.latency.base import LatencyModel, StepTimer
from simserve.latency.trust import latency_trust
from simserve.metrics import recorder as _recorder
from simserve.metrics.recorder import Recorder
from simserve.metrics.slo import SloConfig
from simserve.metrics.summary import tpot
from simserve.metrics.recorder import itl_sample
from simserve.paths import (OUTPUT_FILES, clear_other_outputs, keep_inputs, make_out_dir,
                            named_files, rebase_paths)
from simserve.sched.request import Status
from simserve.workload import build_workload
from simserve.workload.spec import RequestSpec, SpecColumns, longest_request

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported where a DataFrame is first asked for (Result.requests, steps, tokens(),
# save): neither the simulation nor the summary needs it.

REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "num_prompt_tokens", "num_output_tokens", "status",
    "reject_reason", "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "ttft_s", "e2el_s", "tpot_s", "priority", "class", "num_cached_tokens",
)


@dataclass
class Result:
    """One simulated run: per-request and per-step tables, token times and the summary."""

    scenario: Scenario
    _requests: pd.DataFrame | None          # None: not built yet (from _columns)
    _steps: pd.DataFrame | None
    summary: dict
    latency_label: str = ""
    warnings: list[str] = field(default_factory=list)
    _recorder: Recorder | None = field(default=None, repr=False)
    _tracks: list | None = field(default=None, repr=False)   # (TokenTrack, delay) per row
    _token_times: list | None = field(default=None, repr=False)
    # the per-request columns (REQUEST_COLUMNS, in order; NumPy arrays) until ``requests`` is
    # built from them
    _columns: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request, ``REQUEST_COLUMNS`` (built on first use: the summary is
        computed from the run's columns without pandas)."""
        if self._requests is None:
            import pandas as pd
            assert self._columns is not None, "a Result has its requests or their columns"
            self._requests = pd.DataFrame(self._columns, columns=list(REQUEST_COLUMNS),
                                          copy=False)   # (the columns as they are: no copy)
            self._columns = None    # (text columns as objects: the frame holds them as strings)
        return self._requests

    @requests.setter
    def requests(self, frame: pd.DataFrame) -> None:
        self._requests, self._columns = frame, None

    def __repr__(self) -> str:
        # what a notebook shows for `r`: a line, not the scenario and summary in full (6 kB)
        s = self.summary
        return (f"<simserve Result {self.scenario.name!r}: {s['num_requests']:,} requests "
                f"({s['completed']:,} finished, {s['num_rejected']:,} rejected), "
                f"{self.num_steps:,} steps, latency {self.latency_label}; .summary, .requests, "
                f".steps, .table()>")

    def request_column(self, name: str) -> np.ndarray:
        """One column of ``requests`` as an array (without building the table)."""
        names = self._columns if self._columns is not None else self.requests.columns
        if name not in names:
            close = difflib.get_close_matches(str(name), list(names), n=1)
            raise SimserveError(f"request_column: no column {name!r}" + (
                f" (did you mean {close[0]}?)" if close else f"; columns: {', '.join(names)}"))
        if self._columns is not None:
            return self._columns[name]
        return self.requests[name].to_numpy()

    @property
    def num_requests(self) -> int:
        """Rows of ``requests`` (without building the table)."""
        if self._columns is not None:
            return len(self._columns["request_id"])
        return len(self.requests)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine iteration (built on first use: a long run has millions). A run
        of more than ``FOLD_STEPS`` steps on a replica keeps them only when asked
        (``run(..., keep_steps=True)``, CLI ``--steps``): its summary needs only their sums."""
        if self._steps is None:
            if not self.has_steps:
                raise SimserveError(
                    f"the per-step table of this run ({self.num_steps:,} steps) was not kept: "
                    f"a replica ran more than {_recorder.FOLD_STEPS:,} steps and its oldest "
                    f"were folded "
                    f"into the summary's sums; run with keep_steps=True (CLI: --steps)")
            self._steps = steps_frame(self._recorder)
        return self._steps

    @property
    def has_steps(self) -> bool:
        """Whether every step is still there to build ``steps`` from (not folded away)."""
        return self._steps is not None or self._recorder is None or not any(
            log.num_folded for log in self._recorder.replicas.values())

    @property
    def num_steps(self) -> int:
        """Engine iterations simulated, all replicas together (``len(steps)``, without
        building the table)."""
        if self._steps is not None or self._recorder is None:
            return len(self.steps)
        return sum(log.num_steps for log in self._recorder.replicas.values())

    @property
    def has_token_times(self) -> bool:
        return self._tracks is not None

    @property
    def token_times(self) -> list[np.ndarray]:
        """Every output token's time, one array per row of ``requests`` (empty if rejected).
        Recorded only when asked for: ``run(..., record_tokens=True)``."""
        if self._tracks is None:
            raise SimserveError("token times were not recorded; run with record_tokens=True "
                                "(CLI: --tokens)")
        if self._token_times is None:
            out = []
            for track, delay in self._tracks:
                if track is None:
                    out.append(np.empty(0))
                    continue
                times = np.array(track.times(), dtype=np.float64)
                out.append(times + delay if delay else times)
            self._token_times = out
        return self._token_times

    def table(self) -> str:
        """The printed summary (``vllm bench serve`` layout)."""
        from simserve.metrics.summary import format_summary
        title = f"simserve: {self.scenario.name} ({self.scenario.policy})"
        return format_summary(self.summary, title=title, subtitle=self._what())

    def _what(self) -> str:
        """What was simulated, in one line: model, hardware, parallelism, the load."""
        s = self.scenario
        e = s.engine
        parts = [f"{k} {v}" for k, v in (("TP", e.tensor_parallel_size),
                                          ("PP", e.pipeline_parallel_size),
                                          ("DP", e.data_parallel_size)) if v > 1]
        if e.enable_expert_parallel and e.tensor_parallel_size * e.data_parallel_size > 1:
            parts.append(f"EP {e.tensor_parallel_size * e.data_parallel_size}")
        par = ", ".join(parts)
        w = s.workload
        if w.trace is not None:
            load = f"trace {Path(w.trace.path).name}" + (f" at {w.trace.rate:g} req/s"
                                                          if w.trace.rate else "")
        elif w.stages:
            load = f"{len(w.stages)} load stages"
        elif w.arrival is not None and w.arrival.rate is not None \
                and math.isfinite(w.arrival.rate):
            load = f"{w.arrival.process} arrivals at {w.arrival.rate:g} req/s"
        else:
            load = "all at once"
        if w.max_concurrency is not None:
            load += f", at most {w.max_concurrency:,} in flight"
        c = s.cluster
        where = (f"{_count(c.replicas, 'replica')} in {_count(len(c.groups), 'group')}"
                 if c.groups else s.hardware.name + (f" ({par})" if par else "")
                 + (f" x {c.replicas} replicas" if c.replicas > 1 else ""))
        n = self.summary["num_requests"]
        return f"{s.model.name} on {where}; {_count(n, 'request')}, {load}"

    def tokens(self) -> pd.DataFrame:
        """Every output token: ``request_id``, ``token_index`` (0-based), ``time_s``."""
        import pandas as pd
        return pd.DataFrame(self._token_columns())

    def _token_columns(self) -> dict:
        ids = self._columns["request_id"] if self._columns is not None \
            else self.requests["request_id"].to_numpy()
        counts = [len(t) for t in self.token_times]
        return {
            "request_id": np.repeat(ids, counts),
            "token_index": np.concatenate([np.arange(c) for c in counts]) if counts else [],
            "time_s": np.concatenate(self.token_times) if counts else [],
        }

    def save(self, out_dir: str | Path, *, tokens: bool = False, steps: bool | None = None,
             fmt: str | None = None) -> Path:
        """Write scenario.yaml, requests, steps, summary.json (and tokens when asked); the same
        scenario and seed give byte-identical files.

        ``steps``: every engine iteration as a row (True), none (False), or, by default (None),
        only when the run has at most ``STEPS_ROWS`` of them: a long run's per-step table is
        millions of rows nobody asked for (its time-weighted levels are in the summary either
        way, and ``Result.steps`` still builds it in memory). ``fmt``: ``csv``, or ``parquet``
        (columnar, typed; needs pyarrow: ``pip install 'simserve[parquet]'``); by default CSV,
        and Parquet for a run of more than ``CSV_ROWS`` requests when pyarrow is installed
        (a run of millions of requests: a gigabyte of CSV nobody asked for)."""
        if fmt is None:
            fmt = "parquet" if self.num_requests > CSV_ROWS and has_pyarrow() else "csv"
        if fmt not in OUTPUT_FORMATS:
            raise SimserveError(f"output format {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
        if fmt == "parquet":
            need_pyarrow()
        if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
            raise SimserveError(f"out_dir: expected a folder's path, got {out_dir!r}")
        if tokens and not self.has_token_times:
            raise SimserveError("tokens=True: this run did not record token times (run it "
                                "with record_tokens=True)")
        inputs = run_inputs(self.scenario)
        keep_inputs(out_dir, OUTPUT_FILES["run"], inputs, "out_dir")
        out = make_out_dir(out_dir)
        # what an output of another kind (a compare, a capacity search...) left there would be
        # reported as this run's (the CLI says what goes; from Python it goes quietly)
        clear_other_outputs(out, "run", inputs=inputs)
        (out / "scenario.yaml").write_text(scenario_yaml(self.scenario, out))
        # a table of the other format, or a steps table this run does not write, left by an
        # earlier run in this directory would be read back as this run's (simserve report)
        for name in ("requests", "steps", "tokens"):
            for ext in OUTPUT_FORMATS:
                (out / f"{name}.{ext}").unlink(missing_ok=True)
        # CSV from the run's columns where no DataFrame was built (pandas' bytes, without
        # pandas: _write_csv); Parquet, and a table already built, through pandas
        columns = self._columns
        _write(out / "requests", fmt, (lambda: columns) if columns is not None else None,
               lambda: self.requests)
        if steps or (steps is None and self.has_steps and self.num_steps <= STEPS_ROWS):
            rec = self._recorder     # (steps folded away: self.steps says so, exit 2)
            _write(out / "steps", fmt, (lambda: steps_columns(rec)) if self._steps is None
                   and rec is not None and self.has_steps else None, lambda: self.steps)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        if tokens:
            _write(out / "tokens", fmt, self._token_columns, self.tokens)
        return out


def run_inputs(s: Scenario) -> list[Path]:
    """The files a run of ``s`` reads: the file it was loaded from, and the trace, lengths and
    profile files it names."""
    return [*([s.path] if s.path is not None else []), *named_files(s.to_dict(), s.base_dir)]


def scenario_file_inputs(path: str | Path, overrides: list[str] | None = None) -> list[Path]:
    """``run_inputs`` of the scenario file ``path`` (a command's: capacity, plan, replay), for
    keeping them from its output; the file alone if it does not load (the command says why)."""
    from simserve.config import load_scenario
    try:
        return run_inputs(load_scenario(path, overrides))
    except SimserveError:
        return [Path(path)]


# Result.save writes the per-step table by default only up to this many rows (about 6 MB of
# CSV; a run of a few thousand requests): past it, only when asked (`simserve run --steps`).
STEPS_ROWS = 100_000
OUTPUT_FORMATS = ("csv", "parquet")
# ... and its tables as CSV up to this many requests, as Parquet past it (if pyarrow is there)
CSV_ROWS = 1_000_000


def has_pyarrow() -> bool:
    import importlib.util
    return importlib.util.find_spec("pyarrow") is not None


def need_pyarrow() -> None:
    """A SimserveError (exit 2) naming the extra to install when pyarrow is missing."""
    if not has_pyarrow():
        raise SimserveError("output format parquet needs pyarrow, which is not installed "
                            "(pip install 'simserve[parquet]')")


def _write_table(df: pd.DataFrame, stem: Path, fmt: str) -> None:
    if fmt == "csv":
        df.to_csv(stem.with_suffix(".csv"), index=False, float_format="%.9g")
    else:
        df.to_parquet(stem.with_suffix(".parquet"), index=False, engine="pyarrow")


def _write(stem: Path, fmt: str, columns: Callable[[], Mapping[str, Any]] | None,
           frame: Callable[[], pd.DataFrame]) -> None:
    """A table as CSV from its ``columns`` where they are given and ``_write_csv`` takes their
    types, else from its DataFrame (``_write_table``)."""
    if fmt == "csv" and columns is not None and _write_csv(columns(), stem.with_suffix(".csv")):
        return
    _write_table(frame(), stem, fmt)


# rows formatted at a time by _write_csv (its memory: a few MB of strings)
CSV_CHUNK = 8192


def _write_csv(columns: Mapping[str, Any], path: Path) -> bool:
    """Write columns (equally long; numbers, or text with None for missing) as CSV, byte for
    byte what ``pd.DataFrame(columns).to_csv(path, index=False, float_format="%.9g")`` writes:
    the header, floats as ``"%.9g" % x`` and NaN as an empty cell, integers as ``str``, text
    as is, minimally quoted by the csv module with ``\\n`` line ends (tests/integration/
    test_outputs_scale.py compares the two). Returns False, writing nothing, for a column of
    another type (the caller goes through pandas).

    Where no cell needs quoting (no text with a comma, quote or line break, and more than one
    column: a row of one empty cell is quoted) the rows are joined with commas directly, which
    writes the same bytes as the csv module at a third of its cost."""
    arrays = [np.asarray(v) for v in columns.values()]
    texts = [_text_values(v) for v in arrays if v.dtype.kind == "O"]
    if any(t is None for t in texts) or not all(v.dtype.kind in "fiuO" for v in arrays):
        return False
    plain = len(arrays) > 1 and not any(_QUOTED.search(x) for t in texts for x in t if x)
    n = len(arrays[0]) if arrays else 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(list(columns))
        for a in range(0, n, CSV_CHUNK):
            rows = zip(*(_csv_cells(v[a:a + CSV_CHUNK]) for v in arrays))
            if plain:
                f.write("\n".join(map(",".join, rows)))
                f.write("\n")
            else:
                writer.writerows(rows)
    return True


# a character the csv module quotes a cell for (QUOTE_MINIMAL, "," and "\n" as above)
_QUOTED = re.compile('[,"\r\n]')


def _text_values(v: np.ndarray) -> set[Any] | None:
    """The distinct values of an object column if each is text or None, else None."""
    try:
        values = set(v.tolist())
    except TypeError:                   # (unhashable: not text)
        return None
    return values if all(x is None or type(x) is str for x in values) else None


def _csv_cells(v: np.ndarray) -> list[str]:
    if v.dtype.kind == "f":
        # pandas' float_format "%.9g" (format(x, ".9g") gives the same text, a fifth faster)
        cells = list(map(float.__format__, v.tolist(), repeat(".9g", len(v))))
        for i in np.flatnonzero(np.isnan(v)).tolist():
            cells[i] = ""
        return cells
    if v.dtype.kind == "O":
        return ["" if x is None else x for x in v.tolist()]
    if len(v):
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < len(v):            # few distinct values: each formatted once
            if hi == lo:
                return [str(lo)] * len(v)
            table = list(map(str, range(lo, hi + 1)))
            return list(map(table.__getitem__, (v - lo).tolist()))
    return list(map(str, v.tolist()))


def scenario_yaml(s: Scenario, out: Path) -> str:
    """The resolved scenario as written to ``out``: its file paths relative to ``out`` (so it
    reruns from there), and the ``--set`` overrides that made it named in a header comment."""
    header = "".join(f"# --set {o}\n" for o in s.overrides)
    if header:
        header = "# resolved with these overrides (already applied below):\n" + header
    return header + yaml.safe_dump(rebase_paths(s.to_dict(), s.base_dir, out), sort_keys=False)


def class_slos(s: Scenario) -> dict[str, SloConfig]:
    """Each request class's SLO: its own limits, the scenario's where it gives none."""
    out = {}
    for c in s.workload.classes:
        own = {k: getattr(c, k) for k in ("ttft_ms", "tpot_ms", "e2el_ms")}
        out[c.name] = dataclasses.replace(
            s.slo, **{k: v for k, v in own.items() if v is not None})
    return out


def run(scenario: Scenario | Mapping[str, Any] | str | Path, *, latency: LatencyModel | None = None,
        overrides: list[str] | None = None, fast_forward: bool = True,
        record_tokens: bool = False, progress: bool | str = False,
        keep_steps: bool = False) -> Result:
    """Simulate a scenario (a Scenario, a scenario mapping as parsed from YAML, or a path to
    its YAML; ``overrides``, ``FIELD=VALUE`` strings, apply to the last two) and summarise it.

    ``fast_forward=False`` steps one iteration per event; the results are the same (the
    equivalence tests check it), only slower. ``record_tokens=True`` keeps every output
    token's time (``Result.token_times``, ``tokens.csv``); the summary never needs them.
    ``progress`` shows a bar with an ETA on stderr (or in Jupyter) for a run that takes more
    than a second, counting requests resolved; a string is its label (default the scenario's
    name). ``keep_steps`` keeps every step for ``Result.steps`` however long the run (by
    default a replica's steps past ``FOLD_STEPS`` are folded into the summary's sums as the
    run goes, and the ITL percentiles come from a sketch within 0.5 %: docs/metrics.md).
    """
    s = as_scenario(scenario, overrides)
    if latency is not None and not isinstance(latency, StepTimer):
        raise ConfigError("latency", f"expected a step-latency model (an object with "
                                     f"step_time(plan)), got {type(latency).__name__} "
                                     f"{latency!r:.40}; a scenario chooses its model by name "
                                     f"in latency.model")
    with _no_cyclic_gc():
        return _run(s, latency, fast_forward, record_tokens, progress, keep_steps)


@contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector: a run allocates millions of long-lived objects and
    holds no reference cycles worth collecting, so repeated full GC passes only cost time.
    Reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run(s: Scenario, latency: LatencyModel | None, fast_forward: bool,
         record_tokens: bool, progress: bool | str = False, keep_steps: bool = False) -> Result:
    if latency is None:        # a model passed in is the caller's to vouch for
        deployment.check(s)
    workload_notes: list[str] = []
    specs = build_workload(s.workload, s.seed, s.base_dir, workload_notes)
    shares_nothing = _no_content(specs)
    replicas = build_replicas(s, latency)
    for replica in replicas:
        replica.scheduler.record_tokens = record_tokens
    if s.workload.max_concurrency is not None and len(set(frontend_delays(replicas).values())) > 1:
        # the client's gate frees a slot one front-end delay after a request ends (clients.py),
        # one delay for the whole client
        raise ConfigError("workload.max_concurrency", "a client concurrency gate needs one "
                          "front-end delay for every replica (latency.frontend_delay_ms or the "
                          "profiles' frontend_delay_s differ between replica groups)")
    on_progress = bar = None
    if progress:
        from simserve.progress import bar as make_bar
        bar = make_bar(len(specs), progress if isinstance(progress, str) else s.name, "req")

        def on_progress(done: int) -> None:
            bar.update(done - bar.n)
    try:
        rec = simulate(specs, replicas, fast_forward=fast_forward,
                       max_concurrency=s.workload.max_concurrency, compact_requests=True,
                       keep_steps=keep_steps, progress=on_progress, **engine_options(s, replicas))
    finally:
        if bar is not None:
            bar.close()
    longest = longest_request(specs)
    del specs                       # (the workload's columns: not needed by the tables)
    result = collect(s, rec, replicas)
    pricings = {id(r.latency): r.pricing for r in replicas}.values()
    result.latency_label = replicas[0].latency.label
    # (once each: replica groups that share a model say the same)
    result.warnings = workload_notes + list(dict.fromkeys(w for p in pricings
                                                           for w in p.warnings()))
    if shares_nothing and any(r.blocks.caches_prefixes for r in replicas):
        result.warnings.append(
            "prefix caching is on, but no request says what its prompt holds (no hash_ids: "
            "not a Mooncake trace, no prefix_len or shared_prefix): only a preempted request "
            "can hit its own cached blocks (docs/scenario.md, workload)")
    result.summary["latency_model"] = result.latency_label
    trust = latency_trust(s, scenario_curves(s), longest) if latency is None else None
    if trust is not None:
        result.summary["latency_trust"] = trust
    result.summary["warnings"] = result.warnings
    return result


def _no_content(specs: Sequence[RequestSpec]) -> bool:
    """True if no request names its prompt's content (``hash_ids``, none or empty): a prefix
    cache can then share nothing between requests."""
    if isinstance(specs, SpecColumns):
        return not specs.hash_ids and not any(specs.tables)
    return not any(spec.hash_ids for spec in specs)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def compare(path: str | Path, overrides: list[str] | None = None) -> dict[str, Result]:
    """Run every variant of a scenario file (see ``config.load_variants``), keyed by label."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", f"expected the path of a scenario file (with a compare: "
                                  f"section), got {type(path).__name__} {path!r:.60}")
    variants = load_variants(path, check_overrides(overrides))
    check_variants(variants)
    return {label: run(s) for label, s in variants}


def check_variants(variants: list[tuple[str, Scenario]]) -> None:
    """Before any variant runs: each can be deployed (``deployment.check``: weights and KV
    cache fit), so a compare is not stopped by its last variant after the others ran; the
    error names the variant."""
    for label, scenario in variants:
        try:
            deployment.check(scenario)
        except ConfigError as e:
            if len(variants) == 1:
                raise
            raise ConfigError(e.field, f"{e.message} (in compare variant {label!r})") from None


COMPARISON_METRICS = {
    "completed": "completed", "rejected": "num_rejected",
    "req/s": "request_throughput", "out tok/s": "output_throughput",
    "TTFT p50 ms": "median_ttft_ms", "TTFT p99 ms": "p99_ttft_ms",
    "TPOT p50 ms": "median_tpot_ms", "TPOT p99 ms": "p99_tpot_ms",
    "E2EL p50 ms": "median_e2el_ms", "preemptions": "total_preemptions",
    "goodput req/s": "request_goodput", "SLO attainment": "slo_attainment",
}


def comparison_table(results: dict[str, Result]) -> pd.DataFrame:
    """One row per variant, the headline metrics as columns; and the prefix cache's hit rate
    (a fraction; shown as a percentage) when any variant's summary has one (it caches
    prefixes)."""
    import pandas as pd
    metrics = dict(COMPARISON_METRICS)
    if any("prefix_cache_hit_rate" in r.summary for r in results.values()):
        metrics["prefix cache hit rate"] = "prefix_cache_hit_rate"
    rows = {label: {col: r.summary.get(key) for col, key in metrics.items()}
            for label, r in results.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def coinciding(results: dict[str, Result]) -> list[list[str]]:
    """Groups of labels whose runs scheduled every step identically (the same steps table and
    the same request times): policies that coincide at these knobs, whose curves hide each
    other in a figure. The KV capacity is not part of a schedule: vLLM v1 keeps a null block
    back, so its ``kv_blocks_total`` is one less than another policy's on the same memory."""
    import pandas as pd
    groups: dict[tuple, list[str]] = {}
    for label, r in results.items():
        if not r.has_steps:          # a long run's steps were folded: nothing to compare
            continue
        steps = r.steps.drop(columns=["step", "kv_blocks_total"], errors="ignore")
        key = (int(pd.util.hash_pandas_object(steps, index=False).sum()),
               int(pd.util.hash_pandas_object(r.requests[["first_token_s", "finish_s"]],
                                              index=False).sum()))
        groups.setdefault(key, []).append(label)
    return [g for g in groups.values() if len(g) > 1]


def frontend_delays(replicas: list[Replica]) -> dict[int, float]:
    """Each replica's front-end delay in seconds (a calibrated profile's ``frontend_delay_s``;
    0 for every other latency model)."""
    return {r.index: r.pricing.frontend_delay_s for r in replicas}


def collect(s: Scenario, rec: Recorder, replicas: list[Replica]) -> Result:
    """The run's per-request columns and its summary, from what the recorder saw (NumPy only:
    ``Result.requests`` becomes a DataFrame on first use)."""
    from simserve.metrics.cluster import cluster_summary
    from simserve.metrics.summary import grouped_levels, spec_decode_summary, summarize
    rec.compact()                   # every request is resolved by now: all into columns
    cols, row_tracks = rec.resolved.table()
    n = len(cols["request_id"])
    status = cols["status"]
    finished = status == Status.FINISHED.value
    first, finish = cols["first_token_s"], cols["finish_s"]
    arrival = cols["arrival_s"]
    replica_of = cols["replica"]
    delays = frontend_delays(replicas)
    if any(delays.values()):
        # a front-end delay h (calibrated, docs/fidelity.md): the request reaches the engine
        # h after the client sends it, so the engine's clock runs h behind the client's. Every
        # engine time (tokens, finishes, steps) moves onto the client's clock, as a real
        # server is measured; arrivals are the client's send times already (with a client
        # concurrency gate too: a slot frees a delay after the engine's end, clients.py).
        for r in replicas:
            if r.index in rec.replicas:
                rec.replicas[r.index].offset = delays[r.index]
        shift = np.array([delays.get(int(i), 0.0) for i in range(int(replica_of.max()) + 1)]
                         if n else [0.0])[replica_of]
        first, finish = first + shift, finish + shift
        cols["first_scheduled_s"] = cols["first_scheduled_s"] + shift
    out = cols["num_output_tokens"]
    ttft, e2el = first - arrival, finish - arrival
    cols.update(first_token_s=first, finish_s=finish, ttft_s=ttft, e2el_s=e2el,
                tpot_s=tpot(ttft, e2el, out, finished))
    requests = {c: cols[c] for c in REQUEST_COLUMNS}
    has_classes = any(cols["class"])
    del cols, status
    logs = [rec.replicas[i] for i in sorted(rec.replicas)]

    def levels(t0: float, t1: float) -> dict:
        return grouped_levels([log.level_columns() for log in logs], t0, t1)

    sketch = rec.itl()              # a long run's ITL, folded as it went; else exact
    summary = summarize(requests, None, None, s.slo, percentiles=s.metric_percentiles,
                        itl=sketch if sketch is not None else itl_sample(rec),
                        class_slos=class_slos(s) if has_classes else None,
                        # (any replica: a cluster group may turn caching on alone)
                        prefix_caching=any(r.blocks.caches_prefixes for r in replicas),
                        levels=levels)
    summary.update(cluster_summary(rec, replicas, requests))
    if s.engine.speculative_config is not None:
        summary["spec_decode"] = spec_decode_summary(
            rec.resolved.spec_totals, rec.resolved.spec_per_position,
            s.engine.speculative_config.k)
    if s.engine.kv_offloading_size is not None:
        tiers = [r.scheduler.blocks for r in replicas
                 if hasattr(r.scheduler.blocks, "num_offload_blocks")]
        summary["kv_offload"] = {
            "host_blocks_per_replica": s.replica.num_offload_blocks,
            "loaded_blocks": sum(b.num_loaded for b in tiers),
            "stored_blocks": sum(b.num_stored for b in tiers),
            "host_evicted_blocks": sum(b.num_host_evicted for b in tiers)}
    if any(delays.values()):
        summary["frontend_delay_ms"] = 1000.0 * max(delays.values())
    if rec.stages:
        summary["pipeline"] = pipeline_summary(rec.stages)
    tracks = None
    if row_tracks is not None:
        tracks = [(t, delays.get(int(i), 0.0)) if t is not None else (None, 0.0)
                  for t, i in zip(row_tracks, replica_of)]
    return Result(s, None, None, summary, _recorder=rec, _tracks=tracks, _columns=requests)


def pipeline_summary(stages: dict[int, Any]) -> dict[str, Any]:
    """Pipeline bubbles over the pipelined replicas (engine/pipeline.py, ``Stages``): the
    fraction of stage time idle while the pipeline had work, over all stages and per stage
    (stage j of every replica together), and the seconds the pipelines had work."""
    per = [stages[i].bubbles() for i in sorted(stages)]
    depth = max(len(idle) for _, idle in per)
    idle = [sum(s[j] for _, s in per if j < len(s)) for j in range(depth)]
    room = [sum(t for t, s in per if j < len(s)) for j in range(depth)]
    return {"in_flight_s": sum(t for t, _ in per),
            "bubble_fraction": sum(idle) / sum(room) if sum(room) > 0 else 0.0,
            "stage_bubble_fraction": [i / r if r > 0 else 0.0 for i, r in zip(idle, room)]}


def steps_frame(rec: Recorder) -> pd.DataFrame:
    """The per-step table, ordered by start time then replica, numbered from 0."""
    import pandas as pd
    return pd.DataFrame(steps_columns(rec), copy=False)


def steps_columns(rec: Recorder) -> dict[str, np.ndarray]:
    """The per-step table's columns (``steps_frame``)."""
    cols = rec.columns()
    start, replica = cols["start_s"], cols["replica"]
    in_order = bool(np.all((start[1:] > start[:-1]) | (
        (start[1:] == start[:-1]) & (replica[1:] >= replica[:-1]))))
    if not in_order:   # several replicas record their steps interleaved
        order = np.lexsort((replica, start))
        cols = {c: v[order] for c, v in cols.items()}
    return {"step": np.arange(len(start), dtype=np.int64), **cols}
