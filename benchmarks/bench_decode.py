"""Decoding speed on this machine: sentences/s of greedy and beam-4 translation, cached vs recomputing the prefix.

Translates the first ``--lines`` lines of Multi30k ``test_2016_flickr.en.gz`` through ``translate_lines`` (the
same path as ``rpr-mt translate``: length-sorted token batches, ``decode.max_tokens`` source tokens each) twice per
setting: with the incremental decoder cache (``decode_step``, one new token per step) and recomputing the whole
prefix with ``model.forward`` at every step (``full_prefix=True``; the encoder is recomputed too). Both must give
identical translations; the table says whether they did.

    python3 benchmarks/bench_decode.py                                    # random models, relative and absolute
    python3 benchmarks/bench_decode.py --checkpoint runs/rel --checkpoint runs/abs --lines 500
    python3 benchmarks/bench_decode.py --vocab data/multi30k_en_de --positions relative --beam-sizes 4

Models:
    --checkpoint PATH   (repeatable) a trained checkpoint file or run directory; its vocabulary comes with it.
    otherwise           a randomly initialised model per ``--positions`` mode (``--d-model``, ``--layers``, ...),
                        with the SentencePiece model given by ``--vocab`` (a .model file or a prepared data
                        directory), or else one trained here on ``--spm-sentences`` Multi30k training sentences.
                        A random model rarely emits eos, so nearly every output runs to the length limit
                        ``1.5 |x| + 10``: the worst case for decoding time (the "out len" column shows it). Trained
                        models stop earlier, so they should decode faster and show a smaller cached/recompute gap.

``--device cuda`` decodes on the GPU (float32, as ``rpr-mt translate --device cuda`` does; one query a step takes the
gather path, not the Triton kernels): beam search there meets a new batch shape whenever a sentence finishes, so it
shows what those shapes cost on a GPU. The input and the SentencePiece model must be reachable on that machine
(``--input``, ``--vocab``).

Threads: ``--threads 2`` (default) uses both cores of the reference machine. When other jobs share the CPU, use
``--threads 1``: with two intra-op threads every small decoder op waits for a second free core, and timings collapse
(greedy, 10 lines, load ~3: 3.7 sent/s with 2 threads vs 15.2 with 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rpr_mt.config import DecodeConfig, ModelConfig
from rpr_mt.decode.translate import translate_lines
from rpr_mt.device import resolve_device
from rpr_mt.lines import read_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, bench_train.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402
from bench_train import SCHEMES  # noqa: E402

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k"
DEFAULT_INPUT = SHARED / "test_2016_flickr.en.gz"


def load_vocab(args, workdir: Path):
    from rpr_mt.data.vocab import Vocab, train_sentencepiece

    if args.vocab:
        return Vocab.load(args.vocab)
    sentences = []
    for name in ("train.en.gz", "train.de.gz"):
        with gzip.open(SHARED / name, "rt", encoding="utf-8") as handle:
            sentences += [line.rstrip("\n") for _, line in zip(range(args.spm_sentences // 2), handle)]
    path = train_sentencepiece(sentences, workdir, vocab_size=args.spm_size, model_type="bpe", character_coverage=1.0)
    return Vocab.load(path)


def models(args, workdir: Path, device: torch.device):
    """(label, model, vocab) for each model to benchmark."""
    if args.checkpoint:
        from rpr_mt.checkpoint_files import load_for_inference

        for path in args.checkpoint:
            loaded = load_for_inference(path, args.which, device)
            yield f"{loaded.config.model.positions} ({loaded.checkpoint.name})", loaded.model, loaded.vocab
        return
    from rpr_mt.model.transformer import Seq2Seq

    vocab = load_vocab(args, workdir)
    for positions in args.positions:
        torch.manual_seed(0)
        config = ModelConfig(d_model=args.d_model, n_heads=args.heads, encoder_layers=args.layers,
                             decoder_layers=args.layers, ff_dim=args.ff, dropout=0.0, positions=positions,
                             max_positions=256)
        model = Seq2Seq(config, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id).to(device).eval()
        yield f"{positions} (random)", model, vocab


def timed(model, vocab, lines, decode: DecodeConfig, full_prefix: bool, repeats: int,
          device: torch.device) -> tuple[float, list[str]]:
    """Median seconds of ``repeats`` runs, and the translations (strings: the GPU's work is done when they are)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = translate_lines(model, vocab, lines, decode=decode, device=device, full_prefix=full_prefix)
        times.append(time.perf_counter() - start)
    return statistics.median(times), outputs


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", default=str(DEFAULT_INPUT), help="source text (.gz allowed)")
    parser.add_argument("--lines", type=positive_int, default=100, help="translate the first N lines")
    parser.add_argument("--checkpoint", action="append", help="trained checkpoint or run dir (repeatable)")
    parser.add_argument("--which", default="best", help="for a run directory: best, last or average")
    parser.add_argument("--vocab", help="random models: SentencePiece .model or prepared data dir")
    parser.add_argument("--spm-size", type=positive_int, default=8000, help="random models without --vocab: pieces")
    parser.add_argument("--spm-sentences", type=positive_int, default=20000, help="...trained on this many sentences")
    parser.add_argument("--positions", nargs="+", choices=SCHEMES, default=["relative", "absolute"])
    parser.add_argument("--d-model", type=positive_int, default=256)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--layers", type=positive_int, default=3)
    parser.add_argument("--ff", type=positive_int, default=1024)
    parser.add_argument("--beam-sizes", type=positive_int, nargs="+", default=[1, 4])
    parser.add_argument("--max-tokens", type=positive_int, default=DecodeConfig.max_tokens)
    parser.add_argument("--repeats", type=positive_int, default=1, help="median of this many runs per cell")
    parser.add_argument("--no-recompute", action="store_true", help="only time the cached decoder")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the models decode")
    args = parser.parse_args(argv)
    device = resolve_device(args.device, "--device")
    torch.set_num_threads(args.threads)

    lines = read_lines(args.input)[: args.lines]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {args.threads} threads, {where}; {len(lines)} lines of {Path(args.input).name}; "
          f"max output length 1.5|x|+10; batches <= {args.max_tokens} source tokens; median of {args.repeats}")
    if not args.checkpoint:
        print(f"random models: d={args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, "
              f"ff {args.ff} (random weights: outputs run to the length limit, the worst case)")
    print()
    print("| model | search | cached sent/s | recompute sent/s | cached speed-up | out len (pieces) | identical |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, vocab in models(args, Path(tmp), device):
            for beam in args.beam_sizes:
                decode = dataclasses.replace(DecodeConfig(), beam_size=beam, nbest=1, max_tokens=args.max_tokens)
                translate_lines(model, vocab, lines[:8], decode=decode, device=device)  # warm-up
                cached_s, cached_out = timed(model, vocab, lines, decode, False, args.repeats, device)
                out_len = statistics.mean(len(vocab.encode(o)) for o in cached_out)
                search = "greedy" if beam == 1 else f"beam {beam}"
                if args.no_recompute:
                    print(f"| {label} | {search} | {len(lines) / cached_s:.1f} | - | - | {out_len:.1f} | - |")
                    continue
                full_s, full_out = timed(model, vocab, lines, decode, True, args.repeats, device)
                agree = sum(a == b for a, b in zip(cached_out, full_out))
                same = "yes" if agree == len(lines) else f"{agree}/{len(lines)}"
                print(f"| {label} | {search} | {len(lines) / cached_s:.1f} | {len(lines) / full_s:.1f} | "
                      f"{full_s / cached_s:.1f}x | {out_len:.1f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
