"""The ``vllm serve`` command line of a planned deployment, in vLLM's own argument names.

The names are those of vLLM's ``EngineArgs.add_cli_args`` (``vllm/engine/arg_utils.py``; read
at vllm-project/vllm commit 99d7eb5d, the 0.11 series): boolean fields take
``argparse.BooleanOptionalAction``, so ``--enable-prefix-caching`` has its
``--no-enable-prefix-caching``. ``tests/unit/test_plan.py`` checks every flag written here
against that list.
"""

from __future__ import annotations

import json
import re
import shlex

from simserve.plan.space import COLOCATED, Candidate

# vLLM's P/D disaggregation: each instance joins a KV connector (NIXL here; any connector of
# vLLM's kv_transfer docs works), as a producer and consumer of KV
KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def engine_flags(s) -> list[str]:
    """The engine knobs of scenario ``s`` as vLLM flags (every one simserve models)."""
    e = s.engine
    flags = [f"--tensor-parallel-size {e.tensor_parallel_size}",
             f"--pipeline-parallel-size {e.pipeline_parallel_size}"]
    if e.data_parallel_size > 1:
        flags.append(f"--data-parallel-size {e.data_parallel_size}")
    if e.enable_expert_parallel:
        flags.append("--enable-expert-parallel")
    flags += [f"--max-model-len {s.max_model_len}",
              f"--max-num-batched-tokens {s.max_num_batched_tokens}",
              f"--max-num-seqs {e.max_num_seqs}",
              f"--gpu-memory-utilization {e.gpu_memory_utilization:g}",
              f"--block-size {e.block_size}",
              "--enable-chunked-prefill" if s.chunked_prefill else "--no-enable-chunked-prefill",
              "--enable-prefix-caching" if e.enable_prefix_caching
              else "--no-enable-prefix-caching"]
    if e.kv_cache_dtype != "auto":
        flags.append(f"--kv-cache-dtype {e.kv_cache_dtype}")
    if e.quantization is not None:
        flags.append(f"--quantization {e.quantization}")
    if e.async_scheduling:
        flags.append("--async-scheduling")
    return flags


def vllm_serve(s, cand: Candidate) -> list[str]:
    """One command per kind of replica: one line colocated; a prefill and a decode line
    (each with the KV connector) disaggregated, each saying how many replicas run it."""
    base = " ".join(["vllm serve", shlex.quote(hf_id(s.model)), *engine_flags(s)])
    if cand.mode == COLOCATED:
        return [base]
    p, d = cand.prefill_decode
    kv = "--kv-transfer-config " + shlex.quote(json.dumps(KV_TRANSFER, separators=(",", ":")))
    return [f"{base} {kv}  # prefill replicas: {p} per copy",
            f"{base} {kv}  # decode replicas: {d} per copy"]


def hf_id(card) -> str:
    """The model's Hugging Face id where its card's source names one (``owner/name
    config.json``), else the card's name."""
    m = re.search(r"([\w.-]+/[\w.-]+) config\.json", card.source or "")
    return m.group(1) if m else card.name
