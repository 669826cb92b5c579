"""Time-to-BLEU: prepare -> train for exactly the config's budget -> translate dev and test (beam) -> sacreBLEU.

    python3 scripts/bench_time_to_bleu.py configs/multi30k_en_de_budget.yaml configs/multi30k_en_de_budget_abs.yaml

Each config trains into its own train.run_dir (an existing run there is replaced: the budget is only meaningful for
a fresh run). Training wall clock includes start-up and validation, as the OpenNMT-py numbers it is compared with.
Prints one markdown table: updates, epochs, target tokens/s, peak memory, dev and test BLEU with the sacreBLEU
signature, and decoding speed. The checkpoint (last / average of the last ones) and the length penalty are chosen on
dev (``--which``, ``--length-penalties``); test is decoded once, with the dev-best pair.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

from rpr_mt.host import sleep_waiting_openmp_threads

sleep_waiting_openmp_threads()  # before torch loads: the runs train in this process (rpr_mt/host.py)

import sacrebleu  # noqa: E402
import torch  # noqa: E402

from rpr_mt.config import load_config  # noqa: E402
from rpr_mt.data.prepare import prepare, reference_files  # noqa: E402
from rpr_mt.decode.translate import translate_lines  # noqa: E402
from rpr_mt.files import write_lines  # noqa: E402
from rpr_mt.lines import read_lines  # noqa: E402
from rpr_mt.errors import UserError  # noqa: E402
from rpr_mt.evaluate import score  # noqa: E402
from rpr_mt.checkpoint_files import load_for_inference  # noqa: E402
from rpr_mt.train.trainer import train  # noqa: E402


def _decode(model, vocab, sources: list[str], decode) -> tuple[list[str], float]:
    start = time.perf_counter()
    hypotheses = translate_lines(model, vocab, sources, decode=decode, device=torch.device("cpu"))
    return hypotheses, len(sources) / (time.perf_counter() - start)


def run_one(
    config_path: str, overrides: list[str], candidates: list[str], length_penalties: list[float], test: bool = True
) -> dict:
    """Train one config for its budget; choose checkpoint and length penalty on dev; score test once with them
    (unless ``test`` is false: comparing variants on dev must not look at test)."""
    cfg = load_config(config_path, overrides)
    prepare(cfg.data, progress=False)
    shutil.rmtree(cfg.train.run_dir, ignore_errors=True)
    result = train(cfg, progress=False)
    row = {
        "config": config_path,
        "positions": cfg.model.positions,
        "precision": cfg.train.precision,
        "updates": result.step,
        "epochs": result.epoch + 1,
        "train_seconds": result.seconds,
        "tgt_tok_s": result.target_tokens / result.seconds,
        "peak_mem_mb": result.peak_memory_mb,
        "dev_grid": [],
    }
    splits = {split: reference_files(cfg.data.output_dir, split) for split in ("dev", "test")}
    dev_src, dev_ref = (read_lines(path) for path in splits["dev"])
    best = None
    for which in candidates:
        try:
            loaded = load_for_inference(cfg.train.run_dir, which)
            model, vocab, checkpoint = loaded.model, loaded.vocab, loaded.checkpoint
        except UserError as err:  # e.g. no averaged checkpoint when train.average_last is 0
            print(f"   skipping checkpoint {which}: {err}", file=sys.stderr, flush=True)
            continue
        for alpha in length_penalties:
            decode = dataclasses.replace(cfg.decode, nbest=1, length_penalty=alpha)
            hypotheses, sent_s = _decode(model, vocab, dev_src, decode)
            dev_scores = score(hypotheses, dev_ref, lang=cfg.data.tgt_lang)
            bleu = dev_scores["sacrebleu"]
            row["signature"] = dev_scores["sacrebleu_signature"]
            row["dev_grid"].append({"checkpoint": which, "length_penalty": alpha, "dev_bleu": bleu})
            print(f"   dev BLEU {bleu:.2f} with checkpoint {which}, length penalty {alpha}", file=sys.stderr, flush=True)
            if best is None or bleu > best[0]:
                best = (bleu, which, alpha, str(checkpoint), hypotheses, sent_s, model)
    if best is None:
        raise UserError(f"{cfg.train.run_dir}: none of the checkpoints {candidates} could be loaded (above)")
    dev_bleu, which, alpha, checkpoint, dev_hyp, dev_sent_s, model = best
    row.update(checkpoint=which, checkpoint_path=checkpoint, length_penalty=alpha, dev_bleu=dev_bleu,
               dev_sent_s=dev_sent_s, dev_bp=sacrebleu.corpus_bleu(dev_hyp, [dev_ref]).bp)
    write_lines(str(Path(cfg.train.run_dir, "dev.hyp")), dev_hyp)
    if not test:
        return row
    decode = dataclasses.replace(cfg.decode, nbest=1, length_penalty=alpha)
    test_src, test_ref = (read_lines(path) for path in splits["test"])
    test_hyp, test_sent_s = _decode(model, vocab, test_src, decode)
    scores = score(test_hyp, test_ref, lang=cfg.data.tgt_lang)
    row.update(test_bleu=scores["sacrebleu"], test_bp=sacrebleu.corpus_bleu(test_hyp, [test_ref]).bp,
               test_sent_s=test_sent_s, signature=scores["sacrebleu_signature"])
    write_lines(str(Path(cfg.train.run_dir, "test.hyp")), test_hyp)
    return row


def _number(row: dict, key: str, spec: str) -> str:
    return format(row[key], spec) if key in row else "–"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value for all")
    parser.add_argument("--which", nargs="+", default=["last", "average"], choices=["last", "best", "average"],
                        help="checkpoints to try on dev (last, best, average); test is scored with the dev-best")
    parser.add_argument("--length-penalties", nargs="+", type=float, default=[0.6, 1.0, 1.5, 2.0, 2.5, 3.0],
                        help="GNMT length penalties alpha to try on dev")
    parser.add_argument("--dev-only", action="store_true",
                        help="do not decode test (for comparing variants; score the chosen one with eval-bleu)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = []
    try:
        for config_path in args.configs:  # every config is checked before the first run deletes or trains anything
            load_config(config_path, args.overrides)
        for config_path in args.configs:
            print(f"== {config_path}", file=sys.stderr, flush=True)
            rows.append(run_one(config_path, args.overrides, args.which, args.length_penalties,
                                test=not args.dev_only))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("| config | positions | precision | updates | epochs | train s | tgt tok/s | peak MB | checkpoint, alpha "
          "(dev-chosen) | dev BLEU | test BLEU | test BP | decode sent/s (test) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(r['config']).name} | {r['positions']} | {r['precision']} | {r['updates']:,} | {r['epochs']} "
              f"| {r['train_seconds']:.0f} | {r['tgt_tok_s']:,.0f} | {r['peak_mem_mb']:,.0f} "
              f"| {r['checkpoint']}, {r['length_penalty']} | {r['dev_bleu']:.1f} | {_number(r, 'test_bleu', '.1f')} "
              f"| {_number(r, 'test_bp', '.3f')} | {_number(r, 'test_sent_s', '.1f')} |")
    print(f"\nsacreBLEU signature: {rows[0]['signature']}; checkpoint and length penalty chosen on dev among "
          f"{args.which} x {args.length_penalties}; beam size from each config's decode section")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
