"""Which positions or distances each run's learned position tables never trained (rpr_mt/experiments/untrained.py).

Rebuilds each run's initial model from its config and seed and compares it, row by row, with the run's last
checkpoint: a row still bit-identical was reached by no training input. A run needs its checkpoints (results/
keeps none; a run trained again gives the same answer, which depends only on the training lengths and the scheme).

    python3 scripts/untrained_positions.py results/study_positions/clip=64/seed1 \\
        "results/study_positions/positions=absolute+absolute_kind=learned/seed1"
"""

from __future__ import annotations

import argparse
import sys

from rpr_mt.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories (or checkpoint files)")
    parser.add_argument("--which", default="last", choices=["last", "best", "average"],
                        help="checkpoint to compare (default: last)")
    args = parser.parse_args(argv)
    try:
        from rpr_mt.experiments.untrained import render_untrained, untrained_positions

        print(render_untrained({run: untrained_positions(run, args.which) for run in args.runs}), end="")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
