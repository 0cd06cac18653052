"""Static against iteration-level batching: the Anyscale continuous-batching post's throughput
test (OPT-13B, A100-40GB, 1000 requests of 512 tokens at once, outputs from a truncated
exponential of mean 128 at caps 32 / 128 / 512 / 1536). Scenario: anyscale_static.yaml.

Post: continuous batching gives "8x throughput over naive batching" (the 8x at the widest
spread of output lengths, cap 1536 [digest: inferred from "as the variance increases"]), and
"up to 23x throughput improvement using continuous batching and ... memory optimizations
(using vLLM)". Its per-cap table is an image (not read here).
"""

from __future__ import annotations

import yaml
from common import HERE, run, table, variants, verdict

from simserve.config import parse_scenario

MISSING = ("the post's naive batch size is not stated: simserve's static batch here is as large "
           "as the padded KV cache allows (8-16 rows at cap 1536, max_num_seqs 32); measured "
           "below, the ratio reaches the post's 8x only with a naive batch of about 2 rows. "
           "Prompt padding and results held to the batch's end change nothing in this test "
           "(every prompt is 512 tokens; a burst's throughput ends with its last batch). Not "
           "modelled: HF generate's eager per-token cost (the post's naive baseline)")
STATIC_BATCHES = (1, 2, 4, 8, 32)


def main() -> None:
    rows, notes = [], []
    for cap in (32, 128, 512, 1536):
        v = variants("anyscale_static", [f"workload.output.max={cap}"])
        tput = {label: run(s)["output_throughput"] for label, s in v.items()}
        print(f"cap {cap:5d}: output tokens/s " +
              ", ".join(f"{k} {t:.0f}" for k, t in tput.items()))
        cont, vllm = tput["continuous"] / tput["static"], tput["vllm"] / tput["static"]
        if cap == 1536:
            rows.append(("continuous / static throughput, cap 1536", "8x", f"{cont:.2f}x",
                         f"{cont / 8:.2f}"))
            rows.append(("vLLM / static throughput, cap 1536", "up to 23x", f"{vllm:.2f}x",
                         f"{vllm / 23:.2f}"))
            by_batch = {b: run(static(cap, b))["output_throughput"] for b in STATIC_BATCHES}
            one = tput["vllm"] / by_batch[1]
            notes.append("continuous / static: " + verdict(cont, 6, 10, MISSING))
            notes.append("vLLM / static: " + verdict(
                vllm, 6, 23, f"{MISSING}. Even one row at a time the static baseline gives "
                f"vLLM {one:.1f}x here: the post's 23x needs its naive step {23 / one:.1f}x "
                f"slower a token than the roofline prices a one-row decode step"))
            sweep = [f"{b}: {tput['continuous'] / t:.2f}x" for b, t in by_batch.items()]
            notes.append("continuous / static at cap 1536 by the static batch limit "
                         "(max_num_seqs): " + ", ".join(sweep))
    print()
    print(table(rows))
    print()
    print("\n".join(notes))
    print("(the 8x is read as [6, 10] here: the post gives one rounded number)")


def static(cap: int, max_num_seqs: int):
    """The scenario's static variant at output cap ``cap``, its batch limited to
    ``max_num_seqs`` rows."""
    raw = yaml.safe_load((HERE / "anyscale_static.yaml").read_text())
    raw.pop("compare")
    raw["scheduler"] = {"policy": "static"}
    raw["engine"]["max_num_seqs"] = max_num_seqs
    raw["workload"]["output"]["max"] = cap
    return parse_scenario(raw, base_dir=HERE, name="anyscale_static-static")


if __name__ == "__main__":
    main()
