"""``python -m profiler``: measure a model's kernels on this machine and write a profile file.

Every user error (unknown model, absent device, backend that cannot run) is one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path

from simserve.errors import SimserveError


class UsageError(Exception):
    """Reported as ``profiler: error: <message>`` with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, as simserve's own commands print them (argparse
    prints the whole usage block above its error line)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} "
                     f"(see {self.prog} --help)\n")


def build_parser(prog: str = "python -m profiler") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Measure a model's decoder kernels (GEMMs, paged attention, LM head and "
                    "sampling) on this machine and write a simserve profile (JSON).")
    p.add_argument("--model", required=True,
                   help="shipped model card name (e.g. tiny-llama-45m; simserve list models) or "
                        "a model-card YAML file")
    p.add_argument("--device", required=True, choices=("cuda", "cpu"),
                   help="the device to measure on: cpu, or cuda (torch's current CUDA device)")
    p.add_argument("--out", required=True, type=Path, help="profile file to write")
    p.add_argument("--grid", default="quick", choices=("quick", "full"),
                   help="quick: coarse grids (the tiny model on one CPU thread: about 12 min, "
                        "more on a busy machine); full: fine grids (about 15 min; an 8B model "
                        "on an H100: about 5 min)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: 1 on CPU, as vLLM's CPU worker; "
                        "torch's default on CUDA)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"),
                   help="weights, activations and KV cache (default bf16)")
    p.add_argument("--block-size", type=int, default=16,
                   help="KV cache block size in tokens (default 16)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="the step token budget: the largest token count measured and the "
                        "activation-peak step (default 2048)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest sequence measured: the context axes stop here (default: the "
                        "model card's max_position_embeddings)")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="rows sampled in the activation-peak step (default 256)")
    p.add_argument("--attention", default="auto",
                   choices=("auto", "reference", "flex", "triton", "flashinfer", "vllm_fa"),
                   help="paged attention backend (auto: flashinfer, else flex, on CUDA; "
                        "reference on CPU; triton: flex prefill and our split-KV paged "
                        "decode kernel; vllm_fa: vLLM's own FlashAttention, CUDA only)")
    p.add_argument("--no-compile", action="store_true",
                   help="no torch.compile: FlexAttention eager, and on CUDA the layers' "
                        "norms, RoPE and MLP as eager torch ops (compiled by default there, "
                        "as vLLM does)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="CUDA: time eager launches instead of CUDA graph replays (vLLM "
                        "replays captured graphs; eager timing measures the host)")
    p.add_argument("--timer", default="auto", choices=("auto", "wall", "cpu"),
                   help="CPU clock (auto: the measuring thread's CPU time with one thread, which "
                        "leaves out other processes' time on a shared machine; wall otherwise)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory for the profile's num_gpu_blocks, as "
                        "vLLM's (default 0.9)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the weights, inputs, block shuffles and held-out batches "
                        "(default 0)")
    p.add_argument("--note", default="",
                   help="free text kept in provenance.note (after the load average the profiler "
                        "records itself), e.g. how the machine was set up")
    return p


def load_card(spec: str):
    """A model card from a shipped card name or a YAML file (inline card or ``card: NAME``)."""
    from simserve.cards import load_model
    path = Path(spec)
    if spec.endswith((".yaml", ".yml")) or path.is_file():
        from simserve.errors import DataError
        from simserve.safeyaml import load
        try:
            raw = load(path)           # encoding, nesting, aliases, duplicate keys: one line
        except DataError as e:
            raise UsageError(f"--model {e}") from None
        return load_model(raw, path=str(path))
    return load_model(spec, path="--model")


def check_device(device: str) -> None:
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        why = ("this torch build has no CUDA support" if torch.version.cuda is None
               else "no CUDA device is visible")
        raise UsageError(f"--device cuda: CUDA is not available ({why}, torch "
                         f"{torch.__version__}); use --device cpu")


def run(args: argparse.Namespace, argv: list[str], prog: str = "python -m profiler") -> Path:
    from profiler.attention import BackendError
    from profiler.measure import Options, run_profile
    from simserve.latency.schema import dump

    for name in ("threads", "block_size", "max_num_batched_tokens", "max_num_seqs",
                 "max_model_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UsageError("--gpu-memory-utilization must be in (0, 1]")
    check_device(args.device)
    if args.timer == "cpu" and (args.device != "cpu" or (args.threads or 1) != 1):
        raise UsageError("--timer cpu needs --device cpu and one thread")
    card = load_card(args.model)
    moe = None
    if card.is_moe:
        if card.is_mla or card.first_dense_layers:
            # the profiler's layer is GQA with the same MLP in every layer
            raise UsageError(f"--model {card.name}: MLA attention and dense layers first are "
                             "not profiled as a whole model (an MLA decode can be timed with "
                             "profiler.moe.measure_mla_decode); profile a GQA MoE card")
        from profiler.moe import MoEShapes
        moe = MoEShapes.from_card(card)
    import torch
    threads = args.threads or (1 if args.device == "cpu" else torch.get_num_threads())
    opts = Options(device=args.device, dtype=args.dtype, threads=threads, grid=args.grid,
                   block_size=args.block_size,
                   max_num_batched_tokens=args.max_num_batched_tokens,
                   max_num_seqs=args.max_num_seqs, attention=args.attention,
                   max_model_len=args.max_model_len or card.max_position_embeddings,
                   timer=args.timer, note=args.note,
                   compile=not args.no_compile, cuda_graphs=not args.no_cuda_graphs,
                   gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed,
                   command=shlex.join([*prog.split(), *argv]))
    try:
        profile = run_profile(card, opts, moe=moe)
    except BackendError as e:
        raise UsageError(str(e)) from None
    dump(profile, args.out)
    return args.out


def main(argv: list[str] | None = None, prog: str = "python -m profiler") -> int:
    """``prog`` is how the command was invoked (``simserve profile`` forwards here): it names
    the command in usage messages and in the profile's ``provenance.command``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)      # a usage error: one line, exit 2 (_Parser)
    if importlib.util.find_spec("torch") is None:       # (--help above needs none)
        from simserve.profiling import INSTALL_HINT
        print(f"profiler: error: measuring needs torch, which is not installed; {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    try:
        out = run(args, argv, prog)
    except (UsageError, SimserveError) as e:
        print(f"profiler: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("profiler: interrupted; no profile written", file=sys.stderr)
        return 130
    print(f"profiler: wrote {out}", file=sys.stderr)
    return 0
