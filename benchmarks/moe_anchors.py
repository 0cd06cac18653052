"""Issue #18's published anchors, paper vs simserve, printed side by side.

1. DeepEP low-latency kernels (deepseek-ai/DeepEP docs, V1 table: H800 + ConnectX-7 400 Gb/s,
   128 tokens per batch, hidden 7168, top-8, FP8 dispatch, BF16 combine). simserve prices an
   expert all-to-all as logical bytes over the link: dispatch ``tokens · k · (h + h/128 · 4)``,
   combine ``tokens · k · h · 2``. The paper's "RDMA bandwidth" is that byte count over its
   latency; here: (a) the bandwidth our byte count implies at the paper's latency against the
   paper's, (b) the latency simserve predicts on the H100 preset's scale-out link (50 GB/s per
   direction) plus its 10 µs per collective, against the paper's.
2. Speculative decoding (run with ``--spec``): tokens per verify step under vLLM's synthetic
   acceptance with i.i.d. rates α, α², …, against the closed form (1 − α^(k+1)) / (1 − α); and
   DeepSeek-V3's MTP (k = 1, acceptance 85–90 %: "1.8 times TPS", the V3 report) as the
   decode-throughput ratio simserve gives on its roofline.

    python benchmarks/moe_anchors.py [--spec]
"""

from __future__ import annotations

import argparse

from simserve.cards import HardwareSpec, load_hardware, load_model
from simserve.latency.roofline import RooflineModel

# DeepEP docs/legacy.md, low-latency kernels: EP → (dispatch µs, dispatch GB/s, combine µs,
# combine GB/s)
DEEPEP_LL = {8: (77, 98, 114, 127), 16: (118, 63, 195, 74), 32: (155, 48, 273, 53),
             64: (173, 43, 314, 46), 128: (192, 39, 369, 39), 256: (194, 39, 360, 40)}
TOKENS, HIDDEN, TOP_K = 128, 7168, 8


def deepep() -> None:
    dispatch = TOKENS * TOP_K * (HIDDEN + HIDDEN / 128 * 4)
    combine = TOKENS * TOP_K * HIDDEN * 2
    hw = load_hardware("H100-SXM")
    print("DeepEP low-latency (128 tokens, hidden 7168, top-8; paper: H800 + CX7 RDMA)")
    print(f"simserve's logical bytes: dispatch {dispatch:,.0f} B, combine {combine:,.0f} B")
    print(f"{'EP':>4} | {'paper disp µs':>13} {'paper GB/s':>10} {'implied GB/s':>12} "
          f"{'sim µs':>7} | {'paper comb µs':>13} {'paper GB/s':>10} {'implied GB/s':>12} "
          f"{'sim µs':>7}")
    for ep, (d_us, d_bw, c_us, c_bw) in DEEPEP_LL.items():
        sim_d = (dispatch / hw.scaleout_bandwidth + 10e-6) * 1e6
        sim_c = (combine / hw.scaleout_bandwidth + 10e-6) * 1e6
        print(f"{ep:>4} | {d_us:>13} {d_bw:>10} {dispatch / d_us / 1e3:>12.1f} {sim_d:>7.0f} | "
              f"{c_us:>13} {c_bw:>10} {combine / c_us / 1e3:>12.1f} {sim_c:>7.0f}")
    # the same through the roofline's all-to-all term (DP 8 × EP 8 of a DeepSeek-V3-shaped MoE:
    # per rank 128 tokens; deepep_low_latency): its per-layer all2all seconds
    card = load_model("DeepSeek-V3")
    roof = RooflineModel(card, HardwareSpec(**{**hw.to_dict(), "devices_per_node": 1}),
                         tensor_parallel_size=1, data_parallel_size=8,
                         enable_expert_parallel=True, all2all_backend="deepep_low_latency")
    t = roof.moe_terms(TOKENS)["all2all"] * 1e6
    print(f"roofline all2all term, DP 8 + EP 8 over CX7 (one GPU per node), 128 tokens per "
          f"rank: {t:.0f} µs per MoE layer (paper, EP 8: {77 + 114} µs dispatch + combine)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", action="store_true", help="the speculative-decoding anchors too")
    args = p.parse_args()
    deepep()
    if args.spec:
        from benchmarks.spec_anchors import spec_anchors
        spec_anchors()


if __name__ == "__main__":
    main()
