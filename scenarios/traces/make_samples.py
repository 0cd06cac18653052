"""Write the small trace samples shipped in this folder. Every value is drawn here, from a fixed
seed: nothing is copied from a published trace. Run it again to regenerate them byte for byte::

    python scenarios/traces/make_samples.py

* ``mooncake_prefix_sample.jsonl`` — Mooncake's JSONL format (``timestamp`` in ms,
  ``input_length``, ``output_length``, ``hash_ids``: one id per 512 prompt tokens, equal ids =
  identical content). Multi-turn sessions over a few shared system prompts: each turn's prompt
  is the session's previous prompt (its full 512-token blocks keep their ids) plus new text, so
  prompts share prefixes the way chat and agent traffic does and prefix caching has something
  to find.
* ``azure_conv_sample.csv`` — the Azure LLM inference trace's CSV format (``TIMESTAMP`` with 7
  fractional digits, ``ContextTokens``, ``GeneratedTokens``): Poisson arrivals at 5 req/s and
  lognormal lengths whose medians and 90th percentiles are those measured on the Azure 2023
  conversation trace (prompt 1,020 / 2,734 tokens, output 129 / 424).
* ``sharegpt_lengths_sample.csv`` — (prompt, output) length pairs with the columns of the
  ShareGPT statistics file vLLM-style benchmarks use (``num_prefill_tokens``,
  ``num_decode_tokens``): correlated lognormal pairs.
* ``sharegpt_sample.json`` — ShareGPT's conversation JSON (``conversations`` of ``human`` /
  ``gpt`` turns), the format ``vllm bench serve --dataset-name sharegpt`` reads; the text is
  made of generated words.

* ``burstgpt_sample.csv`` — BurstGPT's CSV format (``Timestamp`` in seconds from the trace's
  start, ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``):
  bursty arrivals (a rate that switches between quiet and busy minutes), two models, and some
  rows with 0 response tokens, BurstGPT's mark of a failed request (simserve skips them).
* ``classes_sample.csv`` — the plain ``csv`` format (``arrival_s``, ``prompt_tokens``,
  ``output_tokens``) with the optional ``priority`` and ``class`` columns: short interactive
  chat (priority 0) mixed with long batch summarisation jobs (priority 1).

They are samples for trying trace replay, prefix caching and the dataset loaders from a clone
(and for the tests), not measurements of any real service.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
SOURCE_BLOCK = 512                       # tokens per Mooncake hash id


def lognormal(rng: np.random.Generator, median: float, p90: float, size: int) -> np.ndarray:
    """Lognormal draws with the given median and 90th percentile (z_0.9 = 1.2816)."""
    sigma = math.log(p90 / median) / 1.2815515655446004
    return rng.lognormal(math.log(median), sigma, size)


def mooncake(rng: np.random.Generator, num_sessions: int = 120) -> list[dict]:
    systems = [list(range(k * 100, k * 100 + n)) for k, n in enumerate((2, 4, 6, 8, 3, 12))]
    popularity = np.array([0.3, 0.25, 0.15, 0.12, 0.1, 0.08])
    next_id = 10_000
    rows = []
    start = np.cumsum(rng.exponential(2.5, num_sessions))          # a session every 2.5 s
    for s in range(num_sessions):
        blocks = list(systems[rng.choice(len(systems), p=popularity)])
        t = start[s]
        for _ in range(int(rng.integers(1, 7))):                   # 1-6 turns
            new = int(rng.integers(1, 4))                          # new text: 1-3 blocks
            full = blocks + list(range(next_id, next_id + new))
            next_id += new
            tail = int(rng.integers(1, SOURCE_BLOCK))              # the last block is partial
            length = (len(full) - 1) * SOURCE_BLOCK + tail
            output = int(np.clip(round(lognormal(rng, 90, 400, 1)[0]), 1, 2000))
            rows.append({"timestamp": int(round(t * 1000)), "input_length": length,
                         "output_length": output, "hash_ids": full})
            blocks = full[:-1]              # the partial block continues: new content, new id
            t += float(rng.uniform(5, 40))  # the user reads and types
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def azure(rng: np.random.Generator, n: int = 500) -> list[str]:
    t0 = dt.datetime(2024, 5, 10, 14, 0, 0)
    gaps = rng.exponential(1 / 5.0, n)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    prompt = np.clip(np.rint(lognormal(rng, 1020, 2734, n)), 1, 16000).astype(int)
    output = np.clip(np.rint(lognormal(rng, 129, 424, n)), 1, 1000).astype(int)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in zip(times, prompt, output):
        whole = t0 + dt.timedelta(seconds=int(t))
        frac = f"{t - int(t):.7f}"[1:]                              # ".1234567"
        lines.append(f"{whole:%Y-%m-%d %H:%M:%S}{frac},{p},{o}")
    return lines


def sharegpt_lengths(rng: np.random.Generator, n: int = 3000) -> list[str]:
    z = rng.standard_normal((n, 2)) @ np.linalg.cholesky([[1.0, 0.35], [0.35, 1.0]]).T
    prompt = np.clip(np.rint(np.exp(math.log(250) + 1.1 * z[:, 0])), 4, 7000).astype(int)
    output = np.clip(np.rint(np.exp(math.log(220) + 0.9 * z[:, 1])), 4, 1024).astype(int)
    return ["num_prefill_tokens,num_decode_tokens"] + [f"{p},{o}" for p, o in zip(prompt, output)]


WORDS = ("the a of to and in is it that for on with as this be are from at by an or was not "
         "model token cache batch request server prompt answer question memory time step "
         "value list code file data system user reply explain write show why how what").split()


def sharegpt(rng: np.random.Generator, n: int = 100) -> list[dict]:
    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS, words))

    out = []
    for i in range(n):
        turns = []
        for k in range(int(rng.integers(1, 4)) * 2):
            speaker = "human" if k % 2 == 0 else "gpt"
            words = int(np.clip(lognormal(rng, 30 if speaker == "human" else 100,
                                          120 if speaker == "human" else 300, 1)[0], 1, 2000))
            turns.append({"from": speaker, "value": text(words)})
        out.append({"id": f"sample{i}", "conversations": turns})
    return out


def burstgpt(rng: np.random.Generator, seconds: float = 600.0) -> list[str]:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    t = 0.0
    while True:
        busy = int(t // 60) % 3 == 1                        # every third minute is busy
        t += float(rng.exponential(1 / (6.0 if busy else 1.5)))
        if t >= seconds:
            return lines
        model = "GPT-4" if rng.random() < 0.25 else "ChatGPT"
        prompt = int(np.clip(round(lognormal(rng, 600, 2000, 1)[0]), 1, 8000))
        failed = rng.random() < 0.03
        output = 0 if failed else int(np.clip(round(lognormal(rng, 250, 700, 1)[0]), 1, 2000))
        log = "Conversation log" if rng.random() < 0.6 else "API log"
        lines.append(f"{t:.3f},{model},{prompt},{output},{prompt + output},{log}")


def classes(rng: np.random.Generator, n: int = 400) -> list[str]:
    times = np.cumsum(rng.exponential(1 / 4.0, n))
    lines = ["arrival_s,prompt_tokens,output_tokens,priority,class"]
    for t in times:
        if rng.random() < 0.7:
            p, o = lognormal(rng, 300, 900, 1)[0], lognormal(rng, 150, 400, 1)[0]
            prio, name = 0, "interactive"
        else:
            p, o = lognormal(rng, 3000, 6000, 1)[0], lognormal(rng, 400, 900, 1)[0]
            prio, name = 1, "batch"
        p, o = int(np.clip(round(p), 1, 12000)), int(np.clip(round(o), 1, 2000))
        lines.append(f"{t:.4f},{p},{o},{prio},{name}")
    return lines


def main() -> None:
    rng = np.random.default_rng(np.random.SeedSequence(20261123))
    # (one stream per file; spawned children keep their order, so a new file's stream leaves
    # the others' bytes unchanged)
    mc, az, sg, sj, bg, cl = (np.random.default_rng(s)
                              for s in rng.bit_generator.seed_seq.spawn(6))
    (HERE / "mooncake_prefix_sample.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in mooncake(mc)))
    (HERE / "azure_conv_sample.csv").write_text("\n".join(azure(az)) + "\n")
    (HERE / "sharegpt_lengths_sample.csv").write_text("\n".join(sharegpt_lengths(sg)) + "\n")
    (HERE / "sharegpt_sample.json").write_text(
        "[\n" + ",\n".join(json.dumps(c) for c in sharegpt(sj)) + "\n]\n")
    (HERE / "burstgpt_sample.csv").write_text("\n".join(burstgpt(bg)) + "\n")
    (HERE / "classes_sample.csv").write_text("\n".join(classes(cl)) + "\n")


if __name__ == "__main__":
    main()
