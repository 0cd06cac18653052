"""Fuzz: hundreds of hand-made bad inputs, each answered the one way bad input is answered.

Every case is a command line (``validate``, ``run``, ``sweep``, ``capacity``, ``plan``,
``report``) over
files written for it: scenario YAML with broken bytes, structure or values, every trace format
with broken rows, ``--set`` overrides, sweep and compare files. Each must end with

* exit code 2,
* exactly one line on stderr, ``error: ...``, naming the field (``engine.num_gpu_blocks``) or
  the file and line (``trace.csv:3``),
* no traceback,
* within a bounded time (no hang) and bounded memory (refused before allocating).

The CLI runs in this process (``simserve.cli.main``) under a timer and an address-space limit,
so a hang or a huge allocation fails its case instead of stalling or swapping the machine.
Inputs that must be *accepted* (``1e1``, Azure timestamps with 7-12 fractional digits) and the
promises about what is written (labels never escape ``--out``; the variants already run are kept
when a later one fails) are tested at the end.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import json
import os
import re
import resource
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from simserve.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = yaml.safe_load((DATA / "tiny.yaml").read_text())
TINY_TEXT = (DATA / "tiny.yaml").read_text()
SECONDS = 30            # per case; the slowest case takes well under a second
HEADROOM = 3 << 30      # bytes of address space a case may add

NAN, INF = float("nan"), float("inf")


@dataclass
class Case:
    id: str
    argv: list[str]                 # "{d}" is replaced by the case's folder
    expect: str                     # regex the error line must match (the field or file:line)
    files: dict[str, bytes | str] = field(default_factory=dict)


CASES: list[Case] = []


def add(id: str, argv: list[str], expect: str, files: dict | None = None) -> None:
    CASES.append(Case(f"{len(CASES):04d}-{id}", argv, expect, files or {}))


def scenario_text(d: dict) -> str:
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


def with_field(path: str, value, base: dict | None = None) -> dict:
    """A copy of ``base`` (tiny.yaml) with the dotted ``path`` set (sections created)."""
    d = copy.deepcopy(base or TINY)
    node = d
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return d


def both(id: str, files: dict, expect: str, extra: tuple = ()) -> None:
    """The same scenario through ``validate`` and ``run``."""
    add(f"validate-{id}", ["validate", "{d}/s.yaml", *extra], expect, files)
    add(f"run-{id}", ["run", "{d}/s.yaml", "--no-report", "--out", "{d}/out", *extra], expect,
        files)


def field_case(path: str, value, expect: str | None = None, base: dict | None = None) -> None:
    both(f"{path}={value!r}"[:80], {"s.yaml": scenario_text(with_field(path, value, base))},
         expect or "^error: " + re.escape(path) + r"\b")


# --- 1. the bytes and structure of a YAML file -------------------------------------------------

def _bomb(depth: int, width: int, key: str = "seed") -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + f"\n{key}: *a{depth - 1}\n"


RAW = {
    "latin1-comment": (TINY_TEXT + "# caf\xe9\n").encode("latin-1"),
    "latin1-value": TINY_TEXT.replace("name: tiny", "name: caf\xe9").encode("latin-1"),
    "cp1252-quotes": TINY_TEXT.encode() + b"# \x93quoted\x94\n",
    "latin1-first-byte": b"\xff" + TINY_TEXT.encode(),
    "utf16-le-bom": codecs.BOM_UTF16_LE + TINY_TEXT.encode("utf-16-le"),
    "utf16-be-bom": codecs.BOM_UTF16_BE + TINY_TEXT.encode("utf-16-be"),
    "utf16-le-no-bom": TINY_TEXT.encode("utf-16-le"),
    "utf16-be-no-bom": TINY_TEXT.encode("utf-16-be"),
    "utf32-bom": TINY_TEXT.encode("utf-32"),
    "nul-at-end": TINY_TEXT.encode() + b"\x00\n",
    "nul-in-value": TINY_TEXT.replace("name: tiny", "name: ti\x00ny").encode(),
    "nul-first": b"\x00" + TINY_TEXT.encode(),
    "control-char": TINY_TEXT.replace("name: tiny", "name: ti\x01ny").encode(),
    "escape-char": TINY_TEXT.replace("name: tiny", "name: ti\x1bny").encode(),
    "binary": bytes(range(256)) * 4,
    "truncated-utf8": TINY_TEXT.encode() + "# é".encode()[:-1],
    "deep-list-65": ("seed: " + "[" * 65 + "]" * 65 + "\n").encode(),
    "deep-list-1000": ("seed: " + "[" * 1000 + "]" * 1000 + "\n").encode(),
    "deep-list-100000": ("seed: " + "[" * 100000 + "]" * 100000 + "\n").encode(),
    "deep-map-3000": ("seed: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n").encode(),
    "deep-mixed": ("engine: " + "[{a: " * 500 + "1" + "}]" * 500 + "\n").encode(),
    "deep-block": "".join(f"{' ' * 2 * i}k{i}:\n" for i in range(200)).encode()
                  + (" " * 400 + "v: 1\n").encode(),
    "alias-bomb-seed": (TINY_TEXT.replace("seed: 7\n", "") + _bomb(9, 9)).encode(),
    "alias-bomb-wide": (TINY_TEXT.replace("seed: 7\n", "") + _bomb(4, 400)).encode(),
    "alias-bomb-engine": (TINY_TEXT.replace("engine:", "old_engine:", 1)
                          + _bomb(8, 10, "engine")).encode(),
    "alias-bomb-compare": (TINY_TEXT + _bomb(8, 10, "compare")).encode(),
    "alias-self": (TINY_TEXT.replace("seed: 7\n", "") + "seed: &s [*s]\n").encode(),
    "dup-top-key": (TINY_TEXT + "seed: 3\n").encode(),
    "dup-section": (TINY_TEXT + "engine: {max_num_seqs: 4}\n").encode(),
    "dup-nested": TINY_TEXT.replace("  block_size: 16\n",
                                    "  block_size: 16\n  block_size: 32\n").encode(),
    "dup-flow": TINY_TEXT.replace("prompt: {dist: uniform, low: 16, high: 300}",
                                  "prompt: {dist: uniform, low: 16, low: 20, high: 300}").encode(),
    "dup-compare-item": (TINY_TEXT + "compare:\n  - {label: a, label: b, seed: 1}\n").encode(),
    "tab-indent": TINY_TEXT.replace("  max_num_seqs: 16", "\tmax_num_seqs: 16").encode(),
    "unclosed-bracket": (TINY_TEXT + "extra: [1, 2\n").encode(),
    "unclosed-quote": (TINY_TEXT + 'extra: "abc\n').encode(),
    "bad-indent": TINY_TEXT.replace("  block_size: 16", "    block_size: 16").encode(),
    "scalar-file": b"just a string\n",
    "number-file": b"42\n",
    "list-file": b"- a\n- b\n",
    "empty-file": b"",
    "comments-only": b"# nothing here\n",
    "two-documents": (TINY_TEXT + "---\n" + TINY_TEXT).encode(),
    "python-tag": (TINY_TEXT + "x: !!python/object/apply:os.system ['true']\n").encode(),
    "unknown-tag": (TINY_TEXT + "x: !custom 1\n").encode(),
    "non-string-key": (TINY_TEXT + "1: one\n").encode(),
    "null-key": (TINY_TEXT + "~: one\n").encode(),
    "huge-file": TINY_TEXT.encode() + b"#" * (17 * 2**20) + b"\n",
}
for name, data in RAW.items():
    both(name, {"s.yaml": data}, r"^error: .*s\.yaml(:\d+)?: |^error: [a-z_.\[\]0-9]+: ")
add("validate-missing-file", ["validate", "{d}/nope.yaml"], r"nope\.yaml: file not found")
add("run-missing-file", ["run", "{d}/nope.yaml"], r"nope\.yaml: file not found")
add("validate-directory", ["validate", "{d}"], r"is a directory")
add("run-directory", ["run", "{d}", "--no-report"], r"is a directory")


# --- 2. field values -----------------------------------------------------------------------

JUNK = ["x", True, [1], {"a": 1}, NAN, INF, -INF]
BIG = [1e308, 10**30, -10**30, 2**63]
POS_INT = [*JUNK, *BIG, 0, -1, 1.5]
COUNT = [*POS_INT, 2**31]

FIELDS: dict[str, list] = {
    "seed": [*JUNK, *BIG, -1, 1.5],
    "engine.max_num_seqs": COUNT,
    "engine.max_num_batched_tokens": COUNT,
    "engine.block_size": COUNT,
    "engine.num_gpu_blocks": [*COUNT, 3e9, 10**9],
    "engine.gpu_memory_utilization": ["x", True, NAN, INF, 0, -0.5, 1.5, 1e308],
    "engine.swap_space_gb": ["x", True, NAN, INF, -1, 1e308, 1e7],
    "engine.max_model_len": [*COUNT, 10**6, 4097],
    "engine.tensor_parallel_size": [*POS_INT, 3, 16],
    "engine.long_prefill_token_threshold": ["x", True, NAN, -1, 1.5, 2**31, 1e308],
    "engine.preemption_mode": ["x", 1, True, [1]],
    "engine.enable_chunked_prefill": ["x", 1, [1]],
    "engine.enable_prefix_caching": ["x", 1],
    "engine.bogus": [1],
    # issue #18: precision, expert/data parallelism, speculative decoding, KV offload
    "engine.quantization": ["x", 1, True, "fp8", "mxfp4", "int4"],
    "engine.kv_cache_dtype": ["x", 1, True, "fp4"],
    "engine.enable_expert_parallel": ["x", 1, True],          # True: a dense model
    "engine.expert_balancedness": ["x", True, NAN, INF, 0, -1, 1.5],
    "engine.data_parallel_size": [*POS_INT, 2],                # 2: without expert parallelism
    "engine.all2all_backend": ["x", 1, "pplx"],
    "engine.speculative_config": ["x", 1, [1], {}, {"method": "medusa"},
                                  {"method": "eagle", "num_speculative_tokens": -1,
                                   "synthetic_acceptance_length": 1.5},
                                  {"method": "eagle", "num_speculative_tokens": 2,
                                   "synthetic_acceptance_rates": [0.5, 1.5]},
                                  {"method": "eagle", "num_speculative_tokens": 2,
                                   "synthetic_acceptance_rates": [NAN, 0.1]},
                                  {"method": "eagle", "num_speculative_tokens": 2},
                                  {"method": "draft_model", "num_speculative_tokens": 2,
                                   "synthetic_acceptance_length": 2.0, "model": "nope"}],
    "engine.kv_offloading_size": ["x", True, NAN, INF, -1, 0, 1e308, 1.0],   # 1.0: no prefix cache
    "engine.kv_offloading_backend": ["x", 1],
    "scheduler.policy": ["x", 1, True],
    "scheduler.bogus": [1],
    "latency.model": ["x", 1],
    "latency.base_ms": ["x", -1, NAN, INF],
    "latency.per_seq_ms": [-1, True],
    "latency.bogus": [1],
    "slo.ttft_ms": [-1, 0, "x", NAN, INF],
    "slo.tpot_ms": [-1, [1]],
    "slo.attainment": [2, -0.1, "x", NAN],
    "slo.bogus": [1],
    "cluster.replicas": [0, -1, 10**7, 1e308, "x", 4097, 1.5],
    "cluster.router": ["x", 1],
    "cluster.bogus": [1],
    "workload.arrival": ["x", 1],
    "workload.rate": ["x", True, 0, -1, NAN, -INF, 1e-300, 1e-9],
    "workload.num_requests": [*POS_INT, 10**12, 10**7 + 1],
    "workload.bogus": [1],
    "workload.max_concurrency": [0, -1, 1.5, "x", True, 1e308, 10**8],
    "workload.prefix_len": [-1, 1.5, "x", 2**31, 1e308],
    "metric_percentiles": [[0], [101], "x", [50, 50], [], [True], list(range(1, 30)), [NAN]],
    "output_dir": [5, [1]],
    "name": [5, {"a": 1}],
    "bogus": [1],
}
for path, values in FIELDS.items():
    for value in values:
        field_case(path, value)

field_case("latency.per_token_ms", 1e300, r"^error: latency: one engine step")
field_case("latency", {"model": "constant", "step_ms": 1e300}, r"^error: latency: one engine step")
field_case("latency", {"model": "constant", "step_ms": 0}, r"^error: latency\.step_ms")
field_case("latency", {"model": "roofline", "step_overhead_ms": 1e300},
           r"^error: hardware: one engine step")
field_case("latency", {"model": "roofline", "flops_efficiency": 0}, r"latency\.flops_efficiency")
field_case("latency", {"model": "roofline", "bandwidth_efficiency": 2},
           r"latency\.bandwidth_efficiency")
field_case("latency", {"model": "profile"}, r"latency\.path: is required")
field_case("latency", {"model": "profile", "path": "missing.json"}, r"latency\.path")
# "" named the scenario's folder ("cannot read: Is a directory"), not the field
field_case("latency", {"model": "profile", "path": ""}, r"^error: latency\.path: expected a "
           r"profile file or a shipped profile's name, got an empty string")
field_case("latency", {"model": "profile", "path": "  "}, r"^error: latency\.path: ")
field_case("latency", {"model": "constant", "step_ms": 1, "base_ms": 1}, r"latency\.base_ms")

# model cards: shipped names, inline shapes, a shipped card with overrides
for value, expect in [("nope", r"model: unknown name"), (5, "model"), ([1], "model"),
                      ({"name": "x"}, r"model\.\w+: is required")]:
    field_case("model", value, "^error: " + expect)
for key, values in {"layers": [0, 1.5, 2**31, "x"], "heads": [0, 3], "kv_heads": [0, 3],
                    "vocab": [0, 2**31], "max_position_embeddings": [0, 2**31],
                    "dtype_bytes": [0, 9], "qkv_bias": ["x"], "bogus": [1],
                    "hidden": [2**31, 0], "intermediate": [0, True]}.items():
    for value in values:
        named = "(heads|kv_heads)" if key in ("heads", "kv_heads") else key  # either may be off
        field_case("model", {"card": "tiny-llama-45m", key: value}, rf"^error: model\.{named}\b")
field_case("model", {"card": "tiny-llama-45m", "max_position_embeddings": 100},
           r"^error: engine\.max_model_len")
field_case("model", {"card": "tiny-llama-45m", "layers": 2**31 - 1}, r"^error: model: .*weights")
field_case("model", {"card": "tiny-llama-45m", "hidden": 2**31 - 1}, r"^error: model: .*weights")

# hardware specs: floors and ceilings where a price turns into inf or 0
for key, values in {"peak_flops": [1e-300, 0, -1, NAN, INF, "x", True, 1e308],
                    "mem_bandwidth": [1e-300, 1e308, 0],
                    "mem_bytes": [1, 1e308, NAN, -1],
                    "interconnect_bandwidth": [1e-300, 1e308],
                    "host_link_bandwidth": [1e-300, "x"],
                    "kind": ["tpu", 1], "bogus": [1]}.items():
    for value in values:
        field_case("hardware", {"spec": "H100-SXM", key: value}, rf"^error: hardware\.{key}\b")
for value in ["nope", 5, [1]]:
    field_case("hardware", value, r"^error: hardware")
# impossible deployments must not validate "ok"
field_case("model", "Llama-3.1-70B", r"^error: model: .*weights need",
           with_field("hardware", "L40S"))
field_case("engine.num_gpu_blocks", 2**31 - 1, r"^error: engine\.num_gpu_blocks: .*more than")
field_case("engine.num_gpu_blocks", 10**6, r"^error: engine\.num_gpu_blocks",
           with_field("model", "Llama-3.1-8B"))
field_case("engine.block_size", 2**31 - 1, r"^error: engine\.num_gpu_blocks")
# a static batch (whole prompts, past the budget) must fit a step's 32-bit token count
field_case("engine.max_num_seqs", 2 * 10**9, r"^error: engine\.max_num_seqs: a static batch",
           with_field("scheduler.policy", "static"))

# the workload: arrivals and length distributions
for value in [0, 1e-300, "x", NAN, 1e9]:
    field_case("workload.burstiness", value, r"^error: workload\.burstiness",
               with_field("workload.arrival", "gamma"))
field_case("workload.burstiness", 2.0, r"^error: workload\.burstiness")   # poisson has none
NO_COUNT = copy.deepcopy(TINY)
del NO_COUNT["workload"]["num_requests"]
for value in [0, 1e308, NAN, "x", -5]:
    field_case("workload.duration", value, r"^error: workload\.duration", NO_COUNT)
field_case("workload.rate", 1e9, r"^error: workload\.rate: .*requests",
           with_field("workload.duration", 10, NO_COUNT))
field_case("workload.duration", 10, r"^error: workload\.duration")         # and num_requests
field_case("workload.rate", "inf", r"^error: workload\.rate: inf",
           with_field("workload.duration", 10, NO_COUNT))
field_case("workload.rate", 5, r"^error: workload\.rate", with_field("workload.arrival", "burst"))
DISTS = [
    ({"dist": "x"}, "dist"), ({"dist": "fixed", "value": 0}, "value"),
    ({"dist": "fixed", "value": 2**31}, "value"), ({"dist": "fixed", "value": 1e308}, "value"),
    ({"dist": "fixed"}, "value"), ({"dist": "uniform", "low": 10, "high": 5}, "high"),
    ({"dist": "uniform", "low": 1, "high": 2**31}, "high"),
    ({"dist": "normal", "mean": 0, "std": 1}, "mean"), ({"dist": "normal", "mean": 5, "std": -1},
                                                         "std"),
    ({"dist": "lognormal", "mean": 100, "sigma": 1e308}, "sigma"),
    ({"dist": "lognormal", "mean": 1e308, "sigma": 1}, "mean"),
    ({"dist": "zipf", "a": 1, "max": 100}, "a"), ({"dist": "zipf", "a": 1.5}, "max"),
    ({"dist": "zipf", "a": 1.5, "max": 1e12}, "max"), ({"dist": "zipf", "a": NAN, "max": 10}, "a"),
    ({"dist": "fixed", "value": 5, "min": 0}, "min"), ({"dist": "fixed", "value": 5, "max": 0},
                                                        "max"),
    ({"dist": "fixed", "value": 5, "bogus": 1}, "bogus"),
    ({"dist": "empirical", "path": "missing.csv", "column": "x"}, "path"),
    ({"dist": "empirical", "path": "l.csv"}, "column"),
]
for dist, key in DISTS:
    field_case("workload.prompt", dist, rf"^error: workload\.prompt\.{key}\b")
    field_case("workload.output", dist, rf"^error: workload\.output\.{key}\b")
for value in ["x", 5, []]:
    field_case("workload.prompt", value, r"^error: workload\.prompt")
field_case("workload.lengths", {"path": "missing.csv", "prompt_column": "p",
                                "output_column": "o"}, r"^error: workload\.(lengths|prompt)")
CLASSES = [("x", "classes"), ([], "classes"), ([{"name": "a", "weight": 1e308}], r"classes\[0\]"),
           ([{"name": "a", "priority": 1e30}], r"classes\[0\]\.priority"),
           ([{"name": "a"}, {"name": "a"}], "classes"),
           ([{"name": "a", "slo": {"ttft_ms": -1}}], r"classes\[0\]\.slo"),
           ([{"priority": 1}], r"classes\[0\]\.name"),
           ([{"name": "a", "bogus": 1}], r"classes\[0\]\.bogus")]
for value, where in CLASSES:
    field_case("workload.classes", value, rf"^error: workload\.{where}")

# the cluster: replicas, groups, disaggregation, faults
FAULTS = [({"mtbf_s": 1e-9}, "mtbf_s"), ({"mtbf_s": 0}, "mtbf_s"), ({"max_retries": 10**9},
                                                                    "max_retries"),
          ({"restart_s": 0}, "restart_s"), ({"restart_s": 1e308}, "restart_s"),
          ({"events": [{"replica": 5, "at_s": 1}]}, r"events\[0\]\.replica"),
          ({"events": [{"replica": 0, "at_s": 1e308}]}, r"events\[0\]\.at_s"),
          ({"events": [{"replica": 0}]}, r"events\[0\]\.at_s"), ({"events": "x"}, "events"),
          ({"on_failure": "x"}, "on_failure"), ({"bogus": 1}, "bogus")]
for faults, key in FAULTS:
    field_case("cluster", {"replicas": 2, "faults": faults}, rf"^error: cluster\.faults\.{key}")
DISAGG = {"groups": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]}
for link, key in [({"bandwidth": 1e-300}, "bandwidth"), ({"bandwidth": NAN}, "bandwidth"),
                  ({"latency_us": -1}, "latency_us"), ({"latency_us": 1e308}, "latency_us"),
                  ({"link": "x"}, "link")]:
    field_case("cluster", {**DISAGG, "kv_transfer": link}, rf"^error: cluster\.kv_transfer\.{key}")
GROUPS = [("x", "groups"), ([], "groups"), ([{"role": "prefill"}], "groups"),
          ([{"name": "a"}, {"name": "a"}], r"groups\[1\]\.name"),
          ([{"replicas": 10**7}], r"groups\[0\]\.replicas"),
          ([{"replicas": 3000}, {"replicas": 3000}], "groups"),
          ([{"engine": {"num_gpu_blocks": 0}}], r"groups\[0\]\.engine\.num_gpu_blocks"),
          ([{"hardware": {"spec": "H100-SXM", "peak_flops": 1e-300}}],
           r"groups\[0\]\.hardware\.peak_flops"),
          ([{"role": "x"}], r"groups\[0\]\.role"), ([{"bogus": 1}], r"groups\[0\]\.bogus")]
for groups, key in GROUPS:
    field_case("cluster.groups", groups, rf"^error: cluster\.{key}")
field_case("cluster", {"kv_transfer": {"link": "nvlink"}}, r"^error: cluster\.kv_transfer")
field_case("cluster", {"replicas": 2, "groups": [{"name": "a"}]}, r"^error: cluster\.replicas")
# policy knobs
KNOBS = [("fastserve", "num_queues", 0), ("fastserve", "quantum_ratio", 0.5),
         ("fastserve", "base_quantum", 1e308), ("lmdeploy", "reschedule_overhead_ms", 1e308),
         ("lmdeploy", "queue_ratio_trigger", 1e308), ("lmdeploy", "low_batch_ratio", 2),
         ("lmdeploy", "schedule_interval", 0), ("s3", "error_sigma", 1e308),
         ("s3", "error_dist", "x"), ("s3", "bucket_tokens", -1), ("s3", "misprediction", "x"),
         ("tgi", "waiting_served_ratio", 1e308), ("tgi", "max_waiting_tokens", 0),
         ("tgi", "max_batch_prefill_tokens", 0), ("tgi", "waiting_served_ratio", NAN),
         ("vllm_v1", "waiting_served_ratio", 1)]
for policy, knob, value in KNOBS:
    field_case("scheduler", {"policy": policy, knob: value}, rf"^error: scheduler\.{knob}\b")
field_case("engine.enable_chunked_prefill", True, r"^error: engine\.enable_chunked_prefill",
           with_field("scheduler.policy", "vllm_v0"))
field_case("engine.enable_prefix_caching", True, r"^error: engine\.enable_prefix_caching",
           with_field("scheduler.policy", "orca"))


# --- 3. trace files, every format ----------------------------------------------------------

FORMATS = {
    "csv": ("arrival_s,prompt_tokens,output_tokens\n", "{t},{p},{o}\n"),
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "2023-11-16 18:15:{t:09.6f},{p},{o}\n"),
    "burstgpt": ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
                 "{t},ChatGPT,{p},{o},0,Conversation log\n"),
    "mooncake": ("", '{{"timestamp": {t}, "input_length": {p}, "output_length": {o}}}\n'),
}


def rows(fmt: str, bad: dict | None = None, n: int = 3) -> str:
    """A small valid trace of ``fmt`` whose second row takes the values in ``bad``."""
    head, row = FORMATS[fmt]
    out = [head]
    for i in range(n):
        values = {"t": float(i), "p": 10 + i, "o": 5}
        if i == 1 and bad:
            values.update(bad)
        out.append(row.format(**values) if fmt != "azure" or isinstance(values["t"], float)
                   else row.replace("{t:09.6f}", "{t}").format(**values))
    return "".join(out)


def trace_case(id: str, fmt: str, content: bytes | str, expect: str, **workload) -> None:
    d = with_field("workload", {"trace": "trace.txt", "format": fmt, **workload})
    both(f"trace-{fmt}-{id}", {"s.yaml": scenario_text(d), "trace.txt": content}, expect)


LINE2 = r"^error: .*trace\.txt:3: "      # second data row (header = line 1) ...
LINE2_JSONL = r"^error: .*trace\.txt:2: "  # ... or second line of a JSONL file
for fmt in FORMATS:
    line = LINE2_JSONL if fmt == "mooncake" else LINE2
    good = rows(fmt)
    trace_case("latin1", fmt, good.encode() + "caf\xe9".encode("latin-1"), r"trace\.txt.*UTF-8")
    trace_case("utf16", fmt, good.encode("utf-16"), r"trace\.txt.*(UTF-8|UTF-16)")
    trace_case("empty", fmt, b"", r"trace\.txt: ")
    trace_case("header-only", fmt, FORMATS[fmt][0] or "\n", r"trace\.txt: ")
    for key, values in {"p": ["1e19", "0", "-1", "1.5", "abc", "", "9223372036854775808",
                              "2147483648", "nan", "inf"],
                        "o": ["1e19", "-1", "abc", "1e308"]}.items():
        for v in values:
            if fmt == "mooncake" and v in ("", "abc", "nan", "inf"):
                v = {"": "null", "abc": '"abc"', "nan": "NaN", "inf": "Infinity"}[v]
            trace_case(f"{key}={v}", fmt, rows(fmt, {key: v}), line)
    if fmt != "azure":
        for t in ["1e308", "-1", "abc", "inf"]:
            if fmt == "mooncake" and t in ("abc", "inf"):
                t = {"abc": '"abc"', "inf": "Infinity"}[t]
            trace_case(f"t={t}", fmt, rows(fmt, {"t": t}), line)
    trace_case("rate-tiny", fmt, good, r"^error: workload\.rate", rate=1e-300)
    trace_case("time-scale-huge", fmt, good, r"^error: workload\.time_scale", time_scale=1e308)
    trace_case("window-empty", fmt, good, r"trace\.txt: no requests in the window",
               start_s=1000)
    trace_case("num-requests-huge", fmt, good, r"workload\.num_requests", num_requests=10**12)
    trace_case("end-before-start", fmt, good, r"workload\.end_s", start_s=5, end_s=1)
# format-specific rows
CSV_HEAD = FORMATS["csv"][0]
for id, text, expect in [
    ("missing-column", "arrival_s,prompt_tokens\n0,1\n", r"trace\.txt: missing required column"),
    ("extra-field", CSV_HEAD + "0,1,1\n1,2,3,4\n", LINE2),
    ("priority-1e30", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,0\n1,2,1,1e30\n",
     LINE2),
    ("priority-2^63", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,0\n1,2,1,"
                      "9223372036854775808\n", LINE2),
    ("priority-text", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,0\n1,2,1,high\n",
     LINE2),
    ("nul-in-row", CSV_HEAD + "0,1,1\n1,2\x00,1\n", LINE2),
]:
    trace_case(id, "csv", text, expect)
AZ_HEAD = FORMATS["azure"][0]
for id, ts, expect in [("bad-hour", "2023-11-16 25:15:50.99", LINE2),
                       ("year-span", "9999-11-16 18:15:47", LINE2),
                       ("not-a-time", "yesterday", LINE2), ("empty", "", LINE2)]:
    trace_case(f"ts-{id}", "azure", AZ_HEAD + f"2023-11-16 18:15:46.68,1,1\n{ts},2,1\n", expect)
MC_OK = '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
for id, line in [
    ("bool-length", '{"timestamp": 5, "input_length": true, "output_length": 2}'),
    ("bool-output", '{"timestamp": 5, "input_length": 3, "output_length": false}'),
    ("list-length", '{"timestamp": 5, "input_length": [3], "output_length": 2}'),
    ("object-length", '{"timestamp": 5, "input_length": {"a": 1}, "output_length": 2}'),
    ("big-int", '{"timestamp": 5, "input_length": ' + "9" * 400 + ', "output_length": 2}'),
    ("priority-huge", '{"timestamp": 5, "input_length": 3, "output_length": 2, '
                      '"priority": 100000000000000000000000}'),
    ("priority-bool", '{"timestamp": 5, "input_length": 3, "output_length": 2, "priority": true}'),
    ("priority-float", '{"timestamp": 5, "input_length": 3, "output_length": 2, "priority": 1.5}'),
    ("class-number", '{"timestamp": 5, "input_length": 3, "output_length": 2, "class": 5}'),
    ("hash-ids-text", '{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": "x"}'),
    ("hash-ids-bool", '{"timestamp": 5, "input_length": 3, "output_length": 2, '
                      '"hash_ids": [true]}'),
    ("hash-ids-float", '{"timestamp": 5, "input_length": 3, "output_length": 2, '
                       '"hash_ids": [1.5]}'),
    ("duplicate-key", '{"timestamp": 5, "input_length": 3, "input_length": 9, '
                      '"output_length": 2}'),
    ("hash-ids-past-prompt", '{"timestamp": 5, "input_length": 3, "output_length": 2, '
                             '"hash_ids": [1, 2]}'),
    ("not-object", "[1, 2, 3]"), ("null", "null"), ("truncated", '{"timestamp": 5'),
    ("deep", '{"timestamp": 5, "x": ' + "[" * 100000 + "]" * 100000 + "}"),
    ("missing-field", '{"timestamp": 5, "input_length": 3}'),
    ("nul", '{"timestamp": 5, "input_length": 3, "output_length": 2}\x00'),
]:
    trace_case(id, "mooncake", MC_OK + line + "\n", LINE2_JSONL)
both("trace-file-not-found", {"s.yaml": scenario_text(with_field(
    "workload", {"trace": "nope.csv", "format": "csv"}))},
     r"^error: workload\.trace: file not found")
both("trace-format-unknown", {"s.yaml": scenario_text(with_field(
    "workload", {"trace": "t.csv", "format": "parquet"})), "t.csv": rows("csv")},
     r"^error: workload\.format")
both("trace-model-not-burstgpt", {"s.yaml": scenario_text(with_field(
    "workload", {"trace": "t.csv", "format": "csv", "model": "x"})), "t.csv": rows("csv")},
     r"^error: workload\.model")
both("burstgpt-model-absent", {"s.yaml": scenario_text(with_field(
    "workload", {"trace": "t.csv", "format": "burstgpt", "model": "GPT-9"})),
    "t.csv": rows("burstgpt")}, r"t\.csv: no rows with Model")
# lengths files (empirical, joint pairs)
for id, text, expect in [("latin1", b"n\n1\n\xe9\n", r"l\.csv.*UTF-8"),
                         ("utf16", "n\n1\n2\n".encode("utf-16"), r"l\.csv"),
                         ("zero", "n\n1\n0\n", r"l\.csv:3"), ("huge", "n\n1\n1e19\n", r"l\.csv:3"),
                         ("text", "n\n1\nabc\n", r"l\.csv:3"), ("no-rows", "n\n", r"l\.csv"),
                         ("no-column", "m\n1\n", r"l\.csv.*missing required column")]:
    both(f"lengths-{id}", {"s.yaml": scenario_text(with_field(
        "workload.prompt", {"dist": "empirical", "path": "l.csv", "column": "n"})),
        "l.csv": text}, expect)


# ShareGPT files (lengths: {format: sharegpt})
for id, text, expect in [("latin1", b'[{"a": "\xe9"}]', r"sg\.json.*UTF-8"),
                         ("not-json", "[{", r"sg\.json:\d+: not JSON"),
                         ("not-list", "{}", r"sg\.json: .*JSON list"),
                         ("deep", "[" * 100000 + "]" * 100000, r"sg\.json: .*nested"),
                         ("empty", "[]", r"sg\.json: no usable"),
                         ("no-text", '[{"conversations": [{"value": 1}, {"value": "x"}]}]',
                          r"sg\.json: conversation 0"),
                         ("utf16", "[]".encode("utf-16"), r"sg\.json")]:
    both(f"sharegpt-{id}", {"s.yaml": scenario_text(with_field("workload.lengths", {
        "format": "sharegpt", "path": "sg.json"}, with_field("workload.prompt", None,
                                                             with_field("workload.output", None)))),
        "sg.json": text}, expect)
for lengths, key in [({"format": "sharegpt", "path": "sg.json", "output_len": 0}, "output_len"),
                     ({"format": "sharegpt", "path": "sg.json", "chars_per_token": 0},
                      "chars_per_token"),
                     ({"format": "sharegpt", "path": "sg.json", "prompt_column": "x"},
                      "prompt_column"),
                     ({"format": "parquet", "path": "sg.json"}, "format")]:
    field_case("workload.lengths", lengths, rf"^error: workload\.lengths\.{key}",
               with_field("workload.prompt", None, with_field("workload.output", None)))


# --- 4. profile files (latency: profile) ---------------------------------------------------

PROFILE_SCENARIO = scenario_text(with_field("latency", {"model": "profile", "path": "p.json"}))
for id, text in [("latin1", b'{"a": "\xe9"}'), ("utf16", '{"a": 1}'.encode("utf-16")),
                 ("not-json", b"{nope"), ("deep", b"[" * 100000 + b"]" * 100000),
                 ("list", b"[1, 2]"), ("empty-object", b"{}"), ("empty", b""),
                 ("nan", b'{"schema_version": NaN}'), ("future", b'{"schema_version": 999}')]:
    both(f"profile-{id}", {"s.yaml": PROFILE_SCENARIO, "p.json": text}, r"p\.json")


# --- 5. --set overrides ----------------------------------------------------------------------

SETS = [("seed=", r"--set seed"), ("=5", r"--set"), ("noequals", r"--set"),
        (" =5", r"--set"), ("seed=   ", r"--set seed"),
        ("engine.max_num_seqs=1e308", r"engine\.max_num_seqs"),
        ("engine.max_num_seqs=0", r"engine\.max_num_seqs"),
        ("engine.max_num_seqs=.nan", r"engine\.max_num_seqs"),
        ("engine.num_gpu_blocks=1e30", r"engine\.num_gpu_blocks"),
        ("engine=5", r"engine"), ("engine.max_num_seqs.x=1", r"engine\.max_num_seqs"),
        ("workload.rate=nan", r"workload\.rate"), ("workload.rate=abc", r"workload\.rate"),
        ("workload.rate=1e-300", r"workload\.rate"), ("seed=-1", r"seed"),
        ("seed=10000000000000000000000000000", r"seed"), ("seed=[1, 2]", r"seed"),
        ("seed={a: 1, a: 2}", r"--set seed: duplicate key"),
        ("seed=" + "[" * 1000 + "]" * 1000, r"--set seed: nested"),
        ("seed=&a [*a]", r"--set seed"), ("seed=a\x00b", r"--set seed"),
        ("engine.bogus=1", r"engine\.bogus"), ("cluster.replicas=10000000", r"cluster\.replicas"),
        ("model.layers=0", r"model\.layers"), ("hardware.peak_flops=1e-300",
                                               r"hardware\.peak_flops"),
        ("workload.num_requests=1e12", r"workload\.num_requests"),
        ("engine.max_model_len=1000000", r"engine\.max_model_len"),
        ("scheduler.policy=nope", r"scheduler\.policy"),
        # a flow mapping or list left open: the syntax error, not "expected a mapping, got
        # str" for the text kept as a string
        ("workload.prompt={dist: fixed, value: 10", r"--set workload\.prompt: invalid YAML"),
        ("workload.classes=[{name: a}", r"--set workload\.classes: invalid YAML")]
for value, expect in SETS:
    for cmd in ("validate", "run"):
        add(f"{cmd}-set-{value!r}"[:80], [cmd, str(DATA / "tiny.yaml"), "--set", value,
                                          *(["--no-report", "--out", "{d}/o"] if cmd == "run"
                                            else [])], "^error: " + expect)


# --- 6. sweep and compare files --------------------------------------------------------------

TINY_PATH = str(DATA / "tiny.yaml")
SWEEPS = [
    ("grid-not-mapping", f"base: {TINY_PATH}\ngrid: [1, 2]\n", r"^error: grid"),
    ("grid-not-list", f"base: {TINY_PATH}\ngrid:\n  workload.rate: 5\n",
     r"^error: grid\.workload\.rate"),
    ("grid-empty-list", f"base: {TINY_PATH}\ngrid:\n  workload.rate: []\n",
     r"^error: grid\.workload\.rate"),
    ("nothing", f"base: {TINY_PATH}\n", r"^error: grid"),
    ("zip-lengths", f"base: {TINY_PATH}\nzip:\n  workload.rate: [1, 2]\n  seed: [1]\n",
     r"^error: zip"),
    ("both-axes", f"base: {TINY_PATH}\ngrid:\n  seed: [1]\nzip:\n  seed: [2]\n",
     r"^error: zip\.seed"),
    ("base-missing", "base: nope.yaml\ngrid:\n  seed: [1]\n", r"nope\.yaml: file not found"),
    ("base-and-scenario", f"base: {TINY_PATH}\nscenario: {{}}\ngrid:\n  seed: [1]\n",
     r"^error: base"),
    ("bad-point", f"base: {TINY_PATH}\ngrid:\n  workload.rate: [5, -1]\n",
     r"^error: workload\.rate: .*sweep point 1"),
    ("bad-point-type", f"base: {TINY_PATH}\ngrid:\n  engine.max_num_seqs: [4, x]\n",
     r"^error: engine\.max_num_seqs: .*sweep point 1"),
    ("unknown-key", f"base: {TINY_PATH}\ngrid:\n  seed: [1]\nbogus: 1\n", r"^error: bogus"),
    ("dup-grid", f"base: {TINY_PATH}\ngrid:\n  seed: [1]\ngrid:\n  seed: [2]\n",
     r"s\.yaml:4: duplicate key"),
    ("dup-axis", f"base: {TINY_PATH}\ngrid:\n  seed: [1]\n  seed: [2]\n",
     r"s\.yaml:4: duplicate key"),
    ("latin1", f"base: {TINY_PATH}\ngrid:\n  seed: [1]\n# \xe9\n", r"s\.yaml:4: .*UTF-8"),
    ("alias-bomb", f"base: {TINY_PATH}\n" + _bomb(8, 10, "grid"), r"s\.yaml:\d+: .*alias"),
    ("deep", f"base: {TINY_PATH}\ngrid: " + "[" * 500 + "]" * 500 + "\n", r"s\.yaml:\d+: nested"),
    ("compare-in-base", "scenario:\n  compare: {seed: [1]}\ngrid:\n  seed: [1]\n",
     r"^error: compare"),
    ("set-not-mapping", f"base: {TINY_PATH}\nset: [1]\ngrid:\n  seed: [1]\n", r"^error: set"),
    ("set-bad-value",
     f"base: {TINY_PATH}\nset: {{engine.max_num_seqs: 0}}\ngrid: {{seed: [1, 2]}}\n",
     r"^error: set\.engine\.max_num_seqs: must be >= 1, got 0$"),
    ("impossible-point", f"base: {TINY_PATH}\ngrid:\n  engine.num_gpu_blocks: [64, 2000000000]\n",
     r"^error: (sweep point 1 .*engine\.num_gpu_blocks: |engine\.num_gpu_blocks: .*point 1)"),
    ("field-not-path", f"base: {TINY_PATH}\ngrid:\n  '': [1]\n", r"^error: grid"),
]
for id, text, expect in SWEEPS:
    files = {"s.yaml": text.encode("latin-1") if "\xe9" in text else text}
    add(f"sweep-{id}", ["sweep", "{d}/s.yaml", "--workers", "1", "--no-report",
                        "--out", "{d}/o"], expect, files)
    add(f"validate-sweep-{id}", ["validate", "{d}/s.yaml"], expect, files)
add("sweep-workers-0", ["sweep", "{d}/s.yaml", "--workers", "0"], r"^error: --workers",
    {"s.yaml": f"base: {TINY_PATH}\ngrid:\n  seed: [1]\n"})
COMPARES = [
    ("not-list", "compare: 5\n", r"^error: compare"),
    ("empty-list", "compare: []\n", r"^error: compare"),
    ("empty-values", "compare:\n  seed: []\n", r"^error: compare\.seed"),
    ("item-not-mapping", "compare:\n  - 5\n", r"^error: compare\[0\]"),
    ("duplicate-labels", "compare:\n  - {label: a, seed: 1}\n  - {label: a, seed: 2}\n",
     r"^error: compare: variant labels must be unique"),
    ("labels-same-folder", "compare:\n  - {label: a/b, seed: 1}\n  - {label: a_b, seed: 2}\n",
     r"^error: compare: variant labels must differ"),
    ("bad-variant", "compare:\n  - {label: ok, seed: 1}\n  - {label: bad, seed: -1}\n",
     r"^error: seed: .*variant 'bad'"),
    ("impossible-variant", "compare:\n  - {label: ok, seed: 1}\n"
                           "  - {label: big, engine.num_gpu_blocks: 2000000000}\n",
     r"^error: engine\.num_gpu_blocks: .*'big'"),
    ("bad-field-in-list", "compare:\n  engine.bogus: [1, 2]\n", r"^error: engine\.bogus"),
]
for id, tail, expect in COMPARES:
    files = {"s.yaml": TINY_TEXT + tail}
    add(f"compare-{id}", ["run", "{d}/s.yaml", "--no-report", "--out", "{d}/o"], expect, files)
    add(f"validate-compare-{id}", ["validate", "{d}/s.yaml"], expect, files)


# --- 7. capacity and report --------------------------------------------------------------------

CONSTANT = str(DATA / "tiny.yaml")
for args, expect in [
    (["--max-replicas", "0", "--target-rate", "50"], r"--max-replicas"),
    (["--max-replicas", "-1", "--target-rate", "50"], r"--max-replicas"),
    (["--max-replicas", "10000000", "--target-rate", "50"], r"--max-replicas"),
    (["--max-replicas", "abc"], r"--max-replicas"),
    (["--target-rate", "0"], r"--target-rate"), (["--target-rate", "-1"], r"--target-rate"),
    (["--target-rate", "inf"], r"--target-rate"), (["--target-rate", "nan"], r"--target-rate"),
    (["--tolerance", "0"], r"--tolerance"), (["--tolerance", "1e-300"], r"--tolerance"),
    (["--tolerance", "nan"], r"--tolerance"), (["--tolerance", "1"], r"--tolerance"),
    (["--seeds", "0"], r"--seeds"), (["--seeds", "1000000000"], r"--seeds"),
    (["--set", "slo=null"], r"^error: slo"),
    (["--set", "workload.arrival=burst", "--set", "workload.rate=null"], r"workload\.arrival"),
]:
    add(f"capacity-{' '.join(args)}", ["capacity", CONSTANT, "--no-report", "--quiet",
                                       "--out", "{d}/o", *args], expect)
for args, expect, files in [
    (["--target-rate", "0"], r"--target-rate", {}),
    (["--target-rate", "-1"], r"--target-rate", {}),
    (["--target-rate", "inf"], r"--target-rate", {}),
    (["--target-rate", "nan"], r"--target-rate", {}),
    (["--target-rate", "abc"], r"--target-rate", {}),
    (["--target-rate", "5", "--workers", "0"], r"--workers", {}),
    (["--target-rate", "5", "--set", "plan.hardware=[H200]"], r"plan\.prices\.H200", {}),
    (["--target-rate", "5", "--set", "plan.tensor_parallel_size=[]"],
     r"plan\.tensor_parallel_size", {}),
    (["--target-rate", "5", "--set", "plan.hardware=[H100-SXM]", "--set",
      "plan.max_num_seqs=[0]"], r"plan\.max_num_seqs\[0\]", {}),
    (["--target-rate", "5", "--set", "plan.disaggregation=[x]"], r"plan\.disaggregation", {}),
    (["--target-rate", "5", "--set", "plan.prices={L40S: nan}"], r"plan\.prices\.L40S", {}),
    (["--target-rate", "5", "--set", "plan.wave=0"], r"plan\.wave", {}),
    (["--target-rate", "5", "--set", "plan.bogus=1"], r"plan\.bogus", {}),
    (["--target-rate", "5", "--plan", "{d}/nope.yaml"], r"nope\.yaml", {}),
    (["--target-rate", "5", "--plan", "{d}/p.yaml"], r"p\.yaml", {"p.yaml": b"\xff"}),
    (["--target-rate", "5", "--plan", "{d}/p.yaml"], r"tensor_parallel_size\[0\]",
     {"p.yaml": "plan: {hardware: [H100-SXM], tensor_parallel_size: [-2]}\n"}),
    (["--target-rate", "5", "--set", "slo=null", "--set", "plan.hardware=[H100-SXM]"],
     r"^error: slo", {}),
]:
    add(f"plan-{' '.join(args)}", ["plan", CONSTANT, "--no-report", "--quiet", "--out", "{d}/o",
                                   *args], expect, files)
for id, files, expect in [
    ("empty-dir", {"r/x.txt": "x"}, r"r"),
    ("bad-summary", {"r/summary.json": b"\xe9", "r/requests.csv": "a\n1\n",
                     "r/steps.csv": "a\n1\n", "r/scenario.yaml": TINY_TEXT}, r"summary\.json"),
    ("deep-summary", {"r/summary.json": "[" * 100000 + "]" * 100000, "r/requests.csv": "a\n1\n",
                      "r/steps.csv": "a\n1\n", "r/scenario.yaml": TINY_TEXT}, r"summary\.json"),
    ("list-summary", {"r/summary.json": "[1]", "r/requests.csv": "a\n1\n",
                      "r/steps.csv": "a\n1\n", "r/scenario.yaml": TINY_TEXT}, r"summary\.json"),
    ("bad-scenario", {"r/summary.json": "{}", "r/requests.csv": "a\n1\n",
                      "r/steps.csv": "a\n1\n", "r/scenario.yaml": b"\x00"}, r"scenario\.yaml"),
    ("bad-steps", {"r/summary.json": "{}", "r/requests.csv": "a\n1\n",
                   "r/steps.csv": b"\xff\xfe\x00", "r/scenario.yaml": TINY_TEXT}, r"steps\.csv"),
    ("bad-sweep", {"r/sweep.csv": b"\xff\xfe", "r/sweep.yaml": "name: x\n"}, r"sweep\.(csv|yaml)"),
    ("bad-capacity", {"r/capacity.json": "{nope", "r/probes.csv": "a\n"}, r"capacity\.json"),
    ("bad-plan", {"r/plan.json": "{nope", "r/candidates.csv": "a\n"}, r"plan\.json"),
]:
    add(f"report-{id}", ["report", "{d}/r", "--out", "{d}/rep"], expect, files)
add("report-missing-dir", ["report", "{d}/nope"], r"nope")


# --- 8. issue #33: grids too large to expand, numbers that overflow, flags left empty ---------

def _axes(n_axes: int, n_values: int) -> str:
    fields = ["seed", "workload.rate", "slo.ttft_ms", "slo.tpot_ms", "engine.max_num_seqs",
              "workload.num_requests", "slo.e2el_ms", "latency.base_ms", "latency.per_token_ms",
              "latency.per_seq_ms", "workload.prefix_len", "latency.per_token_ms"][:n_axes]
    return "".join(f"  {f}: [{', '.join(str(i + 1) for i in range(n_values))}]\n"
                   for f in dict.fromkeys(fields))


for id, text, expect in [
    # every point valid: before the count, validating 10^6 of them took ~50 minutes
    ("grid-10^6", f"base: {TINY_PATH}\ngrid:\n{_axes(6, 10)}", r"^error: grid: 1,000,000 "
                                                                 r"points .* 10,000"),
    ("grid-10^11", f"base: {TINY_PATH}\ngrid:\n{_axes(12, 10)}", r"^error: grid: 1\d\d,000"),
    ("grid-x-zip", f"base: {TINY_PATH}\ngrid:\n  workload.rate: [1, 2]\nzip:\n  seed: ["
                   + ", ".join(map(str, range(5001))) + "]\n", r"^error: grid: 10,002 points"),
]:
    add(f"sweep-{id}", ["sweep", "{d}/s.yaml", "--no-report", "--out", "{d}/o"], expect,
        {"s.yaml": text})
    add(f"validate-sweep-{id}", ["validate", "{d}/s.yaml"], expect, {"s.yaml": text})
for workers in ("1000000", "-3"):
    add(f"sweep-workers-{workers}", ["sweep", "{d}/s.yaml", "--workers", workers, "--out",
                                     "{d}/o"], r"^error: --workers: must be 1 to \d+",
        {"s.yaml": f"base: {TINY_PATH}\ngrid:\n  seed: [1, 2]\n"})
for value in ("1e400", "-1e400", "1e309", ".nan", ".NaN", "[1e400]"):
    add(f"set-rate={value}", ["validate", "{d}/s.yaml", "--set", f"workload.rate={value}"],
        r"^error: (--set )?workload\.rate: ", {"s.yaml": TINY_TEXT})
for path, value in [("slo.ttft_ms", "1e400"), ("latency.base_ms", ".nan"),
                    ("metric_percentiles", "[50, 1e400]"), ("seed", "1e400"),
                    ("workload.num_requests", "1e400")]:
    add(f"set-{path}={value}", ["run", "{d}/s.yaml", "--no-report", "--out", "{d}/o", "--set",
                                f"{path}={value}"], rf"^error: (--set )?{re.escape(path)}\b",
        {"s.yaml": TINY_TEXT})
for id, old, new, expect in [
        ("rate-1e400", "rate: 20", "rate: 1e400", r"s\.yaml:\d+: 1e400 is too large"),
        ("ttft-1e400", "ttft_ms: 100", "ttft_ms: -1e400", r"s\.yaml:\d+: -1e400 is too large"),
        ("ttft-nan", "ttft_ms: 100", "ttft_ms: .nan", r"^error: slo\.ttft_ms: ")]:
    both(f"file-{id}", {"s.yaml": TINY_TEXT.replace(old, new)}, expect)
for value in ("", " ", ",", "abc", "50,,99", "50,1e400", "nan", "0"):
    add(f"metric-percentiles={value!r}", ["run", "{d}/s.yaml", "--no-report", "--out", "{d}/o",
                                          "--metric-percentiles", value],
        r"^error: --metric-percentiles: ", {"s.yaml": TINY_TEXT})
for duration in ("0.001", "0.000001"):
    add(f"capacity-hold-duration-{duration}", ["capacity", "{d}/s.yaml", "--hold", "duration",
                                               "--seeds", "1", "--no-report", "--quiet",
                                               "--out", "{d}/o"],
        r"^error: workload\.duration: .* too short to hold a request",
        {"s.yaml": TINY_TEXT.replace("num_requests: 60", f"duration: {duration}")})
for key, value in [("timestamp", '"1000"'), ("input_length", '"10"'),
                   ("output_length", '"5"'), ("timestamp", '"soon"')]:
    line = {"timestamp": "5", "input_length": "3", "output_length": "2", key: value}
    trace_case(f"string-{key}={value}", "mooncake",
               MC_OK + "{" + ", ".join(f'"{k}": {v}' for k, v in line.items()) + "}\n",
               LINE2_JSONL + f".*{key}.* must be a JSON number")


# --- the test --------------------------------------------------------------------------------

PROGRESS = re.compile(r"^\r?\w+ \[[#-]+\] \d+/\d+ ")


class Hang(Exception):
    pass


@contextlib.contextmanager
def bounded(seconds: float, headroom: int):
    """Raise Hang after ``seconds``; MemoryError past ``headroom`` more bytes of address space."""
    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + headroom
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_case(case: Case, folder: Path, capsys) -> tuple[int, str, str, float]:
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    argv = [a.replace("{d}", str(folder)) for a in case.argv]
    t0 = time.perf_counter()
    with bounded(SECONDS, HEADROOM):
        try:
            code = main(argv)
        except SystemExit as e:        # argparse's usage errors
            code = e.code
    return code, *capsys.readouterr(), time.perf_counter() - t0


def test_there_are_enough_cases():
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_named_error(case, tmp_path, capsys, monkeypatch):
    cwd = tmp_path / "cwd"       # default output folders (runs/...) land here, if anywhere
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, out, err, wall = run_case(case, tmp_path, capsys)
    assert "Traceback" not in out + err
    # a progress bar (sweeps) is not an error line
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert code == 2, f"exit {code}; stderr: {err[-500:]!r}; stdout: {out[-300:]!r}"
    assert len(lines) == 1, f"expected one line, got {lines}"
    assert lines[0].startswith("error: ")
    assert re.search(case.expect, lines[0]), f"{lines[0]!r} does not name {case.expect!r}"
    assert wall < SECONDS


# --- accepted inputs and the promises about what is written ----------------------------------

def run_ok(argv: list[str], capsys) -> tuple[str, str]:
    with bounded(SECONDS, HEADROOM):
        code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in out + err
    return out, err


@pytest.mark.parametrize("text, field, value", [
    ("rate: 1e1", "workload.rate", 10.0), ("rate: 2E+1", "workload.rate", 20.0),
    ("rate: 1.5e1", "workload.rate", 15.0), ("num_requests: 6e1", "workload.num_requests", 60),
])
def test_yaml_12_exponents_are_numbers(tmp_path, text, field, value):
    from simserve.config import load_scenario
    key = text.split(":")[0]
    src = re.sub(rf"^  {key}: .*$", f"  {text}", TINY_TEXT, flags=re.M)
    path = tmp_path / "s.yaml"
    path.write_text(src)
    s = load_scenario(path)
    section, name = field.split(".")
    got = getattr(s.workload.arrival, name)
    assert got == value and type(got) is type(value)
    assert load_scenario(DATA / "tiny.yaml", [f"{field}={text.split(': ')[1]}"]) == s


@pytest.mark.parametrize("digits", [0, 1, 6, 7, 9, 12])
def test_azure_timestamps_with_any_fraction_are_read(tmp_path, digits):
    from simserve.workload import build_workload
    from simserve.fields import Fields
    from simserve.workload.config import WorkloadConfig
    frac = "" if digits == 0 else "." + "1234567890123"[:digits]
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    f"2023-11-16 18:15:46{frac},10,5\n2023-11-16 18:15:48{frac},10,5\n"
                    "2023-11-16 18:15:49,10,5\n")
    cfg = WorkloadConfig.from_fields(Fields({"trace": str(path), "format": "azure"}, "workload"))
    reqs = build_workload(cfg, 0, tmp_path)
    f = float("0" + frac) if frac else 0.0
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 2.0, 3.0 - f], abs=1e-9)


def test_compare_labels_never_leave_the_output_folder(tmp_path, capsys):
    labels = ["../../escape", "a/b", "..", "/abs", "c\\d", "e\x00f", ".hidden"]
    items = "".join(f"  - {{label: {json.dumps(lb)}, seed: {i}}}\n" for i, lb in enumerate(labels))
    path = tmp_path / "deep" / "er" / "s.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(TINY_TEXT + "compare:\n" + items)
    out = tmp_path / "deep" / "er" / "out"
    before = set(tmp_path.rglob("*"))
    run_ok(["run", path, "--no-report", "--quiet", "--out", out], capsys)
    written = set(tmp_path.rglob("*")) - before
    assert written and all(p == out or out in p.parents for p in written)
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(folders) == len(labels)
    assert all(not f.startswith(".") and "/" not in f and "\x00" not in f for f in folders)
    assert not (tmp_path / "escape").exists() and not Path("/abs").exists()


def test_a_failing_variant_keeps_the_others(tmp_path, capsys, monkeypatch):
    # The second variant fails while it runs (more replica failures than a run allows): the
    # first keeps its results and the comparison table, and the exit code says it failed.
    import simserve.cluster.faults
    monkeypatch.setattr(simserve.cluster.faults, "MAX_FAILURES", 50)
    path = tmp_path / "s.yaml"
    path.write_text(TINY_TEXT + "compare:\n  - {label: fine, seed: 1}\n"
                                "  - {label: flaky, cluster: {replicas: 2, faults: "
                                "{mtbf_s: 0.001, restart_s: 0.001}}}\n")
    with bounded(SECONDS, HEADROOM):
        code = main(["run", str(path), "--no-report", "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert re.match(r"error: flaky: cluster\.faults\.mtbf_s: ", lines[0])
    assert (tmp_path / "o" / "fine" / "requests.csv").is_file()
    table = (tmp_path / "o" / "comparison.csv").read_text()
    assert "fine" in table and "flaky" not in table


def test_huge_seed_within_int64_is_accepted(capsys, tmp_path):
    from simserve.config import load_scenario
    run_ok(["run", DATA / "tiny.yaml", "--set", f"seed={2**63 - 1}", "--no-report", "--quiet",
            "--out", tmp_path], capsys)
    # used as given, not clipped or wrapped: the written scenario reruns with it
    assert load_scenario(tmp_path / "scenario.yaml").seed == 2**63 - 1
    assert json.loads((tmp_path / "summary.json").read_text())["num_requests"] == 60
