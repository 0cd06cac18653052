"""One exception family for everything a user can get wrong.

The CLI catches :class:`SimserveError` and prints its message alone (no traceback) with a
non-zero exit code. Every message names where the problem is: a scenario field path such as
``engine.max_num_seqs``, or a file and line such as ``trace.csv:17``.
"""

from __future__ import annotations


class SimserveError(Exception):
    """A problem with the user's input or environment, reported as one clear message."""


class ConfigError(SimserveError):
    """A scenario field is missing, unknown, of the wrong type or out of range."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class DataError(SimserveError):
    """A data file (trace, lengths file, model card, profile) is unreadable or malformed."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
