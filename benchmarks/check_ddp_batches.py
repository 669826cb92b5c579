"""Under torchrun the ranks of a real `rpr-mt train` read disjoint shares of every batch that together are what one
process reads: the same config is trained once in one process and once under `torchrun --nproc_per_node N` (gloo
on a CPU), each rank recording every batch it trains on (the source and target ids of its real pairs), and the
records are compared update by update. Beside the check, each run's wall time.

    python3 benchmarks/check_ddp_batches.py --config CONFIG --set train.max_steps=30 [--nproc 2]

The config's prepared data is used as it is (prepare it first; a config whose data is missing prepares it in each
run). Its run directories go to a temporary directory; the records too, unless --out keeps them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.config import load_config  # noqa: E402
from rpr_mt.errors import UserError  # noqa: E402

RECORD_ENV = "RPR_MT_BATCH_RECORD"  # a directory: the trainer records each rank's batches there (--record mode)


def pair_keys(src, tgt_out, pad_id: int) -> list[str]:
    """One key per real pair of a collated batch: its source and target ids without padding. A rank without a share
    of a short batch trains on a stand-in pair whose target is all padding: it is no pair of the batch."""
    keys = []
    for s, t in zip(src.tolist(), tgt_out.tolist()):
        target = [i for i in t if i != pad_id]
        if target:
            source = [i for i in s if i != pad_id]
            keys.append(hashlib.sha1(json.dumps([source, target]).encode()).hexdigest()[:16])
    return keys


def record_and_train(train_argv: list[str]) -> None:
    """Run `rpr-mt train` with the trainer's batch stream wrapped: every batch it hands the loop is appended to
    $RPR_MT_BATCH_RECORD/rank{RANK}.jsonl as the keys of its real pairs."""
    from rpr_mt import cli
    from rpr_mt.train import batching

    rank = int(os.environ.get("RANK", "0"))
    out = open(Path(os.environ[RECORD_ENV]) / f"rank{rank}.jsonl", "w")
    original = batching.BatchStream.next

    def next_recorded(self):
        batch = original(self)
        out.write(json.dumps(pair_keys(batch.src, batch.tgt_out, self.model.pad_id)) + "\n")
        out.flush()
        return batch

    batching.BatchStream.next = next_recorded
    sys.argv = ["rpr-mt", "train", *train_argv]
    cli.main()


def read_records(directory: Path, ranks: int) -> list[list[list[str]]]:
    return [[json.loads(line) for line in open(directory / f"rank{r}.jsonl")] for r in range(ranks)]


def compare(single: list[list[str]], ranks: list[list[list[str]]]) -> list[str]:
    """What differs between one process's batches and the ranks' shares, batch by batch (empty: nothing)."""
    problems = []
    if len({len(r) for r in ranks} | {len(single)}) != 1:
        problems.append(f"batch counts differ: one process {len(single)}, ranks {[len(r) for r in ranks]}")
    for n, (one, *shares) in enumerate(zip(single, *ranks)):
        taken = [set(share) for share in shares]
        if any(taken[a] & taken[b] for a in range(len(taken)) for b in range(a + 1, len(taken))):
            problems.append(f"batch {n}: a pair read by two ranks")
        joined = sorted(key for share in shares for key in share)
        if joined != sorted(one):
            problems.append(f"batch {n}: the ranks' pairs ({len(joined)}) are not one process's ({len(one)})")
    return problems


def run(command: list[str], record: Path, env: dict[str, str]) -> float:
    record.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(command, env={**env, RECORD_ENV: str(record)})
    if done.returncode != 0:
        raise UserError(f"{' '.join(command[:4])} ... exited {done.returncode}")
    return time.perf_counter() - started


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    if argv is None and os.environ.get(RECORD_ENV) and sys.argv[1:2] == ["--record"]:
        record_and_train(sys.argv[2:])  # one rank (or the one process) of a run started below
        return 0
    parser = ArgumentParser(prog="check_ddp_batches.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a config whose data is prepared")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, as rpr-mt's --set (e.g. train.max_steps=30)")
    parser.add_argument("--nproc", type=positive_int, default=2, help="torchrun's --nproc_per_node")
    parser.add_argument("--out", type=Path, help="keep the run directories and records here")
    args = parser.parse_args(argv)
    load_config(args.config, args.sets)  # a bad config or override: one line before anything runs
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ddp_batches_"))
    me = [str(Path(__file__).resolve()), "--record"]
    env = dict(os.environ)
    times = {}
    for name, launcher in (("one", [sys.executable]),
                           ("ddp", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    f"--nproc_per_node={args.nproc}"])):
        train = ["--config", str(args.config), "--no-progress", *[a for s in args.sets for a in ("--set", s)],
                 "--set", f"train.run_dir={work / name / 'run'}"]
        times[name] = run([*launcher, *me, *train], work / name, env)
    single = read_records(work / "one", 1)[0]
    problems = compare(single, read_records(work / "ddp", args.nproc))
    pairs = sum(len(b) for b in single)
    print(f"{len(single)} batches, {pairs:,} pairs; one process {times['one']:.1f} s, "
          f"{args.nproc} ranks {times['ddp']:.1f} s (wall, start-up included)")
    if problems:
        print("DIFFERENT:\n  " + "\n  ".join(problems[:20]))
        return 1
    print(f"the {args.nproc} ranks read disjoint shares of every batch, and together each batch one process read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
