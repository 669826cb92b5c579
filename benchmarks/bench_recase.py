"""The ceiling of recasing: how close the casing model that ``prepare`` learns for Multi30k's lowercased text brings
lowercased output to the cased reference, with no model in between.

For each target language: learn the casing model from the raw training text (``train.LANG.gz``, tokenized as the
tok/ files were), take the tok/ (lowercased, normalized, tokenized) reference of the test split, detokenize it as
``translate`` does for raw input, with and without recasing, and score both with cased sacreBLEU and chrF against
the raw reference. A perfect translation into the tok/ form would score the "recased" row; a model's recased
translations lose what the model loses on top.

    python3 benchmarks/bench_recase.py                                   # $RPR_MT_MULTI30K_DIR or ../shared/...
    python3 benchmarks/bench_recase.py --multi30k-dir DIR --langs de fr --split val
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, reports_user_errors  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k-dir", default=os.environ.get("RPR_MT_MULTI30K_DIR",
                                                               str(REPO.parent / "shared" / "data" / "multi30k")),
                        help="Multi30k's files: {split}.{lang}.gz and tok/{split}.{lang}.gz (default: "
                        "$RPR_MT_MULTI30K_DIR, else ../shared/data/multi30k beside the checkout)")
    parser.add_argument("--langs", nargs="+", default=["de", "fr"], choices=["en", "de", "fr"],
                        help="target languages (default: de fr)")
    parser.add_argument("--split", default="test_2016_flickr", choices=["val", "test_2016_flickr"],
                        help="the split whose tok/ reference is recased (default: test_2016_flickr)")
    args = parser.parse_args(argv)

    from sacrebleu.metrics import BLEU, CHRF

    from rpr_mt.data.sources import read_lines
    from rpr_mt.errors import UserError
    from rpr_mt.evaluate import detokenize_multi30k
    from rpr_mt.text import casing

    root = Path(args.multi30k_dir)
    for lang in args.langs:
        for path in (root / f"train.{lang}.gz", root / f"{args.split}.{lang}.gz", root / "tok" / f"{args.split}.{lang}.gz"):
            if not path.is_file():
                raise UserError(f"{path} not found (--multi30k-dir {root}: Multi30k's raw files and their tok/ "
                                "directory)")
    print(f"{'lang':4}  {'words':>6}  {'learn s':>7}  {'lowercase BLEU':>14}  {'recased BLEU':>12}  "
          f"{'lowercase chrF':>14}  {'recased chrF':>12}  {'case-blind BLEU':>15}")
    signature = ""
    for lang in args.langs:
        start = time.perf_counter()
        model = casing.learn(casing.tokenize_cased(read_lines(root / f"train.{lang}.gz"), lang), lang)
        seconds = time.perf_counter() - start
        tokenized = list(read_lines(root / "tok" / f"{args.split}.{lang}.gz"))
        reference = list(read_lines(root / f"{args.split}.{lang}.gz"))
        lowercase = detokenize_multi30k(tokenized, lang)
        recased = detokenize_multi30k([model.recase(line) for line in tokenized], lang)
        bleu, chrf = BLEU(), CHRF()
        print(f"{lang:4}  {len(model.words):>6,}  {seconds:>7.1f}  "
              f"{bleu.corpus_score(lowercase, [reference]).score:>14.2f}  "
              f"{bleu.corpus_score(recased, [reference]).score:>12.2f}  "
              f"{chrf.corpus_score(lowercase, [reference]).score:>14.2f}  "
              f"{chrf.corpus_score(recased, [reference]).score:>12.2f}  "
              f"{BLEU(lowercase=True).corpus_score(recased, [reference]).score:>15.2f}")
        signature = str(bleu.get_signature())
    print(f"sacreBLEU signature: {signature} (case-blind: lowercase=True); {len(reference):,} lines of "
          f"{args.split}, the tok/ reference detokenized as translate does (recased: with the casing model of train)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
