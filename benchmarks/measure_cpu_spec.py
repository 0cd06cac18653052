"""Measure this machine's peak matmul FLOP/s and memory bandwidth with numpy.

The numbers go into ``simserve/data/hardware/cpu-epyc-2core.yaml`` (``peak_flops`` and
``mem_bandwidth``). Run it on a quiet machine (check ``uptime``)::

    .venv/bin/python benchmarks/measure_cpu_spec.py

* FLOP/s: best of several float32 ``a @ b`` on large square matrices, counted as 2·n³ FLOPs;
  numpy's BLAS uses every core.
* Bandwidth: best of several ``np.copyto`` of a buffer far larger than the caches, counted as
  bytes read + bytes written; run on one thread and on one thread per core (numpy releases the
  GIL while copying), and the larger is reported. Half of it is the one-way copy rate, used
  for host-link (KV swap) and interconnect bandwidth: on one socket both are memory copies.
* Memory size: ``MemTotal`` from ``/proc/meminfo``.

On a shared VM the copy numbers vary by ~25 % between runs; run it a few times.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def best_time(fn, repeats: int) -> float:
    fn()  # warm up: page faults, BLAS thread start
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_flops(n: int = 4096, repeats: int = 5) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    return 2 * n**3 / best_time(lambda: np.matmul(a, b, out=out), repeats)


def copy_bandwidth(total_bytes: int = 1 << 30, threads: int = 1, repeats: int = 10) -> float:
    n = total_bytes // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)
    parts = np.array_split(np.arange(n), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    with ThreadPoolExecutor(threads) as pool:
        def run():
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))
        return 2 * src.nbytes / best_time(run, repeats)


def mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main() -> None:
    cores = os.cpu_count() or 1
    flops = matmul_flops()
    bw = {t: copy_bandwidth(threads=t) for t in sorted({1, cores})}
    print(f"cores: {cores}")
    print(f"peak_flops (float32 matmul 4096^3): {flops:.4g} FLOP/s")
    for t, v in bw.items():
        print(f"copy bandwidth, {t} thread(s) (read+write, 1 GiB): {v:.4g} B/s")
    print(f"mem_bandwidth (best): {max(bw.values()):.4g} B/s")
    print(f"one-way copy rate (host_link / interconnect): {max(bw.values()) / 2:.4g} B/s")
    print(f"mem_bytes (MemTotal): {mem_total_bytes()}")


if __name__ == "__main__":
    main()
