"""Progress bars with an ETA (tqdm) for long runs, sweeps, compare files and capacity searches.

``tqdm.auto`` draws a widget in Jupyter (where ipywidgets is installed) and a text bar
elsewhere; on a terminal the bar is
redrawn in place a few times a second, and in a log that is not a terminal (CI, ``nohup``,
``2> log``) a line is written at most every ``LOG_INTERVAL_S`` seconds, so a long run leaves a
readable trail instead of thousands of carriage returns. A bar shows only once its work has
run ``DELAY_S`` seconds: short runs (and every test) print nothing extra. Bars go to stderr,
never to stdout (which carries the results). tqdm is imported on first use, not at start-up.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, TextIO

DELAY_S = 1.0          # a bar appears only for work that has run this long
LOG_INTERVAL_S = 30.0  # at most one line per this many seconds when stderr is not a terminal


def bar(total: int | None, desc: str, unit: str, *, stream: TextIO | None = None,
        disable: bool = False) -> Any:
    """A tqdm bar (``update(n)``, ``close()``, usable as a context manager); ``total=None``
    counts without an ETA."""
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm   # a widget in Jupyter, text elsewhere
    else:    # (tqdm.auto warns in Jupyter without ipywidgets: plain text there too)
        from tqdm import tqdm
    stream = stream or sys.stderr
    tty = getattr(stream, "isatty", lambda: False)()
    return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=disable,
                delay=DELAY_S, mininterval=0.2 if tty else LOG_INTERVAL_S,
                dynamic_ncols=tty, leave=True)
