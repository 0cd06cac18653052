"""Numbers as people read them: ``11,150`` not ``1.115e+04``, ``14.6`` not ``14.612113``.

One rule for every table we print or render (CLI tables, the report's tables, notebooks): about
three significant digits, thousands separators, no exponent for anything a run produces, and a
dash for a missing value (never ``None`` or ``nan``). The data behind a table keeps full
precision (CSV files, DataFrames); only the display is rounded.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import Any

import pandas as pd

from simserve.errors import SimserveError

MISSING = "–"


def human(x: Any) -> str:
    """One value for display (see the module docstring)."""
    if x is None or isinstance(x, str):
        return MISSING if x is None or x == "" else x
    if isinstance(x, bool):
        return "yes" if x else "no"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return MISSING
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if float(v).is_integer() and (isinstance(x, int) or abs(v) >= 100 or
                                  getattr(x, "dtype", None) is not None and x.dtype.kind in "iu"):
        return f"{int(v):,}"
    a = abs(v)
    # (by what each format rounds to: 99.97 is "100", as 100 is, not "100.0")
    if a >= 99.95:
        return f"{v:,.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 1e-3:
        return f"{v:.3g}"
    return "0" if a == 0 else f"{v:.2g}"


# the words of a column's name that say its values are fractions shown as percentages
PERCENT_WORDS = ("attainment", "KV use", "hit rate")


def attainment_percent(df: pd.DataFrame) -> pd.DataFrame:
    """SLO attainment, KV use and the prefix-cache hit rate shown as every display shows them,
    as percentages: each numeric column whose name says so (a fraction in the data:
    summary.json, CSV files) times 100, its name ending in ``(%)``. Columns already so named,
    and yes/no columns, are left alone."""
    cols = {c: f"{c} (%)" for c in df.columns
            if isinstance(c, str) and any(w in c for w in PERCENT_WORDS) and "%" not in c
            and _fractions(df[c])}
    if not cols:
        return df
    return df.assign(**{c: [None if v is None or v != v else v * 100 for v in df[c]]
                        for c in cols}).rename(columns=cols)


def _fractions(column: pd.Series) -> bool:
    """Numbers (missing ones allowed), not yes/no."""
    values = [v for v in column if v is not None and not (isinstance(v, float) and v != v)]
    return bool(values) and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                for v in values)


def format_table(df: pd.DataFrame | pd.Series, index: bool = True) -> str:
    """A DataFrame as aligned text with :func:`human` numbers (for the console); attainment
    as a percentage (:func:`attainment_percent`)."""
    shown = attainment_percent(_frame("format_table", df)).astype(object).map(human)
    return shown.to_string(index=index)


def _frame(fn: str, df: object) -> pd.DataFrame:
    """A table to show: a DataFrame, or a Series as a frame of its one column; anything else
    (a Result, a dict) refused by name rather than failing inside pandas."""
    if isinstance(df, pd.Series):
        return df.to_frame()
    if not isinstance(df, pd.DataFrame):
        raise SimserveError(f"{fn}: expected a pandas DataFrame or Series, got "
                            f"{type(df).__name__}")
    return df


def styled(df: pd.DataFrame | pd.Series):
    """The DataFrame with :func:`human` numbers when displayed in Jupyter (a pandas Styler;
    the data is unchanged). Its HTML id comes from the data, so a notebook's saved output does
    not change from one run to the next. A Styler needs jinja2, which a bare kernel
    (ipykernel alone, as VS Code runs one) lacks: then a DataFrame of the same numbers as
    text, as :func:`format_table` prints them."""
    df = _frame("styled", df)
    try:
        import jinja2  # noqa: F401  (only to know whether pandas' Styler can render)
    except ImportError:
        return attainment_percent(df).astype(object).map(human)
    digest = hashlib.sha1(pd.util.hash_pandas_object(df.astype(str)).values.tobytes())
    df = attainment_percent(df)
    return df.style.format(human).set_uuid(digest.hexdigest()[:10])
