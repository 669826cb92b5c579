"""The trainer's start-up on a prepared corpus: seconds and resident memory before the first update.

Two measurements on the same prepared data (its config's data section; prepared first if it is not):
  1. `rpr-mt train` in a process of its own with a tiny model and max_steps 1: the seconds from its launch to its
     first update and its peak RSS until then (/proc/self/status VmHWM, printed as the trainer leaves its start-up
     context), and, beside them, its whole wall time and peak RSS (the one update adds the model's own memory:
     logits of max_tokens x vocabulary);
  2. in this process, the parts of that start-up that grow with the corpus: the up-to-date check of the prepared
     data (re-hashes its files), opening the memory-mapped id arrays, the usable examples, and one epoch's
     length-bucketed shuffled batch plan (rpr_mt.train.batching.make_batches), with the RSS each adds.

    python benchmarks/make_wmt_standin.py --pairs 450000 --out /tmp/standin_450k
    rpr-mt prepare --config /tmp/standin_450k/standin.yaml
    python benchmarks/bench_trainer_startup.py --config /tmp/standin_450k/standin.yaml
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1", "model.ff_dim=64",
        "train.max_steps=1", "train.valid_bleu=false", "train.validate_every=1000000", "train.save_every=1000000",
        "train.tensorboard=false", "train.log_every=1"]


def rss_mib() -> float:
    """This process's resident memory now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# Runs `rpr-mt train` with the trainer's start-up context (rpr_mt.train.signals.before_first_update, which closes
# right before the first update) wrapped: on leaving it, the process prints the time and its peak RSS so far.
_DRIVER = r"""
import contextlib, sys, time
import rpr_mt.train.trainer as trainer
inner = trainer.before_first_update

@contextlib.contextmanager
def probed():
    with inner():
        yield
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    kib = lambda key: int(status[key].split()[0])
    print(f"STARTUP {time.time()} {kib('VmHWM')} {kib('VmRSS')}", file=sys.stderr, flush=True)

trainer.before_first_update = probed
from rpr_mt.cli import main
sys.argv = ["rpr-mt", *sys.argv[1:]]
main()
"""


def run_train(config: Path, sets: list[str], run_dir: Path) -> dict[str, float]:
    """Seconds and peak RSS (MiB) of a one-update tiny-model `rpr-mt train` in its own process, up to its first
    update and in all."""
    sets = [*sets, *TINY, f"train.run_dir={run_dir}"]
    command = [sys.executable, "-c", _DRIVER, "train", "--config", str(config), "--no-progress",
               *(arg for s in sets for arg in ("--set", s))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started, clock = time.time(), time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - clock
        stderr.seek(0)
        log = stderr.read().decode("utf-8", "replace")
    probe = [line.split() for line in log.splitlines() if line.startswith("STARTUP ")]
    if os.waitstatus_to_exitcode(status) != 0 or not probe:
        raise UserError(f"rpr-mt train failed: {log.strip().splitlines()[-1:]}")
    _, at, hwm, rss = probe[0]
    return {"startup_s": float(at) - started, "startup_peak_mib": int(hwm) / 1024, "startup_rss_mib": int(rss) / 1024,
            "wall_s": wall, "peak_mib": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="bench_trainer_startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a config whose data section is the corpus")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, as rpr-mt's --set")
    parser.add_argument("--max-tokens", type=positive_int, default=6250,
                        help="train.max_tokens of the batch plan (the WMT configs' 6250)")
    run(parser.parse_args(argv))


@reports_user_errors
def run(args) -> None:
    from rpr_mt.config import load_config
    from rpr_mt.data.binarize import load_split
    from rpr_mt.data.prepare import check_prepared, prepare
    from rpr_mt.train.batching import make_batches, usable_examples

    sets = [*args.sets, f"train.max_tokens={args.max_tokens}"]
    config = load_config(args.config, sets)
    if check_prepared(config.data) is not None:
        prepare(config.data, progress=False)
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        trained = run_train(args.config, sets, Path(tmp) / "run")
    base = rss_mib()
    steps: list[tuple[str, float, float]] = []

    def step(name: str, work):
        started = time.perf_counter()
        result = work()
        steps.append((name, time.perf_counter() - started, rss_mib()))
        return result

    step("up-to-date check", lambda: check_prepared(config.data))
    data = step("open id arrays", lambda: load_split(config.data.output_dir, "train"))
    indices = step("usable examples", lambda: usable_examples(data, config.model.max_positions,
                                                              config.data.max_train_tokens))
    batches = step("epoch batch plan", lambda: make_batches(data, indices, args.max_tokens, config.train.seed, 0))
    print(f"trainer start-up on {len(data):,} training pairs ({len(indices):,} usable, {len(batches):,} batches of "
          f"<= {args.max_tokens} tokens a side), {os.cpu_count()} cores")
    print(f"  rpr-mt train to its first update: {trained['startup_s']:.1f} s, peak RSS {trained['startup_peak_mib']:.0f} "
          f"MiB (RSS {trained['startup_rss_mib']:.0f} MiB then); with one update of a tiny model: "
          f"{trained['wall_s']:.1f} s, peak RSS {trained['peak_mib']:.0f} MiB (the update's logits are the model's own)")
    print(f"  in this process (RSS {base:.0f} MiB before):")
    for name, seconds, rss in steps:
        print(f"    {name:<18}{seconds:8.2f} s   RSS {rss:7.0f} MiB")
    print(f"    peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
