"""Resolved requests as columns: what a run keeps of each request once it is over.

A request in flight is a :class:`~simserve.sched.request.Request` object (the scheduler's
counters); once it is resolved (finished, rejected or failed: nothing changes it any more) all
the metrics need of it is one row of numbers. :class:`RequestColumns` takes resolved requests
in batches (``take``) and keeps them as typed NumPy chunks, about 90 bytes a request instead of
a Python object graph of several hundred, so a run's memory follows the requests in flight,
not all the requests ever seen (the recorder hands it its resolved requests from time to time:
``Recorder.add_request``). ``table`` returns the columns in request-id order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from simserve.sched.request import Status

if TYPE_CHECKING:
    from simserve.sched.request import Request

RESOLVED = (Status.FINISHED, Status.REJECTED, Status.FAILED)
_NAN = float("nan")
_TYPECODES = {"q": "q", "l": "q", "d": "d", "i": "i"}   # NumPy type char -> array typecode

# column -> (dtype, how it is read off a Request); the times are NaN where they do not apply
_NUMERIC: dict[str, tuple[Any, Any]] = {
    "request_id": (np.int64, attrgetter("id")),
    "replica": (np.int64, attrgetter("replica")),
    "arrival_s": (np.float64, attrgetter("spec.arrival_s")),
    "num_prompt_tokens": (np.int64, attrgetter("num_prompt_tokens")),
    "num_output_tokens": (np.int64, attrgetter("num_output_tokens")),
    "first_scheduled_s": (np.float64, lambda r: _NAN if r.first_scheduled_s is None
                          else r.first_scheduled_s),
    "first_token_s": (np.float64, lambda r: r.first_token_s if r.status is Status.FINISHED
                      else _NAN),
    "finish_s": (np.float64, lambda r: r.finish_s if r.status is Status.FINISHED else _NAN),
    "num_preemptions": (np.int64, attrgetter("num_preemptions")),
    "priority": (np.int64, attrgetter("spec.priority")),
    "num_cached_tokens": (np.int64, attrgetter("num_cached_tokens")),
}
# text columns: a small code per request, the distinct strings kept once
_TEXT: dict[str, Any] = {
    "status": lambda r: r.status.value,
    "reject_reason": attrgetter("reject_reason"),
    "class": attrgetter("spec.klass"),
}


class RequestColumns:
    """Resolved requests, column by column (see the module docstring)."""

    def __init__(self, keep_tracks: bool = False) -> None:
        # one growing typed array per column (appended to in place: no chunks to join, and a
        # large array's memory goes back to the system when it is freed)
        self.columns: dict[str, array[Any]] = {
            c: array(_TYPECODES[np.dtype(dtype).char]) for c, (dtype, _) in _NUMERIC.items()}
        self.columns.update({c: array("i") for c in _TEXT})
        self.sorted: dict[str, np.ndarray] = {}     # the rows ``table`` has sorted already
        self.num_batches = 0                     # takes of at least one request
        self.words: dict[str, dict[str, int]] = {c: {} for c in _TEXT}
        self.keep_tracks = keep_tracks          # each row's TokenTrack (tokens.csv)
        self.tracks: list[Any] = []
        self.num_rows = 0
        # speculative decoding's counts, summed over the requests taken (the summary needs
        # only their totals: metrics.summary.spec_decode_summary)
        self.spec_totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self.spec_per_position: list[int] = []

    def take(self, reqs: Sequence[Request]) -> dict[str, np.ndarray]:
        """Add resolved requests (their order does not matter: ``table`` sorts by id); returns
        their rows as arrays (numeric columns)."""
        n = len(reqs)
        if not n:
            return {}
        chunk = {c: np.fromiter(map(read, reqs), dtype=dtype, count=n)
                 for c, (dtype, read) in _NUMERIC.items()}
        for c, values in chunk.items():
            self.columns[c].frombytes(values.tobytes())
        for c, read in _TEXT.items():
            codes = self.words[c]
            self.columns[c].extend(codes.setdefault(w, len(codes)) for w in map(read, reqs))
        self.num_batches += 1
        totals, per = self.spec_totals, self.spec_per_position
        for r in reqs:
            if r.num_drafts:
                totals["num_drafts"] += r.num_drafts
                totals["num_draft_tokens"] += r.num_draft_tokens
                totals["num_accepted_tokens"] += r.num_accepted_tokens
            if r.accepted_per_position is not None:
                if len(per) < len(r.accepted_per_position):
                    per.extend([0] * (len(r.accepted_per_position) - len(per)))
                for i, a in enumerate(r.accepted_per_position):
                    per[i] += a
        if self.keep_tracks:
            self.tracks.extend(r.tokens if r.status is Status.FINISHED else None for r in reqs)
        self.num_rows += n
        return chunk

    def table(self) -> tuple[dict[str, np.ndarray], list[Any] | None]:
        """Every column in request-id order (text columns as object arrays of their strings),
        and each row's token track where kept. Sorted one column at a time, each column's
        array freed as its sorted copy is made (the sorted columns are kept: ``sorted``)."""
        ids = self._joined("request_id")
        order = np.argsort(ids, kind="stable")
        in_order = bool(np.all(order == np.arange(len(order))))
        for c in self.columns:
            v = ids if c == "request_id" else self._joined(c)
            self.sorted[c] = v if in_order else v[order]
            del v
        del ids
        out: dict[str, np.ndarray] = {}
        for c, v in self.sorted.items():
            if c in _TEXT:
                words = np.empty(len(self.words[c]), dtype=object)
                words[:] = list(self.words[c])
                v = words[v]
            out[c] = v
        tracks = None
        if self.keep_tracks:
            if not in_order:
                self.tracks = [self.tracks[i] for i in order]
            tracks = self.tracks
        return out, tracks

    def _joined(self, c: str) -> np.ndarray:
        """Column ``c``: the rows sorted before, then those taken since (their array emptied)."""
        a = self.columns[c]
        self.columns[c] = array(a.typecode)
        dtype = _NUMERIC[c][0] if c in _NUMERIC else np.int32
        new = np.frombuffer(a, dtype=dtype) if len(a) else np.empty(0, dtype=dtype)
        old = self.sorted.get(c)
        return new if old is None else np.concatenate([old, new])


def resolved(reqs: Iterable[Request]) -> tuple[list[Request], list[Request]]:
    """``reqs`` split into (resolved, still in flight), each in the order given."""
    done: list[Request] = []
    live: list[Request] = []
    for r in reqs:
        (done if r.status in RESOLVED else live).append(r)
    return done, live
