"""Run Shaw et al. (2018) Tables 1-3 as a sweep over one base config (see rpr_mt/experiments/sweep.py).

    # Tables 1-3 (positions, k, aK/aV cells; the default), two seeds, sequentially; re-run the same command to resume
    python3 scripts/sweep.py configs/multi30k_en_de_rel.yaml --root runs/sweep_multi30k_en_de \\
        --tables positions clip key_value --seeds 1 2
    # one command per run, for a cluster (each job runs one run directory)
    python3 scripts/sweep.py configs/multi30k_en_de_rel.yaml --root runs/sweep_multi30k_en_de --seeds 1 2 --list
    # then the tables and plots
    python3 scripts/aggregate.py runs/sweep_multi30k_en_de --plots docs/img
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys

from rpr_mt.host import sleep_waiting_openmp_threads

sleep_waiting_openmp_threads()  # before torch loads: the runs train in this process (rpr_mt/host.py)

from rpr_mt.errors import UserError  # noqa: E402
from rpr_mt.progress import outlive_readers  # noqa: E402
from rpr_mt.train.signals import exit_status, interrupt_on_stop_signals, interruption, signal_exit_status  # noqa: E402
from rpr_mt.experiments.sweep import (  # noqa: E402
    PAPER_TABLES, TABLE_NAMES, check_plan, check_root, only_run_name, plan_runs, read_plan, run_config, run_state,
    run_sweep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="base config; its own model is the run of each cell it equals (a relative "
                        "base: the relative row of every table; an absolute one: Table 1's absolute row)")
    parser.add_argument("--root", required=True, help="sweep directory: one sub-directory per run")
    # repeatable, like --set and --only (the last one alone counted before: a sweep ran less than it was asked)
    parser.add_argument("--tables", nargs="+", action="extend", choices=TABLE_NAMES,
                        help=f"tables to plan (repeatable; default: {' '.join(PAPER_TABLES)})")
    parser.add_argument("--seeds", nargs="+", type=int, action="extend", help="seeds (repeatable; default: 1 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="section.key=value applied to every run (before the table's own overrides)")
    parser.add_argument("--only", action="append", default=[], help="run only this run directory (repeatable)")
    parser.add_argument("--list", action="store_true", help="print one command per run and its state; run nothing")
    args = parser.parse_args(argv)
    # base/seed1/ as a shell completes a directory, and ROOT/base/seed1 or ./base/seed1 as it completes a path
    args.only = [only_run_name(name, args.root) for name in args.only]
    # given twice (--seeds 1 2 --seeds 2 3), a table or seed is planned once; --list prints each once
    args.tables = list(dict.fromkeys(args.tables or PAPER_TABLES))
    args.seeds = list(dict.fromkeys(args.seeds or [1, 2]))
    # A log reader that goes away (`| head`, a closed terminal's pager) must not end the runs between their
    # checkpoints with exit 0, as BrokenPipeError below did, nor turn an error's line into exit 0: rpr-mt train
    # outlives its readers the same way. (--list | head: the reader has what it wanted, below.)
    with contextlib.nullcontext() if args.list else outlive_readers():
        try:
            if args.list:
                check_root(args.root, create=False)  # the commands it prints would all fail on a file
                check_plan(read_plan(args.root), args.root, args.config, args.overrides)  # as running it would
                runs = plan_runs(args.config, args.tables, args.seeds, args.overrides)
                unknown = sorted(set(args.only) - {run.directory for run in runs})
                if unknown:
                    raise UserError(f"--only {', '.join(unknown)}: no such run in this sweep (--list without --only "
                                    "lists them)")
                script = os.path.relpath(__file__)  # the commands work from where this one was run
                for run in runs:
                    if args.only and run.directory not in args.only:
                        continue
                    state = run_state(run_config(args.config, args.overrides, run, args.root))
                    command = ["python3", script, args.config, "--root", args.root, "--tables", *args.tables,
                               "--seeds", *map(str, args.seeds), *(f"--set={o}" for o in args.overrides),
                               "--only", run.directory]
                    cells = ", ".join(f"{t} {label}" for t, label in run.cells)
                    print(f"# {run.directory}: {state} ({cells})")
                    print(shlex.join(command))
                return 0
            # SIGTERM/SIGHUP (`timeout`, a scheduler, a closed terminal) while a run decodes: as Ctrl-C, one line
            with interrupt_on_stop_signals():
                status = run_sweep(args.config, args.root, args.tables, args.seeds, args.overrides, args.only)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # outside training (decoding a trained run): one line, not a traceback
            print(f"{interruption(exc)}; the same command resumes the sweep (a run's decoding starts again)",
                  file=sys.stderr)
            return exit_status(exc)
    return 0 if status == "done" else signal_exit_status(status)  # else the signal's name: 143 for SIGTERM


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
