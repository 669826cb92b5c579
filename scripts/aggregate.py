"""Tables shaped like Shaw et al. (2018), Tables 1-3, and plots, from a sweep root (see scripts/sweep.py).

    python3 scripts/aggregate.py runs/sweep_multi30k_en_de --out docs/results_multi30k_en_de.md --plots docs/img

``--by-length dev`` adds a table of BLEU by source-sentence length (quartile buckets, or ``--length-edges 10,13,16``),
scored from each finished run's ``dev.hyp``; see rpr_mt/experiments/lengths.py. ``--paired-bootstrap dev`` adds each
cell's BLEU difference to the base run of the same seed with sacreBLEU's paired bootstrap p-value
(rpr_mt/experiments/significance.py); ``--baseline k=16`` compares with that cell instead (a sweep whose base run is
not planned, e.g. ``--tables clip`` with a base k that is none of the paper's). Each row also says what the paper's
numbers (En-De; Table 1 of a sweep into French: En-Fr) claim of that cell against the comparison (below it, or level with it) and whether the seeds bear it out
(holds / does not hold / within noise; the rule is printed under the table). Without a finished run to compare
with, the report says so in place of that section; its tables and plots are written as always.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rpr_mt.errors import UserError, check_creatable_directory
from rpr_mt.experiments.lengths import length_table, plot_length_table, render_length_table
from rpr_mt.experiments.significance import check_baseline, render_significance_table
from rpr_mt.experiments.tables import load_sweep, plot, render_markdown
from rpr_mt.files import check_output, write_lines


def _edges(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 10,13,16, got '{text}'") from None


def check_outputs(root: str, out: str | None, plots: str | None) -> None:
    """Before any work: --out is not one of the files read from the sweep root (its plan or a run's result), and is
    a file that can be written (``rpr_mt.files.check_output``); --plots is a directory or can be made one."""
    if out is not None:
        read = [Path(root) / "plan.json", *Path(root).glob("*/result.json"), *Path(root).glob("*/*/result.json")]
        if any(Path(out).resolve() == path.resolve() for path in read):
            raise UserError(f"--out {out} would replace a file of the sweep it reads; choose another name")
        check_output(out, "--out")
    if plots is not None:  # made after the report is written: check it can be now
        check_creatable_directory(plots, "--plots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="sweep root written by scripts/sweep.py")
    parser.add_argument("--out", help="write the markdown here (default: print it)")
    parser.add_argument("--title", help="heading of the markdown")
    parser.add_argument("--plots", help="directory for PNG plots (needs matplotlib: pip install -e '.[plots]' in the checkout)")
    parser.add_argument("--prefix", default="", help="file-name prefix for the plots")
    parser.add_argument("--by-length", choices=["dev", "test"], help="add BLEU by source length on this split")
    parser.add_argument("--length-edges", type=_edges, help="first length of each bucket after the first, e.g. 10,13,16 "
                        "(default: the split's length quartiles)")
    parser.add_argument("--paired-bootstrap", choices=["dev", "test"],
                        help="add each cell's BLEU difference to the same seed's base run, with its p-value")
    parser.add_argument("--baseline", metavar="CELL",
                        help="with --paired-bootstrap: compare with this cell's runs (a row label, e.g. k=16 or "
                        "absolute) instead of the base run")
    parser.add_argument("--metric", choices=["sacrebleu", "lit"], default="sacrebleu",
                        help="the BLEU that --paired-bootstrap resamples: sacreBLEU, or the Multi30k literature's "
                        "(lowercased, normalized, Moses-tokenized text)")
    parser.add_argument("--data-dir", help="prepared data of the runs (default: data.output_dir of their config.yaml)")
    args = parser.parse_args(argv)
    if args.length_edges is not None and not args.by_length:
        parser.error("--length-edges goes with --by-length")
    if args.metric != "sacrebleu" and not args.paired_bootstrap:
        parser.error("--metric chooses the BLEU of --paired-bootstrap; give that too")
    if args.baseline is not None and not args.paired_bootstrap:
        parser.error("--baseline chooses the comparison of --paired-bootstrap; give that too")
    if args.prefix and not args.plots:  # the others given alone are refused too: nothing would read them
        parser.error("--prefix names the files of --plots; give that too")
    if args.data_dir is not None and not (args.paired_bootstrap or args.by_length):
        parser.error("--data-dir is where --paired-bootstrap and --by-length read the references; give one of them")
    try:
        check_outputs(args.root, args.out, args.plots)
        sweep = load_sweep(args.root)
        check_baseline(sweep, args.baseline)  # before any plot is written
        text = render_markdown(sweep, args.title)
        lengths = None
        if args.by_length and not sweep.results:  # nothing to score yet: the tables show the plan all the same
            text += f"\n## BLEU by source length ({args.by_length})\n\nNot computed: no run has finished yet.\n"
        elif args.by_length:
            lengths = length_table(sweep, args.by_length, args.length_edges, args.data_dir)
            text += (f"\n## BLEU by source length ({args.by_length})\n\nCorpus {lengths.metric} of the "
                     f"{args.by_length} sentences "
                     "whose source has that many words (sentence count in the header), mean ± std over seeds.\n\n"
                     + render_length_table(lengths) + "\n")
        if args.paired_bootstrap:
            table = render_significance_table(sweep, args.paired_bootstrap, args.data_dir, metric=args.metric,
                                              baseline=args.baseline)
            against = "the base run" if args.baseline is None else f"the {args.baseline} run"
            text += (f"\n## Paired bootstrap against {against} ({args.paired_bootstrap})\n\nEach cell's "
                     f"{args.paired_bootstrap} BLEU minus that of {against} with the same seed (mean ± std over "
                     "seeds), and the two-sided p-value of sacreBLEU's paired bootstrap resampling for each seed (0.001 "
                     "is the smallest that 1,000 resamples can give).\n\n"
                     + table + "\n")
        if args.out:
            write_lines(args.out, [text])
        else:
            print(text)
        if args.plots:  # after every section is computed: a report that fails leaves no plots half-written
            written = plot(sweep, args.plots, args.prefix)
            if lengths is not None:
                written.append(plot_length_table(lengths, args.plots, args.prefix))
            for path in written:
                print(f"wrote {path}", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
