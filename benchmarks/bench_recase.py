"""The ceiling of recasing: how close the casing model that ``prepare`` learns for Multi30k's lowercased text brings
lowercased output to the cased reference, with no model in between.

For each target language: learn the casing model from the raw training text (``train.LANG.gz``, tokenized as the
tok/ files were), take the tok/ (lowercased, normalized, tokenized) reference of the test split, detokenize it as
``translate`` does for raw input, with and without recasing, and score both with cased sacreBLEU and chrF against
the raw reference. A perfect translation into the tok/ form would score the "recased" row; a model's recased
translations lose what the model loses on top. ``--hyp LANG:FILE`` scores such translations (a run's ``test.hyp``,
in the tok/ form) the same way, beside their literature BLEU (against the tok/ reference, as ``eval-bleu`` scores
them).

    python3 benchmarks/bench_recase.py                                   # $RPR_MT_MULTI30K_DIR or ../shared/...
    python3 benchmarks/bench_recase.py --multi30k-dir DIR --langs de fr --split val
    python3 benchmarks/bench_recase.py --hyp de:results/lit_tables_en_de_v4/base/seed1/test.hyp
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
    parser.add_argument("--hyp", action="append", default=[], metavar="LANG:FILE",
                        help="translations of the split into LANG in the tok/ form, one a line, to score the same "
                        "way (repeatable; LANG is added to --langs)")
    args = parser.parse_args(argv)
    hyps = []
    for given in args.hyp:
        lang, _, path = given.partition(":")
        if lang not in ("en", "de", "fr") or not path:
            parser.error(f"argument --hyp: expected LANG:FILE with LANG one of en, de, fr (got {given!r})")
        hyps.append((lang, Path(path)))
        if lang not in args.langs:
            args.langs.append(lang)

    from sacrebleu.metrics import BLEU, CHRF

    from rpr_mt.data.sources import read_lines
    from rpr_mt.errors import UserError
    from rpr_mt.evaluate import score
    from rpr_mt.text.multi30k import detokenize_multi30k
    from rpr_mt.text import casing

    root = Path(args.multi30k_dir)
    for lang in args.langs:
        for path in (root / f"train.{lang}.gz", root / f"{args.split}.{lang}.gz",
                     root / "tok" / f"{args.split}.{lang}.gz"):
            if not path.is_file():
                raise UserError(f"{path} not found (--multi30k-dir {root}: Multi30k's raw files and their tok/ "
                                "directory)")
    for _, path in hyps:
        if not path.is_file():
            raise UserError(f"--hyp {path}: file not found")
    print(f"{'lang':4}  {'text':30}  {'lit. BLEU':>9}  {'lowercase BLEU':>14}  {'recased BLEU':>12}  "
          f"{'lowercase chrF':>14}  {'recased chrF':>12}  {'case-blind BLEU':>15}")
    signature, learned = "", []
    for lang in args.langs:
        start = time.perf_counter()
        model = casing.learn(casing.tokenize_cased(read_lines(root / f"train.{lang}.gz"), lang), lang)
        learned.append(f"{lang} {len(model.words):,} words in {time.perf_counter() - start:.1f} s")
        tok_reference = list(read_lines(root / "tok" / f"{args.split}.{lang}.gz"))
        reference = list(read_lines(root / f"{args.split}.{lang}.gz"))
        texts = [("the tok/ reference", tok_reference)]
        texts += [("/".join(path.parts[-3:]), list(read_lines(path))) for hyp_lang, path in hyps if hyp_lang == lang]
        for name, tokenized in texts:
            literature = score(tokenized, tok_reference, lang=lang, pretokenized=True, hyp_name=name)["lc_tok_bleu"]
            lowercase = detokenize_multi30k(tokenized, lang)
            recased = detokenize_multi30k([model.recase(line) for line in tokenized], lang)
            bleu, chrf = BLEU(), CHRF()
            print(f"{lang:4}  {name[-30:]:30}  {literature:>9.2f}  "
                  f"{bleu.corpus_score(lowercase, [reference]).score:>14.2f}  "
                  f"{bleu.corpus_score(recased, [reference]).score:>12.2f}  "
                  f"{chrf.corpus_score(lowercase, [reference]).score:>14.2f}  "
                  f"{chrf.corpus_score(recased, [reference]).score:>12.2f}  "
                  f"{BLEU(lowercase=True).corpus_score(recased, [reference]).score:>15.2f}")
            signature = str(bleu.get_signature())
    print(f"sacreBLEU signature: {signature} (case-blind: lowercase=True); {len(reference):,} lines of "
          f"{args.split}, detokenized as translate does (recased: with the casing model of train); casing models: "
          f"{'; '.join(learned)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
