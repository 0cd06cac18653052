"""Timing, the measurement grids, and the run that turns a model's shapes into a profile.

Every timing is the median of warmed-up repeats with its 10th/90th percentiles. On CUDA each
repeat is bracketed by ``torch.cuda.Event``s (GPU time, no host sync inside the repeat loop); on
CPU by ``time.perf_counter`` with ``torch.set_num_threads`` fixed by the caller. A point whose
repeats run past the point budget stops at 3 repeats, so a slow corner of the full grid cannot take
the whole run.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Callable

import torch
import torch.nn.functional as F

from profiler import attention as attn
from profiler.layers import (DTYPES, DecoderLayer, Model, PagedKVCache, Sections, StepMeta,
                             blocks_needed, build_step, make_top_p, rms_norm,
                             sample_greedy)
from profiler.moe import MoEShapes, measure_moe
from simserve.cards import ModelCard
from simserve.latency.schema import KIND, SCHEMA_VERSION, model_shapes

MIN_REPEATS = 3
WHOLE_STEP = "step"     # Timer.rounds: a step's whole time beside its parts

# CPU clocks by the name ``settings.timer`` records. With one torch thread every kernel runs on
# the calling thread, so its CPU time is the step's uncontended time: on a shared machine, time
# the scheduler gives other processes is left out (wall time of a 1.8 ms GEMM measured 2.1 ms at
# the median and 10 ms at p90 with the load average at 5; thread time 1.8 and 2.0 ms).
CLOCKS: dict[str, Callable[[], float]] = {"perf_counter": time.perf_counter,
                                          "thread_time": time.thread_time}


@dataclass(frozen=True)
class Stat:
    median: float
    p10: float
    p90: float
    n: int


def _stat(times: list[float]) -> Stat:
    """Median, 10th and 90th percentile of ``times`` (sorted in place)."""
    times.sort()
    return Stat(_quantile(times, 0.5), _quantile(times, 0.1), _quantile(times, 0.9), len(times))


def _quantile(sorted_xs: list[float], q: float) -> float:
    pos = q * (len(sorted_xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


class Timer:
    """``clock`` (CPU only): ``time.perf_counter`` (wall) or ``time.thread_time`` (CPU time of
    the measuring thread: with one torch thread the work runs on the calling thread, so time
    the OS gave to other processes is left out; see :data:`CLOCKS`)."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, budget_s: float,
                 clock: Callable[[], float] = time.perf_counter, graphs: bool = False):
        self.device, self.warmup, self.repeats, self.budget_s = device, warmup, repeats, budget_s
        self.clock = clock
        # CUDA only: capture each step (or op) once as a CUDA graph and time its replays, as
        # vLLM replays captured graphs: eager launches from Python would time the host, not the
        # GPU (an 8B model's one-token step measured 30 ms eager on an H100)
        self.graphs = graphs and device.type == "cuda"
        self.graph_failures: dict[str, int] = {}    # why a capture failed -> times (eager used)
        self.coverage: list[float] = []     # per replay: sum of a graph's parts / replay time

    def __call__(self, fn: Callable[[], Any]) -> Stat:
        if self.graphs:
            got = self._try_graph(lambda: self._graph_call(fn))
            if got is not None:
                return got
        start = time.perf_counter()
        for _ in range(self.warmup):
            fn()
            _sync(self.device)
            # one warm-up call is enough for a slow point (allocator, caches, compile are warm)
            if time.perf_counter() - start > self.budget_s / 3:
                break
        return _stat(self._cuda(fn) if self.device.type == "cuda" else self._cpu(fn))

    def sections(self, fn: Callable[[Sections], Any]) -> dict[str, Stat]:
        """Median and spread of each part of a step over warmed-up repeats, and of the whole
        step (``WHOLE_STEP``): ``fn(sections)`` runs one step that marks its parts
        (:class:`~profiler.layers.Sections`)."""
        if self.graphs:
            got = self._try_graph(lambda: self._graph_sections(fn))
            if got is not None:
                return got
        rec = Sections(self.device, self.clock)
        start = time.perf_counter()
        for _ in range(self.warmup):
            fn(rec)
            rec.result()
            if time.perf_counter() - start > self.budget_s / 3:
                break
        samples: dict[str, list[float]] = {}
        n = 0
        start = time.perf_counter()
        while n < self.repeats:
            fn(rec)
            parts = rec.result()
            parts[WHOLE_STEP] = sum(parts.values())
            for name, seconds in parts.items():
                samples.setdefault(name, []).append(seconds)
            n += 1
            if n >= MIN_REPEATS and time.perf_counter() - start > self.budget_s:
                break
        return {name: _stat(times) for name, times in samples.items()}

    def rounds(self, steps: list[tuple[Callable[[], None], Callable[[Sections], Any]]],
               seed: int = 0, on_round: Callable[[int, int], None] | None = None,
               warm: bool = False) -> list[dict[str, Stat]]:
        """Like :meth:`sections` for many steps at once, measured in *rounds*: each round runs
        every step once, in a fresh random order, so that a slow spell of a shared machine
        spreads over all of them instead of biasing the few measured during it, and each step
        follows some other step (as in a server); each step's whole time (the sum of its
        parts) is kept too, as ``WHOLE_STEP``. ``steps`` are ``(prepare, run)`` pairs:
        ``prepare()`` (the attention backend's per-step metadata, untimed) goes right before
        each ``run(sections)``. The first ``warmup`` rounds are not kept; rounds stop after
        ``repeats``, or after ``MIN_REPEATS`` once the family has used its time budget
        (``budget_s`` per step). ``on_round(done, total)`` after each round. With ``warm``
        each step runs twice in a row and only the second is kept: in a server consecutive
        steps are alike, so a step finds what it needs where the step before left it, not
        where a step of another size did."""
        rec = Sections(self.device, self.clock)
        rng = random.Random(seed)
        order = list(range(len(steps)))
        samples: list[dict[str, list[float]]] = [{} for _ in steps]
        total = self.warmup + self.repeats
        start = time.perf_counter()
        for r in range(total):
            rng.shuffle(order)
            for i in order:
                prepare, run = steps[i]
                prepare()
                if warm:
                    run(rec)
                    rec.result()
                run(rec)
                parts = rec.result()
                if r >= self.warmup:
                    parts[WHOLE_STEP] = sum(parts.values())
                    for name, seconds in parts.items():
                        samples[i].setdefault(name, []).append(seconds)
            kept = r + 1 - self.warmup
            if on_round is not None:
                on_round(r + 1, total)
            if kept >= MIN_REPEATS and \
                    time.perf_counter() - start > self.budget_s * len(steps):
                if on_round is not None and r + 1 < total:
                    on_round(total, total)
                break
        return [{name: _stat(times) for name, times in got.items()} for got in samples]

    # ---- CUDA graphs

    def _try_graph(self, measure: Callable[[], Any]) -> Any:
        """``measure()``, or None (and the reason counted) when capturing fails: that point is
        then timed eagerly, and the profile says how many were."""
        try:
            return measure()
        except Exception as e:  # noqa: BLE001 - any capture failure means "time it eagerly"
            torch.cuda.synchronize()
            if isinstance(e, attn.BackendError):
                raise
            why = attn._root_cause(e)
            if why not in self.graph_failures:    # said at once: the log keeps it if we die
                print(f"profiler: CUDA graph capture failed ({why}); timing that point "
                      "eagerly", file=sys.stderr)
            self.graph_failures[why] = self.graph_failures.get(why, 0) + 1
            return None

    def _capture(self, fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
        """Warm ``fn`` up eagerly (compiles, allocator, library handles; once on a side stream,
        as torch.cuda.graphs asks before a capture), then capture it."""
        start = time.perf_counter()
        for _ in range(max(1, self.warmup)):
            fn()
            torch.cuda.synchronize()
            if time.perf_counter() - start > self.budget_s / 3:
                break
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph

    def _replays(self, graph: torch.cuda.CUDAGraph,
                 after: Callable[[float], None]) -> None:
        """Replay ``graph`` ``repeats`` times (at least ``MIN_REPEATS``, within the budget);
        ``after(replay_seconds)`` reads each replay, timed by events outside the graph."""
        start = time.perf_counter()
        n = 0
        while n < self.repeats:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            after(a.elapsed_time(b) / 1000.0)
            n += 1
            if n >= MIN_REPEATS and time.perf_counter() - start > self.budget_s:
                break

    def _graph_call(self, fn: Callable[[], Any]) -> Stat:
        graph = self._capture(fn)
        times: list[float] = []
        self._replays(graph, times.append)
        del graph
        return _stat(times)

    def _graph_sections(self, fn: Callable[[Sections | None], Any]) -> dict[str, Stat]:
        """Parts of a captured step: the marks become event-record nodes inside the graph
        (``Sections(graph=True)``), so every replay records them again."""
        rec = Sections(self.device, self.clock, graph=True)

        def run() -> None:   # eager calls without marks; the capture with them
            fn(rec if torch.cuda.is_current_stream_capturing() else None)

        graph = self._capture(run)
        samples: dict[str, list[float]] = {}

        def read(replay_s: float) -> None:
            parts = rec.result()
            parts[WHOLE_STEP] = sum(parts.values())
            self.coverage.append(parts[WHOLE_STEP] / replay_s if replay_s > 0 else 0.0)
            for name, seconds in parts.items():
                samples.setdefault(name, []).append(seconds)

        self._replays(graph, read)
        del graph
        return {name: _stat(times) for name, times in samples.items()}

    def graph_note(self) -> str:
        """What the profile says of the CUDA graphs (empty off CUDA graphs)."""
        if not self.graphs:
            return ""
        note = "steps timed as CUDA graph replays (one capture per point)"
        if self.coverage:
            cov = sorted(self.coverage)
            note += (f"; a step's parts add up to {100 * _quantile(cov, 0.1):.1f}-"
                     f"{100 * _quantile(cov, 0.9):.1f} % (p10-p90) of its replay time")
        for why, n in sorted(self.graph_failures.items()):
            note += f"; {n} point(s) timed eagerly, capture failed: {why}"
        return note

    def _cpu(self, fn: Callable[[], Any]) -> list[float]:
        times: list[float] = []
        start = time.perf_counter()
        clock = self.clock
        while len(times) < self.repeats:
            t0 = clock()
            fn()
            times.append(clock() - t0)
            if len(times) >= MIN_REPEATS and time.perf_counter() - start > self.budget_s:
                break
        return times

    def _cuda(self, fn: Callable[[], Any]) -> list[float]:
        torch.cuda.synchronize()
        pairs = []
        start = time.perf_counter()
        while len(pairs) < self.repeats:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            pairs.append((a, b))
            if len(pairs) >= MIN_REPEATS and time.perf_counter() - start > self.budget_s:
                torch.cuda.synchronize()   # the host runs ahead; check the real time spent
                if time.perf_counter() - start > self.budget_s:
                    break
        torch.cuda.synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in pairs]


# --------------------------------------------------------------------------------------------
# Grids


@dataclass(frozen=True)
class Grid:
    tokens: tuple[int, ...]
    prefill_chunk: tuple[int, ...]
    prefill_ctx: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    lm_seqs: tuple[int, ...]
    heldout: int
    heldout_max_decodes: int
    heldout_max_ctx: int
    warmup: int
    repeats: int
    point_budget_s: float


GRIDS = {
    # tiny model on one CPU thread: 621 s of CPU, 12.4 min wall at load ~3 (2-core EPYC VM,
    # 2026-11-23; benchmarks/RESULTS.md). Its cost is per step (the reference attention's
    # copies, warm rounds), not per point: 61 points instead of 89 still took 472 s of CPU.
    "quick": Grid(tokens=(1, 8, 32, 128, 512, 2048), prefill_chunk=(16, 128, 512, 2048),
                  prefill_ctx=(0, 512, 2048), decode_batch=(1, 8, 64), decode_ctx=(16, 256, 2048),
                  lm_seqs=(1, 8, 64, 256), heldout=4, heldout_max_decodes=48,
                  heldout_max_ctx=1536, warmup=1, repeats=5, point_budget_s=0.4),
    "full": Grid(tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                         1536, 2048, 3072, 4096, 6144, 8192, 16384),
                 prefill_chunk=(1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
                 prefill_ctx=(0, 128, 512, 1024, 2048, 4096, 8192),
                 decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                 decode_ctx=(16, 64, 256, 512, 1024, 2048, 4096),
                 lm_seqs=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), heldout=12,
                 heldout_max_decodes=128, heldout_max_ctx=4000, warmup=3, repeats=15,
                 point_budget_s=2.0),
}


def token_axis(values: tuple[int, ...], limit: int) -> list[int]:
    """Grid values up to ``limit``, with ``limit`` itself included (the step budget)."""
    return sorted({v for v in values if v <= limit} | {limit})


# --------------------------------------------------------------------------------------------
# Options and progress


@dataclass(frozen=True)
class Options:
    device: str = "cpu"                  # "cpu" | "cuda"
    dtype: str = "bf16"
    threads: int = 1
    grid: str = "quick"
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    attention: str = "auto"              # auto | reference | flex | triton | flashinfer | vllm_fa
    compile: bool = True                 # torch.compile: flex; on CUDA the layer pieces too
    cuda_graphs: bool = True             # CUDA: time steps as CUDA graph replays
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    command: str = ""
    timer: str = "auto"                  # auto | wall | cpu  (see Options.timer_name)
    max_model_len: int | None = None     # caps the context axes (the model's longest sequence)
    grid_override: Grid | None = None    # tests: an even smaller grid
    note: str = ""                       # free text for provenance.note (how busy the host was)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        if self.grid not in GRIDS:
            raise ValueError(f"grid must be one of {', '.join(GRIDS)}")
        if self.block_size < 1 or self.max_num_batched_tokens < 1 or self.threads < 1:
            raise ValueError("block_size, max_num_batched_tokens and threads must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.timer not in ("auto", "wall", "cpu"):
            raise ValueError("timer must be auto, wall or cpu")
        if self.timer == "cpu" and (self.device != "cpu" or self.threads != 1):
            raise ValueError("timer cpu (thread CPU time) needs --device cpu and one thread")

    @property
    def timer_name(self) -> str:
        """What the profile's ``settings.timer`` records: ``cuda_event`` on CUDA; on CPU
        ``thread_time`` (the measuring thread's CPU time) with one thread unless wall time was
        asked for, else ``perf_counter``."""
        if self.device == "cuda":
            return "cuda_graph_replay" if self.cuda_graphs else "cuda_event"
        if self.timer == "cpu" or (self.timer == "auto" and self.threads == 1):
            return "thread_time"
        return "perf_counter"

    @property
    def grid_spec(self) -> Grid:
        """The grid measured: context axes capped at ``max_model_len`` (with that value itself
        on them), since no sequence of this model gets longer."""
        grid = self.grid_override or GRIDS[self.grid]
        if self.max_model_len is None:
            return grid
        n = self.max_model_len
        return replace(grid, prefill_ctx=tuple(token_axis(grid.prefill_ctx, n)),
                       decode_ctx=tuple(token_axis(grid.decode_ctx, n)),
                       heldout_max_ctx=min(grid.heldout_max_ctx, n))


class Progress:
    """The profile's progress on stderr: simserve's tqdm bar with an ETA (simserve/progress.py:
    redrawn on a terminal, a line at most every 30 s in a log), the section and point being
    measured beside it, and a closing line with the count and the time."""

    def __init__(self, total: int, stream: Any = None):
        from simserve.progress import bar
        self.total, self.done = max(1, total), 0
        self.stream = stream if stream is not None else sys.stderr
        self.bar = bar(self.total, "profiling", "point", stream=self.stream)
        self.start = time.perf_counter()

    def step(self, section: str, label: str = "") -> None:
        self.done += 1
        self.bar.set_postfix_str(f"{section} {label}".strip(), refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"profiled {self.done} points in {elapsed:.1f}s\n")
        self.stream.flush()


# --------------------------------------------------------------------------------------------
# Environment


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def steady_malloc() -> str:
    """Hold glibc's malloc steady for the rest of the process: large blocks come from the heap up
    to 32 MiB (no dynamic mmap threshold) and freed memory is not trimmed back to the OS.

    By default glibc serves blocks above a moving threshold with fresh mmap()s and returns them
    on free, so a step's activations and gathered K/V page-fault in again -- more or less
    depending on what ran before. On the EPYC that cost 5-15 % of a tiny-model step and changed
    by up to 8 % with the order of steps; held steady, the page faults go (0 per step after
    warm-up) and a step costs the same whatever preceded it, as with a caching allocator
    (tcmalloc/jemalloc, which vLLM recommends on CPU). Returns a note for the provenance (empty
    where the C library is not glibc)."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return ""
    m_trim_threshold, m_mmap_threshold = -1, -3          # <malloc.h>
    if not (mallopt(m_mmap_threshold, 32 << 20) and mallopt(m_trim_threshold, 1 << 30)):
        return ""
    return "glibc malloc held steady (mmap threshold 32 MiB, no trimming)"


def _load_average() -> float | None:
    """The host's 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _provenance_note(before: float | None, after: float | None, note: str,
                     malloc: str = "") -> str:
    parts = [malloc] if malloc else []
    if before is not None and after is not None:
        parts.append(f"host load average (1 min) {before:.2f} before measuring, {after:.2f} "
                     f"after, on {os.cpu_count()} CPUs")
    if note:
        parts.append(note)
    return "; ".join(parts)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class _Ctx:
    shapes: ModelCard
    opts: Options
    grid: Grid
    device: torch.device
    dtype: torch.dtype
    timer: Timer
    progress: Progress
    gen: torch.Generator
    model: Model
    backend: Any
    notes: list[str] = field(default_factory=list)
    # measure each family of steps in rounds (Timer.rounds); off for a compiled FlexAttention
    # backend, which would recompile as shapes alternate
    interleave: bool = True

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen).to(self.dtype).to(self.device)

    def cache(self, num_blocks: int) -> PagedKVCache:
        s = self.shapes
        return PagedKVCache(num_blocks, self.opts.block_size, s.num_kv_heads, s.head_dim,
                            self.dtype, self.device, fill="tile", generator=self.gen)


def count_points(grid: Grid, opts: Options) -> int:
    tokens = token_axis(grid.tokens, opts.max_num_batched_tokens)
    chunks = token_axis(grid.prefill_chunk, opts.max_num_batched_tokens)
    return (len(tokens) * (1 + len(DecoderLayer.OPS))
            + len(chunks) * len(grid.prefill_ctx)
            + len(grid.decode_batch) * len(grid.decode_ctx)
            + 2 * len(grid.lm_seqs) + 1 + grid.heldout)


def run_profile(shapes: ModelCard, opts: Options, stream: Any = None,
                moe: MoEShapes | None = None) -> dict[str, Any]:
    """Measure everything the schema asks for; returns the profile (not yet written).

    With ``moe`` (a card with experts in every layer) the layers run without a dense MLP, so
    ``linear`` is the attention side of a layer, and one MoE block is timed on the token axis
    (the ``moe`` section, profiler/moe.py)."""
    device = torch.device(opts.device)
    dtype = DTYPES[opts.dtype]
    grid = opts.grid_spec
    load_before = _load_average()
    malloc_note = steady_malloc() if device.type == "cpu" else ""
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    gen = torch.Generator().manual_seed(opts.seed)

    # with an MoE block the layers run without a dense MLP: the card's dense equivalent with
    # no MLP builds them and counts their weights; the MoE block's are added per layer
    run_shapes = replace(shapes, intermediate_size=0, num_experts=0, experts_per_token=0,
                         expert_intermediate=0, shared_expert_intermediate=0,
                         first_dense_layers=0, expert_bias=False, router_bias=False) \
        if moe is not None else shapes
    weights_bytes = _weights_bytes(run_shapes, dtype)
    if moe is not None:
        weights_bytes += (shapes.num_layers * moe.params
                          * torch.tensor([], dtype=dtype).element_size())
    budget = (torch.cuda.mem_get_info(device)[0] if device.type == "cuda"
              else _host_available_bytes())
    distinct = budget is None or weights_bytes <= 0.5 * budget
    notes = [] if distinct else [
        f"weights ({weights_bytes / 2**30:.1f} GiB) exceed half the free memory: every layer "
        "reuses one layer's weights (same work per step, less memory traffic variety)"]

    backend_name = attn.resolve_backend_name(opts.attention, device.type)
    backend = attn.make_backend(backend_name, device, shapes, dtype, compile=opts.compile)
    # two steps: short chunks with decodes (Flex's decoding kernel on CUDA), and a family of
    # 64-token-wide chunks (its general kernel for most GQA models: FlexPagedAttention.short)
    rel_err = max(attn.self_check(backend, prefill=prefill, decode_ctx=decode_ctx,
                                  block_size=opts.block_size, num_heads=shapes.num_heads,
                                  num_kv_heads=shapes.num_kv_heads, head_dim=shapes.head_dim,
                                  dtype=dtype, device=device, seed=opts.seed)
                  for prefill, decode_ctx in (([(13, 37), (16, 0)], [3, 17, 40]),
                                              ([(40, 5), (33, 0)], [9])))
    if rel_err > attn.TOLERANCE[dtype]:
        raise attn.BackendError(f"attention backend {backend_name!r} disagrees with dense "
                                f"attention (relative error {rel_err:.2e} > "
                                f"{attn.TOLERANCE[dtype]:.0e}); refusing to profile it")

    if device.type == "cuda" and opts.compile and getattr(backend, "fallback", None):
        # eager FlexAttention materialises every score: its GPU times would mean nothing, and
        # the large points would fail minutes into the run
        raise attn.BackendError(f"attention backend {backend_name!r}: {backend.fallback}; "
                                "refusing to profile eager FlexAttention on CUDA (use "
                                "--attention reference, or install flashinfer)")
    model = Model(run_shapes, dtype, device, seed=opts.seed, distinct_layers=distinct,
                  max_positions=max(grid.prefill_ctx) + max(grid.prefill_chunk)
                  + max(grid.decode_ctx) + opts.max_num_batched_tokens + 2,
                  compile_layers=opts.compile and device.type == "cuda")
    moe_tokens = token_axis(grid.tokens, opts.max_num_batched_tokens)
    progress = Progress(count_points(grid, opts) + (len(moe_tokens) if moe else 0), stream)
    ctx = _Ctx(shapes, opts, grid, device, dtype,
               Timer(device, grid.warmup, grid.repeats, grid.point_budget_s,
                     clock=CLOCKS.get(opts.timer_name, time.perf_counter),
                     graphs=opts.cuda_graphs),
               progress, gen, model, backend, notes,
               interleave=not getattr(backend, "compiled", False)
               and not (opts.cuda_graphs and device.type == "cuda"))

    linear, embedding = _measure_tokens(ctx)
    attn_prefill = _measure_prefill(ctx)
    attn_decode = _measure_decode(ctx)
    lm_head = _measure_lm_head(ctx)
    moe_grid = None
    if moe is not None:
        # one block's experts resident and reused at every point (a step's routing decides
        # which of them it reads); per layer, like every series
        moe_grid = measure_moe(moe, moe_tokens, ctx.timer, dtype=dtype, device=device,
                               seed=opts.seed, progress=progress)
    memory = _measure_memory(ctx, weights_bytes)
    progress.step("memory")
    heldout = _measure_heldout(ctx)
    progress.close()

    cuda_version = torch.version.cuda if device.type == "cuda" else None
    compiled = getattr(backend, "compiled", False)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "provenance": {
            "device": device.type, "device_name": device_name(device),
            "torch_version": torch.__version__, "cuda_version": cuda_version,
            "dtype": opts.dtype, "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": opts.command, "grid": opts.grid,
            "note": _provenance_note(load_before, _load_average(), opts.note, malloc_note),
            "execution": _execution_note(ctx, model),
        },
        "model": model_shapes(shapes, torch.tensor([], dtype=dtype).element_size()),
        "settings": {
            "block_size": opts.block_size, "max_num_batched_tokens": opts.max_num_batched_tokens,
            "warmup": grid.warmup, "repeats": grid.repeats,
            "timer": opts.timer_name,
            "sampler": "greedy (lm_head.top_p_seconds: top-p 0.9)",
            "method": "in_step",
            "order": "warm_rounds" if ctx.interleave else "point_by_point",
        },
        "attention": {
            "backend": backend_name, "compiled": compiled,
            "compile_seconds": dict(backend.compile_seconds), "fallback": backend.fallback,
            "self_check_rel_err": rel_err,
            "note": _attention_note(backend_name, compiled, backend.fallback, device),
        },
        "linear": linear, "embedding": embedding, "attn_prefill": attn_prefill,
        "attn_decode": attn_decode, "lm_head": lm_head,
        "memory": {**memory, "note": "; ".join([memory["note"], *notes]).strip("; ")},
        "heldout": heldout,
        **({"moe": moe_grid} if moe_grid is not None else {}),
    }


def _execution_note(c: _Ctx, model: Model) -> str:
    """How the steps ran: eager or compiled layer pieces, CUDA graphs or eager launches."""
    pieces = ("layer pieces (norm, QKV, RoPE / O, MLP, residuals) compiled by torch.compile"
              if model.pieces.compiled else "layers run eagerly (torch ops one by one)")
    return "; ".join(x for x in (pieces, c.timer.graph_note()) if x)


def _attention_note(name: str, compiled: bool, fallback: str | None, device: torch.device) -> str:
    if name == "reference":
        return "gather of each sequence's blocks + torch SDPA (no fused paged kernel)"
    if name == "flex":
        if compiled:
            return "FlexAttention, torch.compile per shape family (compile time not in timings)"
        return "FlexAttention eager (unfused: materialises scores)" + (
            f"; {fallback}" if fallback else "; compile disabled")
    if name == "triton":
        return ("decodes: simserve's split-KV paged decode kernel (Triton, profiler/"
                "triton_decode.py); prefill chunks: FlexAttention"
                + (", torch.compile per shape family" if compiled else " eager"))
    if name == "vllm_fa":
        return ("vLLM's own FlashAttention (vllm.vllm_flash_attn, FA3 on Hopper): one "
                "flash_attn_varlen_func call per layer with block tables and FA3's "
                "ahead-of-time scheduler metadata, as vLLM's FlashAttentionImpl makes it")
    return "FlashInfer paged prefill/decode wrappers"


def _weights_bytes(shapes: ModelCard, dtype: torch.dtype) -> int:
    """Sum of parameter bytes, counted from the shapes (the same tensors Model allocates)."""
    return shapes.num_params * torch.tensor([], dtype=dtype).element_size()


def _series(stats: list[Stat]) -> dict[str, list[float]]:
    return {"seconds": [x.median for x in stats], "p10": [x.p10 for x in stats],
            "p90": [x.p90 for x in stats]}


def _table(stats: list[list[Stat]]) -> dict[str, list[list[float]]]:
    return {k: [[getattr(x, a) for x in row] for row in stats]
            for k, a in (("seconds", "median"), ("p10", "p10"), ("p90", "p90"))}


def _per_layer(stat: Stat, layers: int) -> Stat:
    return Stat(stat.median / layers, stat.p10 / layers, stat.p90 / layers, stat.n)


def _layer_caches(c: _Ctx, num_blocks: int) -> list[PagedKVCache]:
    """One KV cache per layer, as a server has: a part timed inside a step then reads K/V that
    the other layers' traffic evicted. When that would take more than half the free memory
    (large models, large decode grids) every layer shares one cache, and the profile says so."""
    s, elt = c.shapes, torch.tensor([], dtype=c.dtype).element_size()
    per_layer = 2 * num_blocks * c.opts.block_size * s.kv_dim * elt
    free = (torch.cuda.mem_get_info(c.device)[0] if c.device.type == "cuda"
            else _host_available_bytes())
    if free is None or len(c.model.layers) * per_layer <= 0.5 * free:
        return [c.cache(num_blocks) for _ in c.model.layers]
    note = (f"KV caches of {num_blocks} blocks: one shared by every layer (one per layer would "
            "exceed half the free memory)")
    if note not in c.notes:
        c.notes.append(note)
    return [c.cache(num_blocks)] * len(c.model.layers)


def sample_rows(meta: StepMeta, num_sampled: int, device: Any) -> torch.Tensor:
    """Rows a step samples: the last token of each of the first ``num_sampled - decodes``
    prefill chunks (the chunks that finish their prompt), then every decode."""
    decodes = meta.num_seqs - meta.num_prefills
    finishing = [meta.query_start[s + 1] - 1 for s in range(num_sampled - decodes)]
    return torch.tensor(finishing + list(range(meta.query_start[meta.num_prefills],
                                               meta.num_tokens)), dtype=torch.long,
                        device=device)


StepSpec = tuple  # (prefill chunks [(q, ctx)], decode contexts, num_sampled[, sampler])


def _step(c: _Ctx, caches: list[PagedKVCache], spec: StepSpec):
    """``(prepare, run)`` of one step of this composition: ``run(sections)`` runs the whole
    step and marks its parts (Sections)."""
    prefill, decode_ctx, num_sampled, *rest = spec
    sample = rest[0] if rest else sample_greedy
    nb = caches[0].num_blocks
    meta = build_step(prefill, decode_ctx, c.opts.block_size, nb, c.device, generator=c.gen,
                      wrap=True)   # only where the cache was capped (see _measure_decode)
    ids = torch.randint(0, c.shapes.vocab_size, (meta.num_tokens,), generator=c.gen).to(
        c.device)
    rows = sample_rows(meta, num_sampled, c.device)
    return (lambda: c.backend.prepare(meta, nb),
            lambda sections: c.model.step(ids, meta, caches, c.backend, sample, rows, sections))


def _in_steps(c: _Ctx, caches: list[PagedKVCache], specs: list[StepSpec],
              section: str, labels: list[str]) -> list[dict[str, Stat]]:
    """Each step's parts, for a family of steps sharing ``caches``: in rounds over the family
    (:meth:`Timer.rounds`) when ``c.interleave``, else one step after another (a compiled
    FlexAttention backend: interleaving shapes would make torch.compile recompile)."""
    if not c.interleave:
        out = []
        for spec, label in zip(specs, labels):
            prepare, run = _step(c, caches, spec)
            prepare()
            out.append(c.timer.sections(run))
            c.progress.step(section, label)
        return out
    steps = [_step(c, caches, spec) for spec in specs]
    shown = 0

    def on_round(done: int, total: int) -> None:   # the bar moves a share of points a round
        nonlocal shown
        while shown < len(specs) * done // total:
            c.progress.step(section, f"round {done}/{total}")
            shown += 1

    return c.timer.rounds(steps, seed=c.opts.seed, on_round=on_round, warm=True)


def _measure_tokens(c: _Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    """``linear`` and ``embedding`` vs tokens, inside steps of one prefill chunk of T tokens
    (no context) sampling one row; plus each op of the linear part alone (``linear.ops``)."""
    L = len(c.model.layers)
    tokens = token_axis(c.grid.tokens, c.opts.max_num_batched_tokens)
    caches = _layer_caches(c, blocks_needed(max(tokens), c.opts.block_size) + 8)
    measured = _in_steps(c, caches, [([(t, 0)], [], 1) for t in tokens], "linear",
                         [f"tokens={t}" for t in tokens])
    linear = [_per_layer(parts["linear"], L) for parts in measured]
    embedding = [parts["embedding"] for parts in measured]
    ops = _measure_ops(c, tokens, caches[0])
    return ({"tokens": tokens, **_series(linear), "ops": ops},
            {"tokens": tokens, **_series(embedding)})


def _measure_ops(c: _Ctx, tokens: list[int], cache: PagedKVCache) -> dict[str, list[float]]:
    """Each op of the linear part timed alone, over and over (warm caches): for information
    only; simserve composes steps from the in-step ``linear`` series."""
    layer = c.model.layers[0]
    ops: dict[str, list[float]] = {op: [] for op in DecoderLayer.OPS}
    for t in tokens:
        meta = build_step([(t, 0)], [], c.opts.block_size, cache.num_blocks, c.device,
                          generator=c.gen)
        x = c.randn(t, c.shapes.hidden_size)
        h = rms_norm(x, layer.input_norm)
        q, k, v = layer.split_qkv(layer.qkv(h))
        o = q.reshape(t, -1)
        parts = {
            "input_norm": lambda: rms_norm(x, layer.input_norm),
            "qkv_proj": lambda: layer.qkv(h),
            "rope": lambda: (layer.rotary(q, meta.positions), layer.rotary(k, meta.positions)),
            "kv_write": lambda: cache.write(k, v, meta.slot_mapping),
            "o_proj": lambda: F.linear(o, layer.w_o),
            "post_norm": lambda: rms_norm(x, layer.post_norm),
            "mlp": lambda: layer.mlp(h),
        }
        for op, fn in parts.items():
            ops[op].append(c.timer(fn).median)
            c.progress.step("linear ops", f"{op} tokens={t}")
    return ops


def _measure_prefill(c: _Ctx) -> dict[str, Any]:
    """Attention of one chunk after its context, per layer, inside steps of that one chunk."""
    L = len(c.model.layers)
    chunks = token_axis(c.grid.prefill_chunk, c.opts.max_num_batched_tokens)
    ctxs = list(c.grid.prefill_ctx)
    # larger than any point needs: blocks come from all over the cache
    caches = _layer_caches(c, 2 * blocks_needed(max(chunks) + max(ctxs), c.opts.block_size))
    points = [(chunk, ctx) for chunk in chunks for ctx in ctxs]
    measured = _in_steps(c, caches, [([(chunk, ctx)], [], 1) for chunk, ctx in points],
                         "attn_prefill", [f"chunk={q} ctx={x}" for q, x in points])
    att = iter(_per_layer(parts["attention"], L) for parts in measured)
    rows = [[next(att) for _ in ctxs] for _ in chunks]
    del caches
    return {"chunk": chunks, "ctx": ctxs, **_table(rows)}


def _measure_decode(c: _Ctx) -> dict[str, Any]:
    """Attention of B decodes at one context, per layer, inside steps of those decodes."""
    L = len(c.model.layers)
    batches, ctxs = list(c.grid.decode_batch), list(c.grid.decode_ctx)
    bs = c.opts.block_size
    need = max(batches) * blocks_needed(max(ctxs) + 1, bs)
    nb = need + max(batches)
    if c.device.type == "cuda":
        # Triton kernels index a tensor with 32-bit offsets: on an H100, Flex's decoding
        # kernel failed to compile for a 2.16e9-element cache (256 sequences x 8,193 tokens
        # of an 8B model). Cap the cache below 2**31 elements; the largest points then reuse
        # a few pages (same bytes read; said in the profile)
        cap = (2**31 - 1) // (bs * c.shapes.kv_dim)
        if nb > cap:
            nb = cap
            if need > cap:
                c.notes.append(f"decode grid: KV cache capped at {cap} blocks (< 2**31 "
                               "elements, Triton's 32-bit offsets); steps needing more "
                               f"(up to {need}) reuse pages")
    caches = _layer_caches(c, nb)
    points = [(batch, ctx) for batch in batches for ctx in ctxs]
    measured = _in_steps(c, caches, [([], [ctx] * batch, batch) for batch, ctx in points],
                         "attn_decode", [f"batch={b} ctx={x}" for b, x in points])
    att = iter(_per_layer(parts["attention"], L) for parts in measured)
    rows = [[next(att) for _ in ctxs] for _ in batches]
    del caches
    return {"batch": batches, "ctx": ctxs, **_table(rows)}


def _measure_lm_head(c: _Ctx) -> dict[str, Any]:
    """LM head and sampling of S rows inside steps of S decodes at the smallest decode
    context (greedy; and top-p 0.9 for ``top_p_seconds``)."""
    ctx = min(c.grid.decode_ctx)
    bs = c.opts.block_size
    caches = _layer_caches(c, max(c.grid.lm_seqs) * blocks_needed(ctx + 1, bs) + 8)
    sample_top_p = make_top_p(0.9, seed=c.opts.seed)
    seqs = list(c.grid.lm_seqs)
    specs = [([], [ctx] * n, n, sampler) for n in seqs for sampler in (sample_greedy,
                                                                        sample_top_p)]
    measured = _in_steps(c, caches, specs, "lm_head",
                         [f"seqs={n} {kind}" for n in seqs for kind in ("greedy", "top-p")])
    greedy = [parts["lm_head"] for parts in measured[0::2]]
    top_p = [parts["lm_head"] for parts in measured[1::2]]
    del caches
    return {"seqs": list(c.grid.lm_seqs), **_series(greedy),
            "top_p_seconds": [x.median for x in top_p]}


def _measure_memory(c: _Ctx, weights_bytes: int) -> dict[str, Any]:
    s, opts = c.shapes, c.opts
    elt = torch.tensor([], dtype=c.dtype).element_size()
    kv_per_token = 2 * s.num_layers * s.kv_dim * elt
    block_bytes = kv_per_token * opts.block_size
    t = opts.max_num_batched_tokens
    rows = min(opts.max_num_seqs, t)
    total = free = num_blocks = None
    if c.device.type == "cuda":
        # vLLM's way: run the largest step once and read the allocator's peak above the baseline
        nb = blocks_needed(t, opts.block_size)
        caches = [c.cache(nb) for _ in c.model.layers]
        meta = build_step([(t, 0)], [], opts.block_size, nb, c.device, generator=c.gen)
        c.backend.prepare(meta, nb)
        ids = torch.randint(0, s.vocab_size, (t,), generator=c.gen).to(c.device)
        sample_rows = torch.arange(t - rows, t, device=c.device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(c.device)
        base = torch.cuda.memory_allocated(c.device)
        c.model.step(ids, meta, caches, c.backend, sample_greedy, sample_rows)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(c.device) - base
        del caches
        free, total = torch.cuda.mem_get_info(c.device)
        num_blocks = num_gpu_blocks(total, opts.gpu_memory_utilization, weights_bytes, peak,
                                    block_bytes)
        method, note = "measured", (
            f"activation peak: torch.cuda.max_memory_allocated over one {t}-token prefill step "
            f"sampling {rows} rows; num_gpu_blocks = (total * {opts.gpu_memory_utilization} - "
            "weights - activation peak) // block_bytes")
    else:
        # live tensors of one layer at t tokens (x, residual, normed, qkv, attention out, o_proj
        # out, gate_up, act, down) plus logits (+ fp32 probabilities) for the sampled rows
        per_token = (4 * s.hidden_size + (s.q_dim + 2 * s.kv_dim) + s.q_dim
                     + 3 * s.intermediate_size) * elt
        peak = t * per_token + rows * s.vocab_size * (elt + 4)
        method, note = "estimated", (
            "CPU: activation peak estimated from tensor sizes at max_num_batched_tokens "
            f"({t} tokens, {rows} sampled rows), not measured; no device memory, so "
            "num_gpu_blocks is null")
    return {"weights_bytes": weights_bytes, "kv_bytes_per_token": kv_per_token,
            "block_bytes": block_bytes, "activation_peak_bytes": int(peak),
            "activation_peak_method": method, "total_bytes": total, "free_bytes": free,
            "gpu_memory_utilization": opts.gpu_memory_utilization,
            "num_gpu_blocks": num_blocks, "note": note}


def num_gpu_blocks(total_bytes: int, gpu_memory_utilization: float, weights_bytes: int,
                   activation_peak_bytes: int, block_bytes: int) -> int:
    """KV blocks that fit the way vLLM sizes its cache: (total memory x utilization - weights -
    activation peak) // bytes per block, never below zero."""
    usable = total_bytes * gpu_memory_utilization - weights_bytes - activation_peak_bytes
    return max(0, int(usable // block_bytes))


def random_steps(n: int, budget: int, max_decodes: int, max_ctx: int,
                 seed: int) -> list[tuple[list[tuple[int, int]], list[int], int]]:
    """``n`` random mixed steps ``(prefill chunks, decode contexts, num_sampled)`` within the
    token budget: 0-3 chunks of random length and context, then random decodes."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        left = budget
        n_dec = rng.randint(0, min(max_decodes, budget))
        decode_ctx = [rng.randint(1, max_ctx) for _ in range(n_dec)]
        left -= n_dec
        prefill = []
        for _ in range(rng.randint(0 if n_dec else 1, 3)):
            if left < 1:
                break
            length = rng.randint(1, max(1, min(left, budget // 2)))
            prefill.append((length, rng.choice([0, rng.randint(1, max_ctx)])))
            left -= length
        # a chunk that completes its prompt samples a token; a middle chunk does not
        finishing = sum(rng.random() < 0.5 for _ in prefill)
        steps.append((prefill, decode_ctx, n_dec + finishing))
    return steps


def _measure_heldout(c: _Ctx) -> list[dict[str, Any]]:
    bs = c.opts.block_size
    out = []
    steps = random_steps(c.grid.heldout, c.opts.max_num_batched_tokens,
                         c.grid.heldout_max_decodes, c.grid.heldout_max_ctx, c.opts.seed + 1)
    # one cache per layer, big enough for every step: one shape family per step kind for Flex
    nb = 8 + max(sum(blocks_needed(n, bs) for n in
                     [q + x for q, x in prefill] + [x + 1 for x in decode_ctx])
                 for prefill, decode_ctx, _ in steps)
    caches = [c.cache(nb) for _ in c.model.layers]
    # whole steps, measured as the parts are (a step's time is the sum of its sections)
    measured = _in_steps(c, caches, steps, "heldout",
                         [f"{len(p)} chunks + {len(d)} decodes" for p, d, _ in steps])
    for (prefill, decode_ctx, num_sampled), parts in zip(steps, measured):
        stat = parts[WHOLE_STEP]
        out.append({"prefill": [[q, x] for q, x in prefill], "decode_ctx": decode_ctx,
                    "num_sampled": num_sampled, "seconds": stat.median, "p10": stat.p10,
                    "p90": stat.p90})
    return out
