"""Time-to-BLEU: prepare -> train for exactly the config's budget -> translate dev and test (beam) -> sacreBLEU.

    python scripts/bench_time_to_bleu.py configs/multi30k_en_de_budget.yaml configs/multi30k_en_de_budget_abs.yaml

Each config trains into its own train.run_dir (an existing run there is replaced: the budget is only meaningful for
a fresh run). Training wall clock includes start-up and validation, as the OpenNMT-py numbers it is compared with.
Prints one markdown table: updates, epochs, target tokens/s, peak memory, dev and test BLEU with the sacreBLEU
signature, and decoding speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from rpr_mt.config import load_config
from rpr_mt.data.prepare import prepare, reference_files
from rpr_mt.decode.translate import read_lines, translate_lines
from rpr_mt.evaluate import score
from rpr_mt.train.checkpoint import load_for_inference
from rpr_mt.train.trainer import train


def run_one(config_path: str, overrides: list[str], which: str) -> dict:
    cfg = load_config(config_path, overrides)
    prepare(cfg.data, progress=False)
    shutil.rmtree(cfg.train.run_dir, ignore_errors=True)
    result = train(cfg, progress=False)
    model, cfg, vocab, checkpoint = load_for_inference(cfg.train.run_dir, which)
    row = {
        "config": config_path,
        "positions": cfg.model.positions,
        "precision": cfg.train.precision,
        "updates": result.step,
        "epochs": result.epoch + 1,
        "train_seconds": result.seconds,
        "tgt_tok_s": result.target_tokens / result.seconds,
        "peak_mem_mb": result.peak_memory_mb,
        "checkpoint": str(checkpoint),
    }
    decode = dataclasses.replace(cfg.decode, nbest=1)
    for split in ("dev", "test"):
        src_path, ref_path = reference_files(cfg.data.output_dir, split)
        sources = read_lines(src_path)
        start = time.perf_counter()
        hypotheses = translate_lines(model, vocab, sources, decode=decode, device=torch.device("cpu"))
        seconds = time.perf_counter() - start
        scores = score(hypotheses, read_lines(ref_path), lang=cfg.data.tgt_lang)
        row[f"{split}_bleu"] = scores["sacrebleu"]
        row[f"{split}_bp"] = sacrebleu.corpus_bleu(hypotheses, [read_lines(ref_path)]).bp  # brevity penalty
        row["signature"] = scores["sacrebleu_signature"]
        row[f"{split}_sent_s"] = len(sources) / seconds
        Path(cfg.train.run_dir, f"{split}.hyp").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value for all")
    parser.add_argument("--which", default="last", help="checkpoint to score: last, best or average")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    for config_path in args.configs:
        print(f"== {config_path}", file=sys.stderr, flush=True)
        rows.append(run_one(config_path, args.overrides, args.which))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| config | positions | precision | updates | epochs | train s | tgt tok/s | peak MB | dev BLEU | test BLEU "
          "| test BP | decode sent/s (test) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bp = f"{r['test_bp']:.3f}"
        print(f"| {Path(r['config']).name} | {r['positions']} | {r['precision']} | {r['updates']:,} | {r['epochs']} "
              f"| {r['train_seconds']:.0f} | {r['tgt_tok_s']:,.0f} | {r['peak_mem_mb']:,.0f} | {r['dev_bleu']:.1f} "
              f"| {r['test_bleu']:.1f} | {bp} | {r['test_sent_s']:.1f} |")
    print(f"\nsacreBLEU signature: {rows[0]['signature']}; scored checkpoint: {args.which}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
