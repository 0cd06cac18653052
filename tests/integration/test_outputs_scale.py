"""Outputs that scale (issue #21): the per-step table only where asked or small, Parquet as an
alternative to CSV, and a start-up that imports neither pandas nor the report before a run."""

from __future__ import annotations

import warnings

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simserve
from simserve import runner
from simserve.cli import main
from simserve.report import write_report

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return simserve.run(DATA / "tiny.yaml")


def test_steps_written_up_to_the_limit_and_when_asked(tiny, tmp_path, monkeypatch):
    n = tiny.num_steps
    assert n > 10
    tiny.save(tmp_path / "small")                     # under the default limit: written
    assert len(pd.read_csv(tmp_path / "small" / "steps.csv")) == n
    monkeypatch.setattr(runner, "STEPS_ROWS", n - 1)  # the same run counted as long
    out = tiny.save(tmp_path / "small")               # ... and a stale steps.csv goes
    assert not (out / "steps.csv").exists()
    assert (out / "requests.csv").exists() and (out / "summary.json").exists()
    tiny.save(tmp_path / "asked", steps=True)
    assert len(pd.read_csv(tmp_path / "asked" / "steps.csv")) == n
    monkeypatch.setattr(runner, "STEPS_ROWS", n)      # the limit itself is still written
    tiny.save(tmp_path / "edge")
    assert (tmp_path / "edge" / "steps.csv").exists()
    tiny.save(tmp_path / "edge", steps=False)
    assert not (tmp_path / "edge" / "steps.csv").exists()


def test_cli_steps_flags(tmp_path, capsys):
    assert main(["run", str(DATA / "tiny.yaml"), "--out", str(tmp_path / "a"), "--quiet",
                 "--no-report", "--no-steps"]) == 0
    assert not (tmp_path / "a" / "steps.csv").exists()
    assert main(["run", str(DATA / "tiny.yaml"), "--out", str(tmp_path / "a"), "--quiet",
                 "--no-report", "--steps"]) == 0
    assert (tmp_path / "a" / "steps.csv").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:        # a usage error: one line, exit 2
        main(["run", str(DATA / "tiny.yaml"), "--steps", "--no-steps"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_report_without_steps_says_why(tiny, tmp_path):
    out = tiny.save(tmp_path / "r", steps=False)
    html = write_report([out]).read_text()
    assert "No timeline for r" in html


def test_report_on_a_header_only_steps_table_says_why_without_warnings(tiny, tmp_path):
    # a replay writes steps.csv with its header only (a server shows no steps): the timeline
    # was four empty panels, and matplotlib warned "No artists with labels" on stderr
    out = tiny.save(tmp_path / "r")
    (out / "steps.csv").write_text((out / "steps.csv").read_text().splitlines()[0] + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        html = write_report([out]).read_text()
    assert "No timeline for r: its per-step table has no steps" in html
    assert not (out / "figures" / "timeline_r.png").exists()


def test_parquet_tables_equal_the_csv_ones(tmp_path):
    pytest.importorskip("pyarrow")
    r = simserve.run(DATA / "tiny.yaml", record_tokens=True)
    csv = r.save(tmp_path / "csv", tokens=True)
    pq = r.save(tmp_path / "pq", tokens=True, fmt="parquet")
    for name in ("requests", "steps", "tokens"):
        assert not (pq / f"{name}.csv").exists()
        a = pd.read_csv(csv / f"{name}.csv")
        b = pd.read_parquet(pq / f"{name}.parquet")
        assert list(a.columns) == list(b.columns)
        assert len(a) == len(b) > 0
        for col in a.columns:                 # CSV keeps 9 significant digits
            if a[col].dtype.kind == "f" and b[col].dtype.kind == "f":
                assert np.allclose(a[col], b[col], rtol=1e-8, atol=0, equal_nan=True), col
            else:
                # (an all-empty text column reads back from CSV as NaN floats)
                assert (a[col].astype(object).fillna("").astype(str)
                        == b[col].astype(object).fillna("").astype(str)).all(), col
    # typed columns: integer counts stay integers
    assert pd.read_parquet(pq / "requests.parquet")["num_output_tokens"].dtype.kind == "i"
    # the same run written again is the same bytes
    again = r.save(tmp_path / "pq2", tokens=True, fmt="parquet")
    for name in ("requests", "steps", "tokens"):
        assert (pq / f"{name}.parquet").read_bytes() == (again / f"{name}.parquet").read_bytes()
    # a report reads a Parquet run directory
    assert "No timeline" not in write_report([pq]).read_text()
    assert (pq / "figures" / "timeline_pq.png").is_file()


def test_parquet_without_pyarrow_is_one_clear_error(tmp_path, monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else real(name, *a))
    code = main(["run", str(DATA / "tiny.yaml"), "--out", str(tmp_path / "x"),
                 "--format", "parquet", "--quiet", "--no-report"])
    err = capsys.readouterr().err
    assert code == 2 and "pyarrow" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()      # refused before anything ran or was written


def test_startup_imports_no_pandas_asyncio_or_matplotlib():
    """What `simserve run` imports before its simulation starts (the CLI, the runner, the
    scenario) must not include pandas (a third of a second), asyncio or the report."""
    code = ("import sys; import simserve.cli, simserve.runner; "
            "simserve.cli._parser('run'); "             # (the parser `simserve run` builds)
            "from simserve.config import load_scenario; "
            f"load_scenario({str(DATA / 'tiny.yaml')!r}); "
            "print(' '.join(m for m in ('pandas', 'asyncio', 'matplotlib', 'aiohttp') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert proc.stdout.strip() == ""


def _busy_tiny(path: Path) -> Path:
    """tests/data/tiny.yaml with what every part of the summary reads: two replicas (the
    per-replica figures), request classes with their own SLO (per-class figures), prefix
    caching, and prompts past max_model_len (rejections by reason)."""
    import yaml
    raw = yaml.safe_load((DATA / "tiny.yaml").read_text())
    raw["engine"]["enable_prefix_caching"] = True
    raw["workload"]["prompt"] = {"dist": "uniform", "low": 16, "high": 600}
    raw["workload"]["classes"] = [
        {"name": "interactive", "priority": 0, "weight": 1, "slo": {"ttft_ms": 50}},
        {"name": "batch", "priority": 1, "weight": 3}]
    raw["cluster"] = {"replicas": 2, "router": "least_outstanding"}
    path.write_text(yaml.safe_dump(raw))
    return path


def test_summary_of_a_run_imports_no_pandas(tmp_path):
    """A run whose caller needs only the summary (a capacity search, a sweep, `simserve run`)
    builds no DataFrame and never imports pandas, nor does writing its CSV tables; the
    requests table is built on first use, REQUEST_COLUMNS in order. The CSV files are those
    pandas writes from the tables, byte for byte."""
    scenario = _busy_tiny(tmp_path / "s.yaml")
    code = ("import json, sys; import simserve; "
            f"r = simserve.run({str(scenario)!r}, record_tokens=True); r.table(); "
            "before = 'pandas' in sys.modules; "
            f"r.save({str(tmp_path / 'cols')!r}, tokens=True, steps=True); "
            "saved = 'pandas' in sys.modules; "
            "frame = r.requests; "
            "print(json.dumps({'before': before, 'saved': saved, 'after': 'pandas' in "
            "sys.modules, 'columns': list(frame.columns), 'rows': len(frame), "
            "'summary': r.summary}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    out = json.loads(proc.stdout)
    assert out["before"] is False and out["saved"] is False and out["after"] is True
    assert out["columns"] == list(runner.REQUEST_COLUMNS) and out["rows"] == 60
    s = out["summary"]      # (the parts that read the columns were there to be read)
    assert s["num_rejected"] > 0 and set(s["per_class"]) == {"interactive", "batch"}
    assert len(s["per_replica"]) == 2 and s["prefix_cache_query_tokens"] > 0
    r = simserve.run(scenario, record_tokens=True)       # the tables through pandas
    for name, frame in (("requests", r.requests), ("steps", r.steps), ("tokens", r.tokens())):
        runner._write_table(frame, tmp_path / name, "csv")
        assert (tmp_path / "cols" / f"{name}.csv").read_bytes() == \
            (tmp_path / f"{name}.csv").read_bytes(), name


def test_csv_from_columns_is_what_pandas_writes(tmp_path):
    """runner._write_csv against DataFrame.to_csv(float_format="%.9g") on awkward values:
    NaN, infinities, -0.0, tiny and huge floats, 32- and 64-bit integers, text with commas,
    quotes, line breaks, empty and missing; no rows; a lone text column of empty cells; and
    a table with nothing to quote (written without the csv module)."""
    nan, inf = float("nan"), float("inf")
    cases = [
        {"f": np.array([nan, inf, -inf, -0.0, 1e-300, 1e20, 0.1 + 0.2, 1 / 3, 123456789.5]),
         "i32": np.array([0, -1, 2**31 - 1, -2**31, 7, 8, 9, 10, 11], dtype=np.int32),
         "i64": np.array([2**62, -2**63, 0, 1, 2, 3, 4, 5, 6], dtype=np.int64),
         "text": np.array(["a,b", 'say "hi"', "two\nlines", "", None, "ünï", " x", "x ", "-"],
                          dtype=object)},
        {"f": np.empty(0), "text": np.empty(0, dtype=object), "n": np.empty(0, dtype=np.int64)},
        {"only": np.array(["", "", None], dtype=object)},
        # the plain path (no cell to quote): floats near %.9g's switch to exponents and its
        # rounding, integers of one value, of a small range (formatted once each) and a wide one
        {"f": np.array([1e-4, 9.99999999e-5, 999999999.5, 99999999.95, 0.5, 2.5e-9, -1e16]),
         "same": np.full(7, -3), "small": np.array([5, 3, 4, 3, 5, 9, 3], dtype=np.uint8),
         "wide": np.array([0, 10**12, -5, 7, 7, 2**40, 1]),
         "text": np.array(["finished", None, "", "x y", "é", "-", "1e3"], dtype=object)},
    ]
    for i, cols in enumerate(cases):
        assert runner._write_csv(cols, tmp_path / f"ours{i}.csv")
        pd.DataFrame(cols).to_csv(tmp_path / f"pandas{i}.csv", index=False, float_format="%.9g")
        assert (tmp_path / f"ours{i}.csv").read_bytes() == \
            (tmp_path / f"pandas{i}.csv").read_bytes(), cols
    # a column of another type (numbers among text objects): left to pandas, nothing written
    assert not runner._write_csv({"x": np.array([1, "a"], dtype=object)}, tmp_path / "no.csv")
    assert not (tmp_path / "no.csv").exists()


def test_summary_from_columns_equals_summary_from_a_frame(tmp_path, monkeypatch):
    """The summary computed from the run's NumPy columns is the one computed from the
    requests DataFrame (what runner.collect handed the summary before), bit for bit."""
    from simserve.metrics import cluster, summary
    path = _busy_tiny(tmp_path / "s.yaml")
    columns = simserve.run(path)
    frames: list[pd.DataFrame] = []

    def as_frame(f, i):
        """``f`` with its argument ``i`` (the requests) made a DataFrame."""
        def call(*args, **kwargs):
            args = list(args)
            assert isinstance(args[i], dict)               # collect hands over columns
            args[i] = pd.DataFrame(args[i], columns=list(runner.REQUEST_COLUMNS))
            frames.append(args[i])
            return f(*args, **kwargs)
        return call
    monkeypatch.setattr(summary, "summarize", as_frame(summary.summarize, 0))
    monkeypatch.setattr(cluster, "cluster_summary",                 # (rec, replicas, requests)
                        as_frame(cluster.cluster_summary, 2))
    framed = simserve.run(path)
    assert len(frames) == 2
    assert json.dumps(columns.summary, sort_keys=True) == json.dumps(framed.summary,
                                                                   sort_keys=True)
    pd.testing.assert_frame_equal(columns.requests, frames[0])
    pd.testing.assert_frame_equal(columns.requests, framed.requests)


def test_sweep_parquet_keeps_nested_figures_as_json(tmp_path):
    """sweep.parquet (written beside sweep.csv when pyarrow is installed) holds the summary's
    mappings (failed_by_reason: {} on a clean run, which Parquet cannot store) as JSON text."""
    pytest.importorskip("pyarrow")
    import json

    from simserve.plan.sweep import load_sweep, save_sweep
    (tmp_path / "g.yaml").write_text(f"base: {DATA / 'tiny.yaml'}\ngrid: {{seed: [1, 2]}}\n")
    spec = load_sweep(tmp_path / "g.yaml")
    table = simserve.sweep(spec)
    assert any(isinstance(v, dict) for v in table["failed_by_reason"])
    out = save_sweep(table, spec, tmp_path / "out")
    back = pd.read_parquet(out / "sweep.parquet")
    assert len(back) == 2
    assert [json.loads(v) for v in back["failed_by_reason"]] == list(table["failed_by_reason"])
    assert back["request_throughput"].tolist() == table["request_throughput"].tolist()


@pytest.mark.parametrize("record_tokens", [False, True])
def test_resolved_requests_as_columns_give_the_same_results(monkeypatch, record_tokens):
    """Moving resolved requests into columns during the run (every few arrivals here) changes
    nothing a run reports, and keeps only the requests in flight as objects."""
    from simserve.metrics import recorder
    whole = simserve.run(DATA / "tiny.yaml", record_tokens=record_tokens)
    assert whole._recorder.resolved.num_batches == 1     # a few hundred requests: one, at the end
    monkeypatch.setattr(recorder, "COMPACT_MIN", 4)
    live: list[int] = []
    real = recorder.Recorder.compact

    def compact(self):
        real(self)
        live.append(len(self.requests))
    monkeypatch.setattr(recorder.Recorder, "compact", compact)
    often = simserve.run(DATA / "tiny.yaml", record_tokens=record_tokens)
    assert often._recorder.resolved.num_batches > 5
    assert max(live[:-1]) < len(whole.requests) / 4 and live[-1] == 0
    pd.testing.assert_frame_equal(whole.requests, often.requests)
    assert json.dumps(whole.summary, sort_keys=True) == json.dumps(often.summary, sort_keys=True)
    if record_tokens:
        assert all(np.array_equal(a, b)
                   for a, b in zip(whole.token_times, often.token_times, strict=True))


def test_progress_bar_of_a_run_and_its_log_interval(monkeypatch, capsys):
    import io

    from simserve import progress
    monkeypatch.setattr(progress, "DELAY_S", 0)
    r = simserve.run(DATA / "tiny.yaml", progress=True)
    err = capsys.readouterr().err
    n = len(r.requests)
    assert "tiny" in err and f"{n}/{n}" in err and "req" in err
    assert capsys.readouterr().out == ""
    # not a terminal (a log file): at most one line per LOG_INTERVAL_S
    bar = progress.bar(10, "x", "req", stream=io.StringIO())
    assert bar.mininterval == progress.LOG_INTERVAL_S
    bar.close()
    quiet = simserve.run(DATA / "tiny.yaml")       # no bar unless asked
    assert capsys.readouterr().err == ""
    assert quiet.summary == r.summary


def test_default_format_is_csv_up_to_csv_rows_and_parquet_past_it(tiny, tmp_path, monkeypatch):
    """A run of more than CSV_ROWS requests writes Parquet unless asked (pyarrow there), CSV
    otherwise; an explicit format always wins."""
    n = len(tiny.requests)
    out = tiny.save(tmp_path / "small")
    assert (out / "requests.csv").exists() and not (out / "requests.parquet").exists()
    monkeypatch.setattr(runner, "CSV_ROWS", n - 1)         # the same run counted as large
    monkeypatch.setattr(runner, "has_pyarrow", lambda: False)
    assert (tiny.save(tmp_path / "nopa") / "requests.csv").exists()     # no pyarrow: CSV
    pytest.importorskip("pyarrow")
    monkeypatch.setattr(runner, "has_pyarrow", lambda: True)
    out = tiny.save(tmp_path / "large")
    assert (out / "requests.parquet").exists() and not (out / "requests.csv").exists()
    assert len(pd.read_parquet(out / "requests.parquet")) == n
    assert (tiny.save(tmp_path / "asked", fmt="csv") / "requests.csv").exists()
