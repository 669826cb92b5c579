"""Throughput of ``rpr-mt translate`` with sentence splitting (decode.split_sentences) on and off.

Translates the same lines through ``translate_lines`` (the path of ``rpr-mt translate``) ``--repeats`` times each
way, alternating, and prints the median time, source sentences/s (sentences as the splitter counts them, the same
number for both ways) and lines/s per way, and the throughput ratio split/whole. Splitting adds the segmenter and
turns each line of k sentences into k shorter sources in the same token batches; on one-sentence lines it should
cost next to nothing, on paragraphs the ratio also reflects the outputs no longer stopping after one sentence.

    python3 benchmarks/bench_split.py --checkpoint RUN_DIR --input data/multi30k_en_de/test.en           # x1
    # the study's joined sets (test.x4.en: four captions a line), then paragraphs:
    python -c "from rpr_mt.experiments.study import write_long_sets as w; w('data/multi30k_en_de_bpe8k', 'long', 'en', 'de')"
    python3 benchmarks/bench_split.py --checkpoint RUN_DIR --input long/test.x4.en --repeats 5 --device cuda
    python3 benchmarks/bench_split.py --quick     # smoke test: the tests' tiny checkpoint, a few lines, 1 repeat
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUICK_CHECKPOINT = REPO / "tests" / "model" / "fixtures" / "old_shaw_per_head.pt"
QUICK_LINES = ["A man rides a bike. A dog runs after him. They stop at a red light.", "Two kids play.",
               "", "A woman sings on a stage. The crowd claps."]


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a checkpoint file or a run directory")
    parser.add_argument("--which", default="best", help="for a run directory: best, last or average")
    parser.add_argument("--input", help="source text, one line (sentence or paragraph) a line; .gz allowed")
    parser.add_argument("--lines", type=positive_int, default=None, help="only the first N lines of --input")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed runs per way (median reported)")
    parser.add_argument("--beam-size", type=positive_int, default=None,
                        help="default: the checkpoint's decode.beam_size")
    parser.add_argument("--max-tokens", type=positive_int, default=None,
                        help="default: the checkpoint's decode.max_tokens")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="smoke test: the tests' tiny checkpoint, 1 repeat")
    args = parser.parse_args(argv)

    from rpr_mt.text.segment import split_sentences
    from rpr_mt.decode.translate import translate_lines
    from rpr_mt.lines import read_lines
    from rpr_mt.checkpoint_files import load_for_inference
    from rpr_mt.device import resolve_device

    if args.quick:
        args.checkpoint, args.repeats = args.checkpoint or str(QUICK_CHECKPOINT), 1
    if not args.checkpoint or not (args.input or args.quick):
        parser.error("--checkpoint and --input are required (or --quick)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    loaded = load_for_inference(args.checkpoint, args.which, device)
    model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
    lines = read_lines(args.input) if args.input else QUICK_LINES
    lines = lines[: args.lines] if args.lines else lines
    changes = {k: v for k, v in {"beam_size": args.beam_size, "max_tokens": args.max_tokens}.items() if v is not None}
    decode = dataclasses.replace(cfg.decode, nbest=1, **changes)
    sentences = sum(len(split_sentences(line, cfg.data.src_lang)) for line in lines)

    ways = {"split": dataclasses.replace(decode, split_sentences=True),
            "whole": dataclasses.replace(decode, split_sentences=False)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    translate = lambda d: translate_lines(model, vocab, lines, decode=d, device=device,  # noqa: E731
                                          src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang)
    translate(ways["whole"])  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        for name, d in ways.items():  # alternating, so a load change on the machine hits both ways alike
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            translate(d)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)

    print(f"{loaded.checkpoint}: {len(lines)} lines, {sentences} sentences, beam {decode.beam_size}, "
          f"max_tokens {decode.max_tokens}, {device}, {args.repeats} repeat(s)")
    print("| way | median s | sentences/s | lines/s |")
    print("|---|---|---|---|")
    rate = {}
    for name, measured in times.items():
        median = statistics.median(measured)
        rate[name] = sentences / median
        print(f"| {name} | {median:.3f} | {rate[name]:.1f} | {len(lines) / median:.1f} |")
    print(f"split / whole throughput: {rate['split'] / rate['whole']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
