"""The position-scheme study (docs/positions.md): train every scheme as the sweep does, then test each on inputs
2-4 times longer than any seen in training (rpr_mt/experiments/study.py).

    # train every scheme (seed-major, resumable: re-run the same command), each run's long sets decoded after it
    python3 scripts/study_positions.py configs/multi30k_en_de_positions.yaml --root results/study_positions --seeds 1 2
    # the table, BLEU against source length (PNG) and the paired bootstrap against absolute sinusoidal positions
    # (--baseline "Shaw k=64": against another scheme)
    python3 scripts/study_positions.py configs/multi30k_en_de_positions.yaml --root results/study_positions --report \\
        --plot docs/img/positions_bleu_by_length.png --bootstrap --lengths --speed-json results/study_speed.json
    # the long sets translated sentence by sentence, as `rpr-mt translate` does by default (finished runs whose
    # checkpoints are still there; each run's long_results_split.json and long_split/*.hyp, beside the whole-line ones)
    python3 scripts/study_positions.py configs/multi30k_en_de_positions.yaml --root results/study_positions --seeds 1 2 \\
        --split-sentences
    # the tok/s column, measured on a quiet machine (the runs' own rates measure whatever shared the machine):
    python3 benchmarks/bench_train.py --study configs/multi30k_en_de_positions.yaml --json results/study_speed.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from rpr_mt.host import sleep_waiting_openmp_threads

sleep_waiting_openmp_threads()  # before torch loads: the runs train in this process (rpr_mt/host.py)

from rpr_mt.errors import UserError, check_creatable_directory  # noqa: E402
from rpr_mt.experiments.study import BASELINE  # noqa: E402
from rpr_mt.train.signals import exit_status, interrupt_on_stop_signals, interruption, signal_exit_status  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="base config of the study (configs/multi30k_en_de_positions.yaml)")
    parser.add_argument("--root", required=True, help="study directory: one sub-directory per run")
    # repeatable, as sweep.py's (the last --seeds alone counted before); a seed given twice is trained once
    parser.add_argument("--seeds", nargs="+", type=int, action="extend", help="seeds (repeatable; default: 1 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="section.key=value applied to every run")
    parser.add_argument("--only", action="append", default=[], help="run only this run directory (repeatable)")
    parser.add_argument("--report", action="store_true", help="print the table of finished runs; train nothing")
    parser.add_argument("--plot", help="with --report: write BLEU against source length per scheme to this PNG")
    parser.add_argument("--bootstrap", action="store_true", help="with --report: paired bootstrap vs the baseline")
    parser.add_argument("--lengths", action="store_true",
                        help="with --report: the x4 hypotheses' lengths in pieces against the training cap")
    parser.add_argument("--baseline", default=BASELINE,
                        help="with --bootstrap: the scheme each row is compared with (a row label of the table)")
    parser.add_argument("--data-dir", help="with --bootstrap or --lengths: the prepared data of the runs (default: data.output_dir "
                        "of their config.yaml, relative to where the study ran)")
    parser.add_argument("--speed-json", help="with --report: the tok/s column from `benchmarks/bench_train.py --study "
                        "CONFIG --json FILE` (a quiet measurement) instead of the runs' own rates")
    parser.add_argument("--split-sentences", action="store_true",
                        help="decode the long sets sentence by sentence (long_results_split.json) instead of whole")
    args = parser.parse_args(argv)
    args.seeds = list(dict.fromkeys(args.seeds or [1, 2]))
    report_only = [flag for flag, given in (("--plot", args.plot), ("--bootstrap", args.bootstrap),
                                             ("--lengths", args.lengths), ("--speed-json", args.speed_json),
                                             ("--baseline", args.baseline != BASELINE), ("--data-dir", args.data_dir))
                   if given]
    if report_only and not args.report:  # without --report they were dropped and the whole study started training
        parser.error(f"{', '.join(report_only)} go(es) with --report (which trains nothing); add --report")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf", ".svg"):  # else found after the tables
        parser.error(f"--plot {args.plot}: give a .png, .pdf or .svg file")
    from rpr_mt.progress import outlive_readers

    # a log reader that goes away must not end the runs, nor the error lines (scripts/sweep.py); a report is read whole
    with contextlib.nullcontext() if args.report else outlive_readers():
        try:
            from rpr_mt.experiments.study import (evaluate_long, plot_study, render_bootstrap, render_bucket_table,
                                                  render_output_lengths, render_study_table)
            from rpr_mt.experiments.sweep import only_run_name, run_sweep
            from rpr_mt.experiments.tables import load_sweep

            if args.report:
                if args.plot:  # written after the tables: a place it cannot go is said before them
                    check_creatable_directory(Path(args.plot).parent, f"--plot {args.plot}: its directory")
                sweep = load_sweep(args.root, made_by="scripts/study_positions.py")
                if not any(table == "schemes" for table, _ in sweep.cells):
                    raise UserError(f"{args.root} holds no position-study runs (its plan has no 'schemes' cells); "
                                    "the paper's tables of scripts/sweep.py are read by scripts/aggregate.py")
                speeds = None
                if args.speed_json:
                    try:
                        speeds = json.loads(Path(args.speed_json).read_text(encoding="utf-8"))["cells"]
                    except (OSError, ValueError, KeyError) as exc:
                        raise UserError(f"--speed-json {args.speed_json}: cannot read the benchmark's cells "
                                        f"({exc})") from None
                print(render_study_table(sweep, speeds))
                print(render_bucket_table(sweep))
                if args.plot:
                    print(f"wrote {plot_study(sweep, args.plot)}", file=sys.stderr)
                if args.bootstrap:
                    print(render_bootstrap(sweep, data_dir=args.data_dir, baseline=args.baseline))
                if args.lengths:
                    print(render_output_lengths(sweep, data_dir=args.data_dir))
                return 0

            failed: list[str] = []

            def decode_long_sets(cfg) -> None:
                # Each run's long sets right after it trains: a finished run is then complete, ready to commit
                # (results/).
                try:
                    record = evaluate_long(cfg, log=lambda text: print(text, file=sys.stderr, flush=True),
                                           split=args.split_sentences)
                except UserError as err:  # e.g. a run from results/ whose hypotheses are incomplete and weights absent
                    print(f"error: {cfg.train.run_dir}: long sets not evaluated: {err}", file=sys.stderr, flush=True)
                    failed.append(str(cfg.train.run_dir))
                    return
                x4 = record["sets"]["test.x4"]
                print(f"{cfg.train.run_dir}: test x4 BLEU {x4['bleu']:.2f}, length ratio {x4['length_ratio']:.3f}"
                      + (" (sentence by sentence)" if args.split_sentences else ""),
                      file=sys.stderr, flush=True)

            with interrupt_on_stop_signals():  # SIGTERM/SIGHUP while a run decodes: as Ctrl-C, one line
                status = run_sweep(args.config, args.root, ["schemes"], args.seeds, args.overrides,
                                   [only_run_name(name, args.root) for name in args.only], after_run=decode_long_sets)
            if status != "done":  # a run's training stopped by this signal
                return signal_exit_status(status)
            if failed:
                print(f"error: {len(failed)} run(s) without long-set results (above); the others are done",
                      file=sys.stderr)
                return 1
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # outside training (decoding the long sets): one line, not a traceback
            print(f"{interruption(exc)}; the same command resumes the study (a run's decoding starts again)",
                  file=sys.stderr)
            return exit_status(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
