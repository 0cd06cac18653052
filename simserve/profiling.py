"""``simserve profile ...``: the kernel profiler (``python -m profiler ...``) as a simserve command.

Every argument after ``profile`` goes to ``profiler.cli.main`` unchanged (docs/profiler.md).
torch is imported only when the command runs, so ``import simserve`` never imports it; without
torch ``--help`` still works and the command says how to install torch, in one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

# README's install line: the CPU wheel first, or pip resolves torch to a CUDA build (GBs of
# nvidia-* wheels) on Linux
INSTALL_HINT = ("on a CPU-only machine install the CPU wheel first, pip install torch==2.13.0 "
                "--index-url https://download.pytorch.org/whl/cpu, then pip install -e "
                "'.[profile]' (with a GPU: pip install -e '.[profile]' alone, which takes "
                "torch's CUDA build)")
HELP = ("-h", "--help")


def register(sub) -> None:
    # no options of its own: every word, "-h" included, is the profiler's
    p = sub.add_parser("profile", add_help=False, prefix_chars="\0",
                       help="measure a model's kernels on this machine and write a profile "
                            "(python -m profiler; needs torch)",
                       description="Same arguments as python -m profiler (see --help).")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_cmd_profile)


def _cmd_profile(args) -> int:
    # help needs no torch: profiler.cli imports it only to measure
    if importlib.util.find_spec("torch") is None and not set(HELP) & set(args.args):
        print(f"error: simserve profile needs torch, which is not installed; {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    # the profiler is a separate package that imports simserve, never the reverse: load it
    # only when the command runs
    try:
        profiler_cli = importlib.import_module("profiler.cli")
    except ModuleNotFoundError as e:
        print(f"error: simserve profile needs the profiler package ({e}); {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    return profiler_cli.main(list(args.args), prog="simserve profile")
