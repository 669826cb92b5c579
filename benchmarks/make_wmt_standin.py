"""A WMT14-En->De-sized stand-in corpus, made offline from Multi30k's real sentences, in the WMT schema as parquet.

Each training pair joins one to three Multi30k training sentences (and, rarely, many more: WMT's long tail up to
the cleaning limit of 250 words), the same sentences on both sides, so the pair is a real translation. Sentences
are taken from seeded shuffles of the 29,000 pairs, so the corpus is a pure function of --seed and --pairs. The mix
of joins gives a length distribution like WMT14 En->De's training data (mean ~25 words a side, a tail past 100).
Dev and test are Multi30k's own val and test_2016_flickr, unjoined, as newstest2013/2014 are to WMT14.

Written as parquet shards (--shard-pairs rows each) in the WMT/OPUS schema: one column ``translation`` of
{en, de}, which ``data.source: hub`` with ``data.hub.path: parquet`` reads through the same ``datasets`` streaming
code a WMT14 user runs. Streams: memory holds one chunk of pairs, never the corpus. Prints the length statistics
it produced and writes ``standin.yaml``, a config that prepares it.

    python benchmarks/make_wmt_standin.py --pairs 450000 --out /tmp/wmt_standin_450k
    rpr-mt prepare --config /tmp/wmt_standin_450k/standin.yaml
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FILES = {"train": "train", "dev": "val", "test": "test_2016_flickr"}  # ours -> Multi30k's file prefix
# Sentences joined into one pair, and how often: 1-3 mostly, 4-18 for the long tail (WMT14 En->De's training pairs
# have a mean of ~25 words a side and a tail to the 250-word cleaning limit; Multi30k's sentences have ~13 words).
JOIN_SIZES = np.arange(1, 19)
JOIN_WEIGHTS = np.array([0.33, 0.42, 0.23] + [0.02 / 15] * 15)
CHUNK = 65536  # pairs made and written at a time


def read_sentences(root: Path, prefix: str, lang: str) -> list[str]:
    path = root / f"{prefix}.{lang}.gz"
    if not path.is_file():
        raise UserError(f"Multi30k file not found: {path} (give --multi30k-dir or set RPR_MT_MULTI30K_DIR)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").strip() for line in f]


class Joiner:
    """Sentence indices from successive seeded permutations of the corpus, taken a join at a time."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)
        self.order, self.at = self.rng.permutation(n), 0

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            if self.at == self.n:
                self.order, self.at = self.rng.permutation(self.n), 0
            got = self.order[self.at:self.at + k]
            self.at += len(got)
            k -= len(got)
            out.append(got)
        return np.concatenate(out)


def parquet_writer(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("translation", pa.struct([("en", pa.string()), ("de", pa.string())]))])
    return pq.ParquetWriter(path, schema)


def table(en: list[str], de: list[str]):
    import pyarrow as pa

    return pa.table({"translation": pa.StructArray.from_arrays([pa.array(en), pa.array(de)], names=["en", "de"])})


def write_split(path: Path, en: list[str], de: list[str]) -> None:
    writer = parquet_writer(path)
    writer.write_table(table(en, de))
    writer.close()


def describe(name: str, counts: np.ndarray, limit: int) -> str:
    """Statistics of a histogram of words a pair (``counts[n]``: pairs of n words)."""
    n, words = counts.sum(), np.arange(len(counts))
    cumulative = np.cumsum(counts)
    q = [int(np.searchsorted(cumulative, p * n)) for p in (0.5, 0.9, 0.99, 0.999)]
    return (f"{name} words/pair: mean {(counts * words).sum() / n:.1f}, median {q[0]}, p90 {q[1]}, p99 {q[2]}, "
            f"p99.9 {q[3]}, max {words[counts > 0].max()}, over {limit}: {counts[limit + 1:].sum() / n:.4%}")


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="make_wmt_standin.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=positive_int, default=450_000, help="training pairs (WMT14 En->De: 4.5M)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the shards and standin.yaml")
    parser.add_argument("--multi30k-dir", type=Path, default=None,
                        help="Multi30k's raw files (default: $RPR_MT_MULTI30K_DIR, else ../shared/data/multi30k)")
    parser.add_argument("--seed", type=int, default=14, help="seeds the shuffles and joins")
    parser.add_argument("--shard-pairs", type=positive_int, default=1_000_000, help="rows per parquet shard")
    parser.add_argument("--vocab-size", type=positive_int, default=32768, help="data.vocab_size of the config")
    parser.add_argument("--max-words", type=positive_int, default=250, help="the cleaning limit the stats report")
    run(parser.parse_args(argv))


@reports_user_errors
def run(args) -> None:
    root = args.multi30k_dir or Path(os.environ.get("RPR_MT_MULTI30K_DIR") or REPO.parent / "shared/data/multi30k")
    en, de = (read_sentences(root, FILES["train"], lang) for lang in ("en", "de"))
    if len(en) != len(de):
        raise UserError(f"{root}: train.en and train.de have {len(en)} and {len(de)} lines")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("train-*.parquet"):  # a smaller earlier corpus's extra shards would be read too
        old.unlink()
    en_words = np.array([len(s.split()) for s in en])
    de_words = np.array([len(s.split()) for s in de])
    rng = np.random.default_rng([args.seed, 1])
    joiner = Joiner(len(en), args.seed)
    longest = int(JOIN_SIZES.max() * max(en_words.max(), de_words.max())) + 1
    histogram = {"en": np.zeros(longest, np.int64), "de": np.zeros(longest, np.int64)}  # pairs by words a side
    shards, writer, in_shard, made = [], None, 0, 0
    while made < args.pairs:
        n = min(CHUNK, args.pairs - made, args.shard_pairs - in_shard)
        sizes = rng.choice(JOIN_SIZES, size=n, p=JOIN_WEIGHTS / JOIN_WEIGHTS.sum())
        picks = [joiner.take(int(k)) for k in sizes]
        chunk_en = [" ".join(en[i] for i in idx) for idx in picks]
        chunk_de = [" ".join(de[i] for i in idx) for idx in picks]
        for lang, words in (("en", en_words), ("de", de_words)):
            histogram[lang] += np.bincount([words[idx].sum() for idx in picks], minlength=longest)
        if writer is None:
            shards.append(args.out / f"train-{len(shards):05d}.parquet")
            writer = parquet_writer(shards[-1])
        writer.write_table(table(chunk_en, chunk_de))
        made, in_shard = made + n, in_shard + n
        if in_shard == args.shard_pairs or made == args.pairs:
            writer.close()
            writer, in_shard = None, 0
    for split in ("dev", "test"):
        write_split(args.out / f"{split}.parquet", *(read_sentences(root, FILES[split], lang) for lang in ("en", "de")))
    config = {
        "data": {
            "source": "hub", "src_lang": "en", "tgt_lang": "de", "output_dir": str(args.out / "prepared"),
            "vocab_size": args.vocab_size, "spm_model_type": "bpe", "dedup": True, "max_words": args.max_words,
            "hub": {"path": "parquet",
                    "data_files": {"train": str(args.out / "train-*.parquet"), "validation": str(args.out / "dev.parquet"),
                                   "test": str(args.out / "test.parquet")},
                    "splits": {"train": "train", "dev": "validation", "test": "test"}},
        },
    }
    (args.out / "standin.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    size = sum(p.stat().st_size for p in shards)
    print(f"wrote {args.pairs:,} pairs in {len(shards)} shard(s), {size / 1e6:.1f} MB, to {args.out}")
    for lang in ("en", "de"):
        print(describe(lang, histogram[lang], args.max_words))
    print(f"config: {args.out / 'standin.yaml'}  (rpr-mt prepare --config {args.out / 'standin.yaml'})")


if __name__ == "__main__":
    main()
