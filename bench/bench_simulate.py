"""Placement quality on the openb trace (issue 21): ``hami simulate`` for each policy on
the trace's workload variants, unallocated GPU % at k = 90, 100, 110, 130, beside FGD's
and BestFit's published figures for each variant. Default policies: defrag/binpack (the
recommended one) and binpack/spread (the scheduler's default); ``--policy`` as hami
simulate.

    HAMI_OPENB_DIR=/path/to/cluster-trace-gpu-v2023/csv .venv/bin/python bench/bench_simulate.py
    .venv/bin/python bench/bench_simulate.py --trace-dir DIR --seeds 0-9 --variants default

The trace is alibaba/clusterdata ``cluster-trace-gpu-v2023/csv`` (not in this repository:
clone it, or ``git show`` the files out of a mirror). Without it the benchmark says so
and does nothing. A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hami.simulate import cli

# the paper's workload variants: default, GPU-sharing-heavy, multi-GPU-heavy, type-constrained
VARIANTS = ("default", "gpushare100", "multigpu50", "gpuspec33")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", default=os.environ.get(cli.TRACE_ENV))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--split-count", default="100")
    parser.add_argument("--policy", action="append", help="as hami simulate (default: all)")
    args = parser.parse_args()
    if not args.trace_dir or not (Path(args.trace_dir) / cli.NODES_FILE).exists():
        print(
            f"skipped: no openb trace (set ${cli.TRACE_ENV} or --trace-dir to the folder "
            f"holding {cli.NODES_FILE} and openb_pod_list_*.csv, from alibaba/clusterdata "
            "cluster-trace-gpu-v2023/csv)"
        )
        return 0
    for variant in args.variants.split(","):
        print(f"\n=== {variant} ===", flush=True)
        argv = [
            "--trace-dir",
            args.trace_dir,
            "--pods",
            variant,
            "--seeds",
            args.seeds,
            "--split-count",
            args.split_count,
        ]
        for policy in args.policy or ():
            argv += ["--policy", policy]
        if cli.main(argv) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
