"""Trace replay: Azure, Mooncake, BurstGPT and plain CSV files into sorted RequestSpecs.

Each reader returns the raw columns on the trace's own clock (seconds); :func:`load_trace` then
does the same thing for every format::

    sort (stable) -> t -= t[first] -> window [start_s, end_s) -> first num_requests
    -> shift so the first kept request is at 0 -> time_scale or rate -> clip lengths

Bad rows are found with vectorised checks; only the first one is reported, as ``file:line``
(1-based lines in the file, header = line 1).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simserve.errors import ConfigError, DataError
from simserve.limits import MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS
from simserve.workload.config import TraceConfig
from simserve.workload.spec import SOURCE_BLOCK_SIZE, RequestSpec


# int64 bounds as floats (2**63 itself is a float, and would wrap to -2**63 in a cast)
INT64_AS_FLOAT = float(np.nextafter(2.0**63, 0))


@dataclass(frozen=True)
class Trace:
    """The loaded requests and how many rows were dropped as failed requests (BurstGPT)."""

    requests: list[RequestSpec]
    num_skipped: int = 0
    has_priority: bool = False                  # the trace gave each request's priority


@dataclass
class _Rows:
    arrival_s: np.ndarray                       # float, the trace's own clock
    prompt: np.ndarray                          # int64
    output: np.ndarray                          # int64
    hash_ids: list[tuple[int, ...] | None] | None = None
    num_skipped: int = 0
    priority: np.ndarray | None = None          # int64, optional column/field
    klass: list[str] | None = None              # request class names, optional column/field


def resolve_path(path: str, base_dir: Path, field: str) -> Path:
    """``path`` made absolute against ``base_dir``; ConfigError naming ``field`` if missing
    or not a file."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base_dir) / p
    if p.is_dir():
        raise ConfigError(field, f"{p} is a directory, not a file")
    if not p.is_file():
        raise ConfigError(field, f"file not found: {p}")
    return p


def load_trace(cfg: TraceConfig, base_dir: Path) -> Trace:
    """Read, window, rescale and clip the trace described by ``cfg``."""
    path = resolve_path(cfg.path, base_dir, "workload.trace")
    rows = _READERS[cfg.format](path, cfg)
    if len(rows.arrival_s) == 0:
        raise DataError(path, "the trace has no requests")

    order = np.argsort(rows.arrival_s, kind="stable")
    t = rows.arrival_s[order] - rows.arrival_s[order[0]]
    keep = np.ones(len(t), dtype=bool)
    if cfg.start_s is not None:
        keep &= t >= cfg.start_s
    if cfg.end_s is not None:
        keep &= t < cfg.end_s
    idx = order[keep][:cfg.num_requests]
    if len(idx) == 0:
        raise DataError(path, f"no requests in the window start_s={cfg.start_s}, "
                              f"end_s={cfg.end_s}; the trace spans 0 to {t[-1]:.3f} s")

    if len(idx) > MAX_REQUESTS:
        raise ConfigError("workload.num_requests", f"the trace keeps {len(idx):,} requests, "
                                                   f"more than the {MAX_REQUESTS:,} a run can "
                                                   "hold; take a window (start_s, end_s) or cap "
                                                   "num_requests")
    arrival = rows.arrival_s[idx] - rows.arrival_s[idx[0]]
    if cfg.rate is not None:
        # Mean rate is (n - 1) / last_arrival: n requests span n - 1 gaps. Dividing by the
        # last arrival first makes the new last arrival exactly (n - 1) / rate.
        if arrival[-1] <= 0:
            raise ConfigError("workload.rate", "cannot rescale the trace: all kept requests "
                              "arrive at the same time")
        arrival = arrival / arrival[-1] * ((len(idx) - 1) / cfg.rate)
    else:
        with np.errstate(over="ignore"):      # an overflow to inf is refused just below
            arrival = arrival * cfg.time_scale
    if not arrival[-1] <= MAX_SECONDS:
        field = "workload.rate" if cfg.rate is not None else "workload.time_scale"
        raise ConfigError(field, f"the kept requests would span {arrival[-1]:.3g} s, more than "
                                 f"the {MAX_SECONDS:g} s a run can represent")
    prompt = rows.prompt[idx]
    output = rows.output[idx]
    if cfg.max_prompt_tokens is not None:
        prompt = np.minimum(prompt, cfg.max_prompt_tokens)
    if cfg.max_output_tokens is not None:
        output = np.minimum(output, cfg.max_output_tokens)
    hashes = [rows.hash_ids[i] for i in idx] if rows.hash_ids is not None else [None] * len(idx)
    prio = rows.priority[idx].tolist() if rows.priority is not None else [0] * len(idx)
    klass = [rows.klass[i] for i in idx] if rows.klass is not None else [""] * len(idx)
    requests = [RequestSpec(i, a, p, o, h, q, k) for i, (a, p, o, h, q, k) in enumerate(
        zip(arrival.tolist(), prompt.tolist(), output.tolist(), hashes, prio, klass))]
    return Trace(requests, rows.num_skipped, rows.priority is not None)


def read_length_columns(path: Path, columns: Sequence[str]) -> list[np.ndarray]:
    """Token-count columns of a lengths CSV (e.g. ShareGPT stats), validated as ints >= 1."""
    df = _read_csv(path, columns)
    if len(df) == 0:
        raise DataError(path, "the lengths file has no rows")
    return [_numeric(df[c], c, path, minimum=1, integer=True, maximum=MAX_TOKENS)
            for c in columns]


# --- CSV helpers -----------------------------------------------------------------------------

def _read_csv(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """Only ``columns`` of a CSV file; DataError for a missing column or an unreadable file."""
    try:
        # the header as written (pandas renames a repeated name 'x.1' and reads the first)
        found = [str(c) for c in pd.read_csv(path, header=None, nrows=1, dtype=str,
                                             keep_default_na=False).iloc[0]]
        twice = [c for c in columns if found.count(c) > 1]
        if twice:
            raise DataError(path, f"column {twice[0]!r} appears twice in the header",
                            _csv_line(path, -1))
        missing = [c for c in columns if c not in found]
        if missing and found and found[0].lstrip().startswith(("{", "[")):
            raise DataError(path, f"missing required column {missing[0]!r}: the file reads "
                                  f"as JSON, not CSV (a Mooncake trace is workload.trace."
                                  f"format: mooncake; a ShareGPT file, workload.lengths."
                                  f"format: sharegpt)")
        if missing:
            raise DataError(path, f"missing required column {missing[0]!r}; "
                                  f"columns found: {', '.join(found)}")
        # All columns are read (not usecols) so that a row with extra fields is an error.
        # index_col=False: a first row with more fields than the header is otherwise read
        # with its first column(s) as the index, every column shifted left (a trailing comma
        # on each row does it); pandas then warns instead, and later long rows are errors
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            df = pd.read_csv(path, index_col=False)
        if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
            raise DataError(path, "the row does not have the same number of fields as the "
                                  "header", _csv_line(path, 0))
        return df[list(columns)]
    except pd.errors.EmptyDataError:
        raise DataError(path, "the file is empty") from None
    except UnicodeDecodeError:
        raise DataError(path, "the file is not UTF-8 text") from None
    except pd.errors.ParserError as e:
        # pandas reports e.g. "Expected 3 fields in line 7, saw 4" with real file lines.
        line = _int_after(str(e), " in line ")
        raise DataError(path, "the row does not have the same number of fields as the header",
                        line) from None


def _csv_line(path: Path, row: int) -> int | None:
    """File line of data row ``row`` (0-based), skipping blank lines as pandas does."""
    seen = -1  # -1 until the header has been passed
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, text in enumerate(fh, 1):
            if text.strip():
                if seen == row:
                    return lineno
                seen += 1
    return None


def _int_after(text: str, marker: str) -> int | None:
    tail = text.partition(marker)[2]
    digits = tail[:len(tail) - len(tail.lstrip("0123456789"))]
    return int(digits) if digits else None


def _numeric(raw: pd.Series, col: str, path: Path, *, minimum: float, integer: bool,
             maximum: float, lines: np.ndarray | None = None) -> np.ndarray:
    """``raw`` as numbers in [``minimum``, ``maximum``] (whole numbers if ``integer``), else
    DataError at the first bad row. ``lines`` maps rows to file lines (JSONL); CSV lines are
    found by scanning."""
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < minimum) | (values > maximum)
        if integer:
            bad |= values != np.floor(values)
    if not bad.any():
        return values.astype(np.int64) if integer else values
    i = int(np.argmax(bad))
    v, original = values[i], raw.iloc[i]
    if pd.isna(original):
        why = f"missing value in column {col!r}"
    elif np.isnan(v):
        why = f"column {col!r} is not a number: {original!r}"
    elif np.isinf(v):
        why = f"column {col!r} is not a finite number: {original!r}"
    elif v < minimum:
        why = f"column {col!r} must be >= {minimum:g}, got {v:g}"
    elif v > maximum:
        bound = f"{int(maximum):,}" if float(maximum).is_integer() else f"{maximum:g}"
        why = f"column {col!r} must be <= {bound}, got {v:g}"
    else:
        why = f"column {col!r} must be a whole number, got {v:g}"
    line = int(lines[i]) if lines is not None else _csv_line(path, i)
    raise DataError(path, why, line)


# --- format readers --------------------------------------------------------------------------

def _read_azure(path: Path, cfg: TraceConfig) -> _Rows:
    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    # "2023-11-16 18:15:46.6805900": whole seconds via pandas, the fraction (7 digits, finer
    # than microseconds; any number of digits is read) as its own float so no precision is lost.
    parts = df["TIMESTAMP"].astype(str).str.extract(
        r"^\s*(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?\s*$")
    whole = pd.to_datetime(parts[0], format="ISO8601", errors="coerce")
    bad = whole.isna().to_numpy() | df["TIMESTAMP"].isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(path, f"bad TIMESTAMP {str(df['TIMESTAMP'].iloc[i])!r}; expected "
                              f"YYYY-MM-DD HH:MM:SS[.fraction]", _csv_line(path, i))
    seconds = (whole - whole.min()).dt.total_seconds().to_numpy()
    fraction = pd.to_numeric(parts[1], errors="coerce").fillna(0.0).to_numpy()
    late = seconds > MAX_SECONDS
    if late.any():
        i = int(np.argmax(late))
        raise DataError(path, f"TIMESTAMP {str(df['TIMESTAMP'].iloc[i])!r} is {seconds[i]:.3g} s "
                              f"after the first; a run spans at most {MAX_SECONDS:g} s",
                        _csv_line(path, i))
    return _Rows(seconds + fraction, *_token_columns(df, path, "ContextTokens",
                                                     "GeneratedTokens"))


def _token_columns(df: pd.DataFrame, path: Path, prompt: str, output: str,
                   output_min: int = 1) -> list[np.ndarray]:
    return [_numeric(df[prompt], prompt, path, minimum=1, integer=True, maximum=MAX_TOKENS),
            _numeric(df[output], output, path, minimum=output_min, integer=True,
                     maximum=MAX_TOKENS)]


def _seconds(raw: pd.Series, col: str, path: Path, scale: float = 1.0,
             lines: np.ndarray | None = None) -> np.ndarray:
    """A time column (in units of ``1 / scale`` seconds) within a run's span."""
    return _numeric(raw, col, path, minimum=0, integer=False, maximum=MAX_SECONDS * scale,
                    lines=lines)


def _priorities(raw: pd.Series, path: Path, lines: np.ndarray | None = None) -> np.ndarray:
    """Whole numbers that fit int64 (1e30 must not wrap around to -2**63)."""
    return _numeric(raw, "priority", path, minimum=-INT64_AS_FLOAT, integer=True,
                    maximum=INT64_AS_FLOAT, lines=lines)


def _read_plain_csv(path: Path, cfg: TraceConfig) -> _Rows:
    try:
        header = [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        header = []   # _read_csv reports it
    optional = [c for c in ("priority", "class") if c in header]
    df = _read_csv(path, ("arrival_s", "prompt_tokens", "output_tokens", *optional))
    return _Rows(_seconds(df["arrival_s"], "arrival_s", path),
                 *_token_columns(df, path, "prompt_tokens", "output_tokens"),
                 priority=(_priorities(df["priority"], path) if "priority" in optional
                           else None),
                 klass=(df["class"].fillna("").astype(str).tolist() if "class" in optional
                        else None))


def _read_burstgpt(path: Path, cfg: TraceConfig) -> _Rows:
    cols = ["Timestamp", "Request tokens", "Response tokens"] + (["Model"] if cfg.model else [])
    df = _read_csv(path, cols)
    t = _seconds(df["Timestamp"], "Timestamp", path)
    # Response tokens == 0 marks a failed request in BurstGPT: allowed here, dropped below.
    prompt, output = _token_columns(df, path, "Request tokens", "Response tokens", output_min=0)
    keep = np.ones(len(df), dtype=bool)
    if cfg.model:
        keep = (df["Model"] == cfg.model).to_numpy()
        if not keep.any():
            models = ", ".join(sorted(map(str, df["Model"].dropna().unique())))
            raise DataError(path, f"no rows with Model {cfg.model!r} (workload.model); "
                                  f"models found: {models}")
    failed = keep & (output == 0)
    keep = keep & ~failed
    return _Rows(t[keep], prompt[keep], output[keep], num_skipped=int(failed.sum()))


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys repeat is refused: json keeps the last silently, so which
    value was meant is a guess."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return obj


def _read_mooncake(path: Path, cfg: TraceConfig) -> _Rows:
    keys = ("timestamp", "input_length", "output_length")
    cols: dict[str, list] = {k: [] for k in keys}
    hashes: list[tuple[int, ...] | None] = []
    priority: list[int] = []
    klass: list[str] = []
    saw_priority = False
    lines: list[int] = []
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is not part of line 1's
        # JSON; the CSV readers (pandas) skip it too
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, text in enumerate(fh, 1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                    # each key in the line has its colon: as many colons as keys kept means
                    # no key repeats (nor any nested one); else parsed again, checking (a
                    # colon inside a string, or a nested object, costs only that)
                    if type(obj) is dict and text.count(":") > len(obj):
                        json.loads(text, object_pairs_hook=_unique_keys)
                except json.JSONDecodeError:
                    raise DataError(path, "the line is not valid JSON", lineno) from None
                except _DuplicateKey as e:
                    raise DataError(path, f"field {e.args[0]!r} appears twice in the line's "
                                          f"object", lineno) from None
                except RecursionError:
                    raise DataError(path, "the line's JSON is nested too deeply", lineno) from None
                if not isinstance(obj, dict):
                    raise DataError(path, "expected one JSON object per line", lineno)
                for k in keys:
                    if k not in obj:
                        raise DataError(path, f"missing required field {k!r}; fields found: "
                                              f"{', '.join(obj)}", lineno)
                    v = obj[k]
                    if isinstance(v, str):
                        # a JSON trace's numbers are JSON numbers: "1000" is text (a field
                        # written wrong, or not this format), never read as 1000
                        raise DataError(path, f"field {k!r} must be a JSON number, got the "
                                              f"string {v[:40]!r}", lineno)
                    if isinstance(v, bool) or not isinstance(v, (int, float, type(None))):
                        # true is not 1 (as in scenario files); a list is not a length
                        raise DataError(path, f"field {k!r} is not a number: {v!r}"[:200],
                                        lineno)
                    if type(v) is float and not math.isfinite(v):
                        # Python's json reads NaN, Infinity, -Infinity; NaN is not a gap
                        raise DataError(path, _not_finite(k, v), lineno)
                    if isinstance(v, int) and not -2**63 <= v < 2**63:   # JSON ints are unbounded
                        raise DataError(path, f"field {k!r} is out of range: "
                                              f"{str(v)[:20]}... ({len(str(v))} digits)", lineno)
                    cols[k].append(v)
                h = obj.get("hash_ids")
                if h is not None and (not isinstance(h, list) or any(
                        type(x) is not int or not -2**63 <= x < 2**63 for x in h)):
                    # within int64: vllm_native turns them into a numpy int64 array
                    raise DataError(path, "hash_ids must be a list of integers within int64",
                                    lineno)
                hashes.append(tuple(h) if h is not None else None)
                q, c = obj.get("priority", 0), obj.get("class", "")
                if type(q) is float and not math.isfinite(q):
                    raise DataError(path, _not_finite("priority", q), lineno)
                if type(q) is not int or not -2**63 <= q < 2**63:
                    raise DataError(path, f"priority must be an integer within int64, got "
                                          f"{q!r}", lineno)
                if not isinstance(c, str):
                    raise DataError(path, f"class must be a string, got {c!r}", lineno)
                saw_priority = saw_priority or "priority" in obj
                priority.append(q)
                klass.append(c)
                lines.append(lineno)
    except UnicodeDecodeError:
        raise DataError(path, "the file is not UTF-8 text") from None
    at = np.asarray(lines)

    def column(k: str) -> pd.Series:
        return pd.Series(cols[k], dtype=object)

    def tokens(k: str) -> np.ndarray:
        return _numeric(column(k), k, path, minimum=1, integer=True, maximum=MAX_TOKENS,
                        lines=at)

    prompt = tokens("input_length")
    _check_hash_counts(hashes, prompt, path, at)
    return _Rows(_seconds(column("timestamp"), "timestamp", path, 1000.0, at) / 1000.0,  # ms
                 prompt, tokens("output_length"),
                 hash_ids=hashes if any(h is not None for h in hashes) else None,
                 priority=np.asarray(priority, dtype=np.int64) if saw_priority else None,
                 klass=klass if any(klass) else None)


def _not_finite(field: str, v: float) -> str:
    """A JSON trace's NaN or +-Infinity as the file spells it (json.dumps: NaN, Infinity)."""
    return f"field {field!r} is not a finite number: {json.dumps(v)}"


def _check_hash_counts(hashes: list[tuple[int, ...] | None], prompt: np.ndarray, path: Path,
                       lines: np.ndarray) -> None:
    """A row names one hash id per 512-token block of its prompt, the last one partial: more
    ids than ``ceil(input_length / 512)`` name blocks past the prompt's end, which no engine
    writes (the trace is inconsistent, or input_length is not the prompt's length)."""
    for i, h in enumerate(hashes):
        if h is None:
            continue
        blocks = -(-int(prompt[i]) // SOURCE_BLOCK_SIZE)
        if len(h) > blocks:
            raise DataError(path, f"hash_ids has {len(h):,} entries, more than the {blocks:,} "
                                  f"blocks of {SOURCE_BLOCK_SIZE} tokens that input_length "
                                  f"{int(prompt[i]):,} fills", int(lines[i]))


_READERS = {"azure": _read_azure, "mooncake": _read_mooncake, "burstgpt": _read_burstgpt,
            "csv": _read_plain_csv}
