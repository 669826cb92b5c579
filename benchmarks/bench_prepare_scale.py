"""`rpr-mt prepare` at scale: wall time, peak resident memory and seconds per stage, beside SentencePiece's own
encoding of the same text on every core (the floor for prepare's encode + binarize stage).

prepare runs as its own process (`python -m rpr_mt.cli prepare --force`), so its peak RSS is its own (os.wait4's
ru_maxrss), and records the seconds of each stage in its manifest ("seconds": inputs = checking the inputs and
opening every split, reading, cleaning with data.dedup, sentencepiece = training on its sample, encoding =
SentencePiece's calls, binarizing = the rest of writing the id arrays, checksums). The floor: the training split
cleaned again by prepare's own code into text files, then encoded with the prepared spm.model through
sentencepiece's Python API in batches of the same size, num_threads = the cores (both, on a 2-core machine).

    python benchmarks/make_wmt_standin.py --pairs 450000 --out /tmp/standin_450k
    python benchmarks/bench_prepare_scale.py --config /tmp/standin_450k/standin.yaml

or both in one: --make-pairs 450000 --dir /tmp/standin_450k.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("inputs", "reading", "cleaning", "sentencepiece", "encoding", "binarizing", "checksums")


def run_prepare(config: Path, out: Path, sets: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes and stderr of `rpr-mt prepare --force` in a process of its own."""
    command = [sys.executable, "-m", "rpr_mt.cli", "prepare", "--config", str(config), "--force", "--no-progress",
               "--set", f"data.output_dir={out}"] + [arg for s in sets for arg in ("--set", s)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        log = stderr.read().decode("utf-8", "replace")
    if process.returncode != 0:
        raise UserError(f"rpr-mt prepare failed (exit {process.returncode}): {log.strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss * 1024, log  # Linux reports kilobytes


def spm_floor(config_path: Path, sets: list[str], prepared: Path, scratch: Path, batch: int, threads: int,
              max_pairs: int | None) -> tuple[float, int]:
    """Seconds SentencePiece alone takes to encode the cleaned training text (both sides), and the sentences."""
    import sentencepiece as spm

    from rpr_mt.config import load_config
    from rpr_mt.data import sources
    from rpr_mt.data.clean import TrainFilter, write_clean_split

    data = load_config(config_path, sets).data
    corpus = sources.open_corpus(data)
    limit = min(filter(None, [data.max_train_pairs, max_pairs]), default=None)
    texts = [scratch / f"train.{data.src_lang}", scratch / f"train.{data.tgt_lang}"]
    write_clean_split(corpus.splits["train"].open(), *texts,
                      keep=TrainFilter(data.max_words, data.max_length_ratio, data.dedup), limit=limit,
                      progress=False)
    processor = spm.SentencePieceProcessor(model_file=str(prepared / "spm.model"))
    seconds, sentences = 0.0, 0
    for text in texts:
        with open(text, encoding="utf-8") as f:
            while lines := [line.rstrip("\n") for _, line in zip(range(batch), f)]:
                started = time.perf_counter()
                processor.encode(lines, out_type=int, num_threads=threads)
                seconds += time.perf_counter() - started
                sentences += len(lines)
        text.unlink()
    return seconds, sentences


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="bench_prepare_scale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="a config that prepares the corpus (make_wmt_standin.py writes DIR/standin.yaml)")
    parser.add_argument("--make-pairs", type=positive_int, default=None,
                        help="first make a stand-in of this many pairs in --dir (untimed), and use its config")
    parser.add_argument("--dir", type=Path, default=None, help="where --make-pairs writes the stand-in")
    parser.add_argument("--out", type=Path, default=None,
                        help="prepared data goes here (default: beside the config, prepared_bench/)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides for prepare, as rpr-mt's --set")
    parser.add_argument("--batch", type=positive_int, default=8192,
                        help="sentences per SentencePiece call in the floor (prepare's batch)")
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                        help="SentencePiece threads in the floor (prepare uses every core)")
    parser.add_argument("--floor-pairs", type=positive_int, default=None,
                        help="encode only the first N cleaned pairs in the floor, scaled to all (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the prepared data")
    run(parser.parse_args(argv))


@reports_user_errors
def run(args) -> None:
    if args.make_pairs is not None:
        if args.dir is None:
            raise UserError("--make-pairs needs --dir (where the stand-in is written)")
        from make_wmt_standin import main as make

        make(["--pairs", str(args.make_pairs), "--out", str(args.dir)])
        args.config = args.dir / "standin.yaml"
    if args.config is None:
        raise UserError("give --config (a config that prepares the corpus) or --make-pairs N --dir DIR")
    if not args.config.is_file():
        raise UserError(f"config file not found: {args.config}")
    out = args.out or args.config.parent / "prepared_bench"
    wall, rss, log = run_prepare(args.config, out, args.sets)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    seconds, train = manifest["seconds"], manifest["splits"]["train"]
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".floor-") as scratch:
        floor, sentences = spm_floor(args.config, args.sets, out, Path(scratch), args.batch, args.threads,
                                     args.floor_pairs)
    scale = 2 * train["kept"] / sentences  # encoded sentences of prepare / of the floor (both sides)
    floor *= scale
    pairs = train["read"]
    print(f"prepare of {pairs:,} pairs read ({train['kept']:,} kept; dropped {train['dropped']}), "
          f"{manifest['sentencepiece']['sample_sentences']:,} SentencePiece sample sentences, "
          f"vocabulary {manifest['sentencepiece']['vocab_size']}, {os.cpu_count()} cores")
    print(f"  wall {wall:.1f} s ({wall / pairs * 1e6:.1f} s per M pairs), peak RSS {rss / 2**20:.0f} MiB")
    for stage in STAGES:
        print(f"  {stage:<14}{seconds.get(stage, 0.0):9.1f} s")
    encode_binarize = seconds["encoding"] + seconds["binarizing"]
    print(f"  floor: SentencePiece alone encodes the same {2 * train['kept']:,} sentences in {floor:.1f} s "
          f"({args.threads} threads, batches of {args.batch}{'' if scale == 1 else f'; scaled from {sentences:,}'})")
    print(f"  encode + binarize {encode_binarize:.1f} s = {encode_binarize / floor:.2f}x the floor")
    print(json.dumps({"pairs": pairs, "kept": train["kept"], "wall_s": round(wall, 2), "peak_rss_mib": round(rss / 2**20),
                      "s_per_m_pairs": round(wall / pairs * 1e6, 1), "stages_s": seconds, "floor_s": round(floor, 2),
                      "encode_binarize_over_floor": round(encode_binarize / floor, 3)}))
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
