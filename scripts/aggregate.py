"""Tables shaped like Shaw et al. (2018), Tables 1-3, and plots, from a sweep root (see scripts/sweep.py).

    python scripts/aggregate.py runs/sweep_multi30k_en_de --out docs/results_multi30k_en_de.md --plots docs/img
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rpr_mt.errors import UserError
from rpr_mt.experiments.tables import load_sweep, plot, render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="sweep root written by scripts/sweep.py")
    parser.add_argument("--out", help="write the markdown here (default: print it)")
    parser.add_argument("--title", help="heading of the markdown")
    parser.add_argument("--plots", help="directory for PNG plots (needs matplotlib: pip install 'rpr-mt[plots]')")
    parser.add_argument("--prefix", default="", help="file-name prefix for the plots")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.root)
        text = render_markdown(sweep, args.title)
        if args.out:
            Path(args.out).write_text(text + "\n", encoding="utf-8")
        else:
            print(text)
        if args.plots:
            for path in plot(sweep, args.plots, args.prefix):
                print(f"wrote {path}", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
