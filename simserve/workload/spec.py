"""The workload's output: immutable request specifications, sorted by arrival."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

# prompt tokens per trace hash id (Mooncake's block: equal ids, identical content); the prefix
# cache (kv/prefix.py) derives each engine block's content from the ids it overlaps
SOURCE_BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a client sends: when, how long the prompt is, how many tokens it wants back.

    ``num_output_tokens`` is exact (the replay client sends ``max_tokens = min_tokens`` with
    ``ignore_eos``), so the simulator and a real server produce the same number of tokens.
    ``hash_ids`` are optional prefix-block ids from a trace (Mooncake: one id per 512 prompt
    tokens; equal ids mean identical content), used by prefix caching. ``priority`` (lower value
    = served first, as vLLM's ``priority``) and ``klass`` (the request class's name, for
    per-class SLOs and goodput) come from ``workload.classes`` or a trace's columns.
    """

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    priority: int = 0
    klass: str = ""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_prompt_tokens must be >= 1")
        if self.num_output_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_output_tokens must be >= 1")
        if self.arrival_s < 0:
            raise ValueError(f"request {self.request_id}: arrival_s must be >= 0")


_new = object.__new__
# RequestSpec's slots, set as its frozen __init__ sets them, without the checks of
# __post_init__ (SpecColumns checks whole columns when made): a third of the cost of
# RequestSpec(...), and a run of a million requests makes a million of them
_SET_SLOTS = tuple(getattr(RequestSpec, f).__set__ for f in (
    "request_id", "arrival_s", "num_prompt_tokens", "num_output_tokens", "hash_ids", "priority",
    "klass"))


def _checked(request_id: int, arrival_s: float, num_prompt_tokens: int,
             num_output_tokens: int, hash_ids: tuple[int, ...] | None, priority: int,
             klass: str) -> RequestSpec:
    """``RequestSpec(...)`` of values already checked (SpecColumns: see ``_SET_SLOTS``)."""
    spec = _new(RequestSpec)
    a, b, c, d, e, f, g = _SET_SLOTS
    a(spec, request_id)
    b(spec, arrival_s)
    c(spec, num_prompt_tokens)
    d(spec, num_output_tokens)
    e(spec, hash_ids)
    f(spec, priority)
    g(spec, klass)
    return spec


class SpecColumns(Sequence[RequestSpec]):
    """A synthetic workload's requests as columns, each :class:`RequestSpec` made when it is
    read (about 30 bytes a request instead of some 250 for the objects: what lets a run of
    millions of requests keep memory for the requests in flight only). Ids are 0..n-1 in
    arrival order; ``hash_ids`` the one tuple every request shares (a synthetic shared prefix)
    or None; ``classes`` the (priority, name) of each request class, ``klass`` each request's
    index into it."""

    __slots__ = ("arrival_s", "prompt", "output", "hash_ids", "klass", "classes", "table",
                 "tables")

    def __init__(self, arrival_s: Sequence[float], prompt: Sequence[int],
                 output: Sequence[int], hash_ids: tuple[int, ...] | None = None,
                 klass: Sequence[int] | None = None,
                 classes: Sequence[tuple[int, str]] = (),
                 hash_tables: tuple[Sequence[int], Sequence[tuple[int, ...]]] | None = None):
        # array.array: reading an element gives a Python number at once (no numpy scalar)
        self.arrival_s = _array("d", arrival_s)
        self.prompt = _array("q", prompt)
        self.output = _array("q", output)
        self.hash_ids = hash_ids
        self.klass = _array("i", klass) if klass is not None else None
        self.classes = tuple(classes)
        # per-request hash_ids: request i's are tables[table[i]] (a few shared tuples)
        self.table = _array("i", hash_tables[0]) if hash_tables is not None else None
        self.tables = tuple(hash_tables[1]) if hash_tables is not None else ()
        n = len(self.arrival_s)
        if len(self.prompt) != n or len(self.output) != n or (
                self.klass is not None and len(self.klass) != n) or (
                self.table is not None and len(self.table) != n):
            raise ValueError("SpecColumns: columns of different lengths")
        # the checks RequestSpec makes, on whole columns; the first bad row raises its error
        # (and __getitem__ makes specs without them)
        for col, low in ((self.prompt, 1), (self.output, 1), (self.arrival_s, 0)):
            if n and min(col) < low:
                i = next(i for i, v in enumerate(col) if v < low)
                RequestSpec(i, self.arrival_s[i], self.prompt[i], self.output[i])

    def __len__(self) -> int:
        return len(self.arrival_s)

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, i: slice) -> list[RequestSpec]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        hash_ids = self.hash_ids if self.table is None else self.tables[self.table[i]]
        if self.klass is None:
            return _checked(i, self.arrival_s[i], self.prompt[i], self.output[i], hash_ids, 0,
                            "")
        priority, name = self.classes[self.klass[i]]
        return _checked(i, self.arrival_s[i], self.prompt[i], self.output[i], hash_ids,
                        priority, name)

    def __iter__(self) -> Iterator[RequestSpec]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (SpecColumns, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None   # type: ignore[assignment]   (mutable-sized like a list: unhashable)


def longest_request(specs: Sequence[RequestSpec]) -> int:
    """The most tokens any request holds (its prompt and output), 0 for none."""
    if isinstance(specs, SpecColumns):
        if not len(specs):
            return 0
        prompt, output = (np.frombuffer(a, dtype=np.int64) for a in (specs.prompt, specs.output))
        return int((prompt + output).max())
    return max((s.num_prompt_tokens + s.num_output_tokens for s in specs), default=0)


def _array(typecode: str, values: Any) -> array:
    """``values`` (a NumPy array or any sequence) as an ``array.array``, copied as one block
    when it is a NumPy array of the same item type."""
    out = array(typecode)
    dtype = getattr(values, "dtype", None)
    if dtype is not None and dtype.kind in "fiu":
        out.frombytes(values.astype(f"={typecode}", copy=False).tobytes())
        return out
    out.extend(values)
    return out
