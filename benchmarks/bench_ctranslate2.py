"""Decoding speed and BLEU: rpr-mt's cached beam search against the same model exported to CTranslate2, in one run.

Translates Multi30k ``test_2016_flickr`` (1,000 sentences) with the same search (beam 4, the run's length penalty
and length limit) and the same number of threads four ways:

    rpr-mt                          ``translate_lines``, the path of ``rpr-mt translate``
    CTranslate2 float32             ``rpr-mt export`` + ``ExportedTranslator`` (rpr-mt's exact search, see
                                    rpr_mt/decode/ctranslate2.py: sentences grouped by their length limit)
    CTranslate2 int8                the same, exported with ``--quantization int8``
    CTranslate2 float32, one call   plain ``translate_batch`` over all sentences at once: one length limit (the
                                    largest) and CTranslate2's own length penalty; how much the grouping costs

and prints sentences/s, output tokens/s (outputs differ in length, so tokens/s is the fair rate), sacreBLEU, how
many outputs equal rpr-mt's, and each rate as a ratio to CTranslate2 float32. Times include SentencePiece encoding
and decoding for every row. Output tokens are the pieces of the re-encoded output lines (eos not counted).

    # the measurement (docs/benchmarks.md): the sweep's model with shared Shaw tables, its last 5 checkpoints averaged
    rpr-mt train --config configs/multi30k_en_de_rel.yaml --set model.share_across_heads=true \\
        --set train.run_dir=runs/multi30k_en_de_rel_shared
    python3 benchmarks/bench_ctranslate2.py --checkpoint runs/multi30k_en_de_rel_shared --which average \\
        --threads 2 --repeats 3
    python3 benchmarks/bench_ctranslate2.py --quick      # 20 lines, a random tiny model: checks that it runs

The model must be exportable (``rpr-mt export`` says why when not): for Shaw positions, train with
``--set model.share_across_heads=true``. Without ``--checkpoint`` a random model is used (outputs run to the length
limit and BLEU is ~0: only for checking the script). Goals (issue #21): CTranslate2 int8 within 0.5 BLEU of float32;
rpr-mt >= 0.75x CTranslate2 float32's output tokens/s. Measure on a quiet machine: ``--threads 2`` on a CPU that
other jobs share measures the other jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rpr_mt.config import DecodeConfig, config_from_dict, config_to_dict
from rpr_mt.decode.ctranslate2 import ExportedTranslator
from rpr_mt.decode.translate import translate_lines
from rpr_mt.lines import read_lines
from rpr_mt.evaluate import score
from rpr_mt.export.ctranslate2 import export_ctranslate2

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k"


def random_checkpoint(workdir: Path, args) -> Path:
    """A random exportable model (Shaw, shared tables) over a SentencePiece model trained on Multi30k sentences."""
    from rpr_mt.data.vocab import Vocab, train_sentencepiece
    from rpr_mt.model.transformer import Seq2Seq
    from rpr_mt import checkpoint_files as ckpt

    sentences = []
    for lang in (args.src, args.tgt):
        with gzip.open(SHARED / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            sentences += [line.rstrip("\n") for _, line in zip(range(args.spm_sentences // 2), handle)]
    spm_path = train_sentencepiece(sentences, workdir, vocab_size=args.spm_size, model_type="bpe",
                                   character_coverage=1.0)
    vocab = Vocab.load(spm_path)
    cfg = config_from_dict({"model": {"d_model": args.d_model, "n_heads": args.heads, "encoder_layers": args.layers,
                                      "decoder_layers": args.layers, "ff_dim": 4 * args.d_model, "dropout": 0.0,
                                      "share_across_heads": True, "max_positions": 256},
                            "data": {"src_lang": args.src, "tgt_lang": args.tgt}})
    torch.manual_seed(0)
    model = Seq2Seq(cfg.model, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id)
    path = workdir / "random.pt"
    ckpt.save_checkpoint({"format": ckpt.FORMAT, "step": 0, "config": config_to_dict(cfg),
                          "vocab": ckpt.vocab_payload(spm_path), "model": model.state_dict()}, path)
    return path


def timed(fn, repeats: int) -> tuple[float, list[str]]:
    """Median seconds of ``repeats`` calls of ``fn()``, and its last output."""
    times, outputs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), outputs


def plain_ctranslate2(exported: ExportedTranslator, lines: list[str], decode: DecodeConfig) -> list[str]:
    """One translate_batch call for every line: CTranslate2's fastest batching, its own length penalty."""
    vocab = exported.vocab
    pieces = [vocab.pieces(line)[: exported.max_positions - 1] for line in lines]
    longest = max(exported.limit(vocab.encode(line), decode) for line in lines)
    results = exported.translator.translate_batch(
        pieces, beam_size=decode.beam_size, length_penalty=decode.length_penalty, min_decoding_length=min(decode.min_length, longest),
        max_decoding_length=longest + 1, max_input_length=0, max_batch_size=decode.max_tokens, batch_type="tokens",
    )
    return [vocab.decode(exported.piece_ids(r.hypotheses[0])) for r in results]


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="an exportable trained checkpoint or run directory")
    parser.add_argument("--which", default="best", help="for a run directory: best, last or average")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--lines", type=positive_int, default=None, help="translate only the first N lines")
    parser.add_argument("--beam-size", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--repeats", type=positive_int, default=1, help="median of this many runs per row")
    parser.add_argument("--quick", action="store_true", help="20 lines and a small random model: a smoke test")
    parser.add_argument("--spm-size", type=positive_int, default=8000, help="random model: SentencePiece pieces")
    parser.add_argument("--spm-sentences", type=positive_int, default=20000, help="...trained on this many sentences")
    parser.add_argument("--d-model", type=positive_int, default=256, help="random model: width")
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--layers", type=positive_int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.lines = args.lines or 20
        args.spm_size, args.spm_sentences, args.d_model, args.layers = 500, 2000, 64, 1
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        source = args.checkpoint or random_checkpoint(workdir, args)
        export_ctranslate2(source, workdir / "float32", which=args.which)
        export_ctranslate2(source, workdir / "int8", which=args.which, quantization="int8")
        from rpr_mt.checkpoint_files import load_for_inference

        loaded = load_for_inference(source, args.which, "cpu")
        model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
        src_lang, tgt_lang = (cfg.data.src_lang, cfg.data.tgt_lang) if args.checkpoint else (args.src, args.tgt)
        lines = read_lines(str(SHARED / f"test_2016_flickr.{src_lang}.gz"))[: args.lines]
        references = read_lines(str(SHARED / f"test_2016_flickr.{tgt_lang}.gz"))[: len(lines)]
        decode = dataclasses.replace(cfg.decode, beam_size=args.beam_size, nbest=1)
        float32 = ExportedTranslator(workdir / "float32", threads=args.threads)
        int8 = ExportedTranslator(workdir / "int8", threads=args.threads)
        systems = {
            "rpr-mt (cached beam search)": lambda ls: translate_lines(model, vocab, ls, decode=decode, device="cpu"),
            "CTranslate2 float32": lambda ls: float32.translate_lines(ls, decode),
            "CTranslate2 int8": lambda ls: int8.translate_lines(ls, decode),
            "CTranslate2 float32, one call": lambda ls: plain_ctranslate2(float32, ls, decode),
        }
        rows = {}
        for name, translate in systems.items():
            translate(lines[:8])  # warm-up
            seconds, outputs = timed(lambda: translate(lines), args.repeats)
            tokens = sum(len(vocab.encode(o)) for o in outputs)
            bleu = score(outputs, references, lang=tgt_lang)["sacrebleu"]
            rows[name] = (seconds, tokens, bleu, outputs)

    model_name = loaded.checkpoint if args.checkpoint else "random model"
    m = cfg.model
    print(f"{len(lines)} lines of test_2016_flickr.{src_lang} -> {tgt_lang}; {model_name} ({m.positions}, "
          f"{m.encoder_layers}+{m.decoder_layers} layers, d={m.d_model});"
          f" beam {decode.beam_size}, length penalty {decode.length_penalty}, max length {decode.max_len_a}|x|+"
          f"{decode.max_len_b}; {args.threads} threads; torch {torch.__version__}, ctranslate2 "
          f"{__import__('ctranslate2').__version__}; median of {args.repeats}; loadavg {os.getloadavg()[0]:.2f}")
    print()
    print("| system | sentences/s | output tokens/s | x CTranslate2 float32 (tokens/s) | BLEU | outputs = rpr-mt's |")
    print("|---|---|---|---|---|---|")
    reference_rate = rows["CTranslate2 float32"][1] / rows["CTranslate2 float32"][0]
    ours = rows["rpr-mt (cached beam search)"][3]
    for name, (seconds, tokens, bleu, outputs) in rows.items():
        same = sum(a == b for a, b in zip(outputs, ours))
        rate = tokens / seconds
        print(f"| {name} | {len(lines) / seconds:.1f} | {rate:.0f} | {rate / reference_rate:.2f} | {bleu:.2f} |"
              f" {same}/{len(lines)} |")
    drop = rows["CTranslate2 float32"][2] - rows["CTranslate2 int8"][2]
    ratio = (rows["rpr-mt (cached beam search)"][1] / rows["rpr-mt (cached beam search)"][0]) / reference_rate
    print()
    print(f"goal: int8 within 0.5 BLEU of float32: {drop:+.2f} BLEU ({'met' if abs(drop) <= 0.5 else 'not met'})")
    print(f"goal: rpr-mt >= 0.75x CTranslate2 float32 tokens/s: {ratio:.2f}x ({'met' if ratio >= 0.75 else 'not met'})")
    print(f"loadavg at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
