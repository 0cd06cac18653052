"""What a simulation can hold: the bounds every input is checked against before anything is
allocated or run.

Each bound exists because something past it breaks, not because the value is unusual:

* counts recorded per step (KV blocks, tokens in a batch, sequences) are stored in 32-bit
  arrays, so a count above ``MAX_COUNT`` would overflow them;
* every request costs memory (about 1.7 kB in a run: README, "Speed"), so ``MAX_REQUESTS`` keeps
  a run within a large workstation's memory (10 M requests ≈ 17 GB);
* simulated time is a float64 in seconds; beyond ``MAX_SECONDS`` (≈ 31.7 years) adding a
  sub-microsecond step no longer moves the clock, and the run would never end;
* each replica builds its own scheduler and KV cache, and a prefix cache keeps one entry per
  block, so replicas and prefix-cache blocks are bounded by the memory they take.

Hardware values have floors and ceilings far outside anything built (a device slower than
1 MFLOP/s, or with more than a petabyte of memory): past them a step's price is ``inf`` or 0.
``docs/scenario.md`` lists every bound.
"""

from __future__ import annotations

MAX_COUNT = 2**31 - 1               # per-step counts (32-bit arrays): blocks, tokens, sequences
MAX_TOKENS = MAX_COUNT              # a prompt, an output, a context, a token budget
MAX_INT64 = 2**63 - 1               # seeds, priorities (int64 columns)
MAX_REQUESTS = 10_000_000           # requests in one run (memory: ~1.7 kB each)
MAX_SECONDS = 1e9                   # simulated time (arrivals, durations, failures, restarts)
MAX_REPLICAS = 4096                 # replicas in one cluster (each builds a scheduler and cache)
MAX_PREFIX_CACHE_BLOCKS = 2**25     # prefix-cache blocks over all replicas (~150 B each)
MAX_ZIPF_SUPPORT = 10_000_000       # zipf's support 1..max is tabulated (8 bytes a value)
MAX_RETRIES = 100                   # fault retries per request (each re-routes it)
MIN_MTBF_S = 1e-3                   # a replica failing more often than every millisecond
MAX_FAILURES = 100_000              # random replica failures in one run (each costs a re-route)
MAX_STEP_S = 1e6                    # one engine iteration (11.6 days): past it a price is absurd
MAX_SWEEP_POINTS = 10_000           # points in one sweep: each is validated (~3 ms) and kept
MAX_WORKERS_PER_CPU = 4             # sweep processes per CPU: more only share the same cores
MAX_WORKERS = 256                   # ... and never more than this (each holds ~100 MB)

# Device specs: beyond these a price is inf or 0 (see the module docstring).
FLOPS_RANGE = (1e6, 1e19)           # FLOP/s
BANDWIDTH_RANGE = (1e3, 1e16)       # B/s, memory and links
MEM_BYTES_RANGE = (1e6, 1e15)       # device memory
SWAP_SPACE_GB_MAX = 1e6             # host swap space per replica
