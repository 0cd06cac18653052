"""Request lengths from benchmark datasets, the way ``vllm bench serve`` samples them.

**ShareGPT** (``--dataset-name sharegpt``; learned from vLLM's
``vllm/benchmarks/datasets/datasets.py``, ``ShareGPTDataset`` and ``is_valid_sequence``): a JSON
list of conversations; an entry with at least two turns gives one request, its first turn the
prompt and its second the completion. The entries are shuffled with the run's seed and taken in
that order; a request is kept only if its prompt has 4 to 1,024 tokens, its output at least 4
(unless ``output_len`` fixes every output, vLLM's ``--sharegpt-output-len``) and both together at
most 2,048; when fewer are kept than requests wanted, kept ones are drawn again at random
(vLLM's oversampling).

vLLM counts tokens with the served model's tokenizer. simserve has none, so a text's token count
is an **estimate**: ``ceil(characters / chars_per_token)`` with ``chars_per_token: 4`` by
default (about right for English text and Llama-family tokenizers; code and other languages
differ). For exact counts, tokenize once and give the counts as a lengths CSV
(``lengths: {path, prompt_column, output_column}``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from simserve.errors import DataError
from simserve.safeyaml import read_text

MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048     # vLLM's is_valid_sequence defaults
MAX_DATASET_BYTES = 2 * 2**30


def read_sharegpt(path: Path, chars_per_token: float,
                  output_len: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of the usable entries, in file order."""
    try:
        data = json.loads(read_text(path, MAX_DATASET_BYTES))
    except json.JSONDecodeError as e:
        raise DataError(path, f"not JSON: {e.msg}", e.lineno) from None
    except RecursionError:
        raise DataError(path, "not a ShareGPT file: JSON nested too deeply") from None
    if not isinstance(data, list):
        raise DataError(path, "not a ShareGPT file: expected a JSON list of conversations")
    prompts, outputs = [], []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue                          # vLLM skips these too
        texts = []
        for turn in turns[:2]:
            value = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise DataError(path, f"conversation {i}: a turn without a text 'value'")
            texts.append(value)
        p = math.ceil(len(texts[0]) / chars_per_token)
        o = output_len if output_len is not None else math.ceil(len(texts[1]) / chars_per_token)
        too_short = p < MIN_LEN or (output_len is None and o < MIN_LEN)
        if too_short or p > MAX_PROMPT_LEN or p + o > MAX_TOTAL_LEN:
            continue
        prompts.append(p)
        outputs.append(o)
    if not prompts:
        raise DataError(path, "no usable conversation (two turns, prompt of 4 to 1,024 "
                              "estimated tokens, at most 2,048 with the output)")
    return np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)


def sample_in_order(n_rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices as vLLM takes dataset entries: a shuffle, then oversampling if short."""
    order = rng.permutation(n_rows)[:n]
    if n > n_rows:
        order = np.concatenate([order, rng.integers(0, n_rows, size=n - n_rows)])
    return order
