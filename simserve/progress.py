"""Progress bars with an ETA (tqdm) for long runs, sweeps, compare files and capacity searches.

``tqdm.auto`` draws a widget in Jupyter (where ipywidgets is installed) and a text bar
elsewhere; on a terminal the bar is
redrawn in place a few times a second, and in a log that is not a terminal (CI, ``nohup``,
``2> log``) a whole line is written at most every ``LOG_INTERVAL_S`` seconds (lines printed
beside the bar included) and one with the final count, so a long run leaves a readable trail
instead of thousands of carriage returns. A bar shows only once its work has
run ``DELAY_S`` seconds: short runs (and every test) print nothing extra. Bars go to stderr,
never to stdout (which carries the results). tqdm is imported on first use, not at start-up.
"""

from __future__ import annotations

import functools
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
    widget = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
    if tty or widget:
        return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=disable,
                    delay=DELAY_S, mininterval=0.2, dynamic_ncols=tty, leave=True)
    return _log_bar()(total=total, desc=desc, unit=unit, file=stream, disable=disable,
                      delay=DELAY_S, mininterval=LOG_INTERVAL_S, leave=False)


@functools.cache
def _log_bar() -> Any:
    """A tqdm bar for a log: whole lines, at most one per ``LOG_INTERVAL_S``, never a ``\r``.
    tqdm alone redraws in place and also whenever a line is printed beside the bar
    (``external_write_mode`` clears and refreshes it, whatever ``mininterval`` says)."""
    from tqdm import tqdm

    class LogBar(tqdm):  # type: ignore[misc]
        lines = 0

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg == "":                 # a clear: a log line has nothing to erase
                return False
            now = self.format_dict["elapsed"]    # seconds since the bar started
            if msg is None and now - (self.last_line_s if self.lines else 0.0) < LOG_INTERVAL_S:
                return False
            return self._line(msg)

        def _line(self, msg: str | None = None) -> bool:
            self.fp.write((self.__str__() if msg is None else msg) + "\n")
            self.fp.flush()
            self.last_line_s, self.lines = self.format_dict["elapsed"], self.lines + 1
            return True

        def clear(self, nolock: bool = False) -> None:
            pass

        def close(self) -> None:
            # the closing count, where tqdm's leave=True would show it: once a line was
            # written, or the bar was due to show (its work ran past ``delay``)
            if not self.disable and (self.lines or self.format_dict["elapsed"] >= self.delay):
                self._line()
            super().close()               # leave=False: its clearing display() writes nothing

    return LogBar
