"""Training speed on a shared CPU: 1 vs 2 intra-op threads and OpenMP's wait policy, quiet and beside a busy process.

Each cell is a real `rpr-mt train` run of a config (default: the demo job) in a fresh process, because OpenMP reads
OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it starts. The figure is the median target tokens/s of the run's log
windows after its first ``--warmup`` updates (from its metrics.jsonl; validation and checkpoints are off). The
loads, started by this script before the cells that run beside them and stopped after them:

    quiet   nothing else
    busy1   one pure-Python busy loop (one core taken)
    busy2   two busy loops (every core of a 2-core machine taken)
    train   a second `rpr-mt train` of the same config with torch's default threads, as when two jobs share a machine

Cells run round-robin, ``--repeats`` times, so that drift in the machine's speed hits every cell alike; the table
gives the median and, with repeats, the range. Run it on an otherwise quiet machine:

    python3 benchmarks/bench_threads.py                       # threads 1 2 x policies default passive active x loads
    python3 benchmarks/bench_threads.py --policies default passive spin10k --loads quiet busy1 --repeats 3
    python3 benchmarks/bench_threads.py --quick               # a few updates a cell: checks the script, not the machine
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# OpenMP settings by name. libgomp (PyTorch's CPU wheels on Linux) spins a while in a barrier before sleeping; a
# spinning thread whose partner waits for a core held by another process burns that core for nothing.
POLICIES: dict[str, dict[str, str]] = {
    # libgomp's default, spin 300,000 times, then sleep: its spin count with OMP_WAIT_POLICY unset. Leaving the
    # variables unset would not give it, since `rpr-mt` then sets OMP_WAIT_POLICY=PASSIVE; an explicit
    # GOMP_SPINCOUNT overrides the spin count that policy implies.
    "default": {"GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},  # spin (almost) without end
    "spin10k": {"GOMP_SPINCOUNT": "10000"},  # spin briefly, then sleep
}
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS")
LOADS = ("quiet", "busy1", "busy2", "train")
BUSY_LOOP = "while True:\n    pass\n"


def train_command(config: str, run_dir: Path, sets: list[str]) -> list[str]:
    command = [sys.executable, "-m", "rpr_mt.cli", "train", "--config", config, "--no-progress",
               "--set", f"train.run_dir={run_dir}"]
    for value in sets:
        command += ["--set", value]
    return command


def base_env() -> dict[str, str]:
    """This environment less any OpenMP setting, so that each cell sets exactly its own."""
    return {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES}


def start_load(load: str, config: str, workdir: Path) -> list[subprocess.Popen]:
    """Start the sibling process(es) of ``load``; a training sibling is waited for until it has logged an update."""
    if load == "quiet":
        return []
    if load.startswith("busy"):
        return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(int(load[4:]))]
    if load == "train":
        run_dir = workdir / "sibling"
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resumed one
        command = train_command(config, run_dir, ["train.max_steps=1000000", "train.max_time=null",
                                                  "train.lr_schedule=inverse_sqrt", "train.log_every=1",
                                                  "train.validate_every=1000000", "train.save_every=1000000",
                                                  "train.tensorboard=false"])
        proc = subprocess.Popen(command, cwd=REPO, env=base_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not (run_dir / "metrics.jsonl").is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"the training sibling did not start (exit code {proc.poll()})")
            time.sleep(0.5)
        return [proc]
    raise ValueError(load)


def stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(config: str, threads: int, policy: str, args: argparse.Namespace, workdir: Path) -> float:
    """Median target tokens/s of one fresh training run's log windows after the warm-up updates."""
    run_dir = workdir / f"t{threads}_{policy}"
    shutil.rmtree(run_dir, ignore_errors=True)  # else the run would resume the last cell's finished checkpoint
    # The schedule does not change the speed; inverse_sqrt is the one that needs neither max_time nor max_steps.
    sets = [f"train.num_threads={threads}", f"train.max_steps={args.warmup + args.updates}", "train.max_time=null",
            "train.max_epochs=null", "train.patience=null", "train.lr_schedule=inverse_sqrt",
            f"train.log_every={args.log_every}", "train.validate_every=1000000", "train.save_every=1000000",
            "train.valid_bleu=false", "train.tensorboard=false"]
    env = {**base_env(), **POLICIES[policy], "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(train_command(config, run_dir, sets), cwd=REPO, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training with {threads} thread(s), {policy} failed:\n{done.stderr[-3000:]}")
    from rpr_mt.errors import UserError
    from rpr_mt.run_metrics import read_records  # the trainer's own reader: a cut-off last line is skipped

    try:
        records = read_records(run_dir / "metrics.jsonl")
    except UserError as err:
        raise SystemExit(f"training with {threads} thread(s), {policy}: {err}") from None
    rates = [r["tgt_tok_s"] for r in records if "tgt_tok_s" in r and r["step"] > args.warmup]
    if not rates:
        raise SystemExit(f"no log window after update {args.warmup}: raise --updates or lower --log-every")
    return statistics.median(rates)


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml", help="the training config to measure")
    parser.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    parser.add_argument("--policies", nargs="+", choices=sorted(POLICIES), default=["default", "passive", "active"])
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=["quiet", "busy1", "train"])
    parser.add_argument("--updates", type=positive_int, default=60, help="timed updates a cell")
    parser.add_argument("--warmup", type=non_negative_int, default=10, help="updates before the timed ones")
    parser.add_argument("--log-every", type=positive_int, default=10, help="updates a log window (one rate each)")
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="4 timed updates a cell, one repeat, default policy: checks that the script works")
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.warmup, args.log_every, args.repeats, args.policies = 4, 2, 2, 1, ["default"]
    from rpr_mt.config import load_config  # no torch: this process's threads are not set yet

    # read as the runs read it (from REPO): a bad config is one line now, not a failed `rpr-mt prepare` and a traceback
    load_config(REPO / args.config)

    import torch

    # The data is prepared once, outside the timed runs (a no-op when it is up to date).
    subprocess.run([sys.executable, "-m", "rpr_mt.cli", "prepare", "--config", args.config], cwd=REPO, check=True,
                   env=base_env())
    print(f"torch {torch.__version__}; {os.cpu_count()} logical CPUs; config {args.config}; "
          f"{args.updates} timed updates after {args.warmup}, windows of {args.log_every}; {args.repeats} repeat(s)")
    backend = [line.strip() for line in torch.__config__.parallel_info().splitlines()
               if line.startswith("OpenMP") or "parallel backend" in line]
    print("; ".join(backend) + "\n")
    results: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_threads_") as tmp:
        workdir = Path(tmp)
        for repeat in range(args.repeats):
            for load in args.loads:
                procs = start_load(load, args.config, workdir)
                try:
                    for threads in args.threads:
                        for policy in args.policies:
                            rate = measure(args.config, threads, policy, args, workdir)
                            results.setdefault((load, threads, policy), []).append(rate)
                            print(f"repeat {repeat + 1}, {load}, {threads} thread(s), {policy}: {rate:,.0f} tgt tok/s",
                                  file=sys.stderr, flush=True)
                finally:
                    stop_load(procs)

    print("| threads | OpenMP | " + " | ".join(f"{load} tgt tok/s" for load in args.loads) + " |")
    print("|---|---|" + "---|" * len(args.loads))
    for threads in args.threads:
        for policy in args.policies:
            cells = []
            for load in args.loads:
                values = results[(load, threads, policy)]
                text = f"{statistics.median(values):,.0f}"
                if len(values) > 1:
                    text += f" ({min(values):,.0f}-{max(values):,.0f})"
                cells.append(text)
            setting = " ".join(f"{k}={v}" for k, v in POLICIES[policy].items()) or "unset"
            print(f"| {threads} | {policy} ({setting}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
