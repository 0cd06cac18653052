"""Run the seed-paper reproductions and save what each prints under results/.

    .venv/bin/python benchmarks/papers/run_all.py            # all six
    .venv/bin/python benchmarks/papers/run_all.py sarathi    # some

Each script prints the paper's number, simserve's and their ratio, and whether the ratio lands
in the paper's range or which mechanism is missing (docs/papers.md tabulates them). The
outputs are arithmetic on a seeded simulation: the same on any machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("vllm_orca", "sarathi", "distserve", "anyscale_static", "fastserve",
         "sarathi_pp")


def main(argv: list[str]) -> int:
    names = argv or list(NAMES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        print(f"run_all: unknown reproduction {', '.join(unknown)}; one of {', '.join(NAMES)}",
              file=sys.stderr)
        return 2
    (HERE / "results").mkdir(exist_ok=True)
    failed = 0
    for name in names:
        print(f"=== {name}", flush=True)
        out = subprocess.run([sys.executable, str(HERE / f"{name}.py")], capture_output=True,
                             text=True, cwd=HERE)
        print(out.stdout, end="")
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            failed += 1
            continue
        (HERE / "results" / f"{name}.txt").write_text(out.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
