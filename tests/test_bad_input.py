"""Bad input to every command, table-driven: exit code 2, exactly one `error:` line naming the file, line or key, no
traceback, and nothing written or changed on disk (issue #18). The valid checkpoint is a tiny fixture model."""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

from rpr_mt.cli import app

FIXTURE = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
OTHER = Path(__file__).parent / "model" / "fixtures" / "old_abs_sinusoidal.pt"


class _Pickled:
    """An object that a weights_only load refuses (it would run code to rebuild it)."""


def setup(root: Path) -> dict[str, str]:
    """Files the cases refer to, by name."""
    (root / "run" / "checkpoints").mkdir(parents=True)
    shutil.copy(FIXTURE, root / "run" / "checkpoints" / "checkpoint_00000004.pt")
    (root / "run" / "metrics.jsonl").write_text('{"step": 4, "loss": 5.0}\n', encoding="utf-8")
    (root / "prepared_x").mkdir()  # a prepared data directory: its manifest lists the files prepare wrote
    (root / "prepared_x" / "manifest.json").write_text('{"files": ["spm.vocab"]}\n', encoding="utf-8")
    (root / "prepared_x" / "spm.vocab").write_text("<unk>\t0\n", encoding="utf-8")
    shutil.copy(FIXTURE, root / "model.pt")
    shutil.copy(OTHER, root / "other.pt")
    (root / "truncated.pt").write_bytes(FIXTURE.read_bytes()[:5000])
    raw = torch.load(FIXTURE, weights_only=True)
    first = next(iter(raw["model"]))
    raw["model"][first] = raw["model"][first] + 1.0  # weights changed after the checksum... (none in old files)
    raw["checksum"] = "0" * 64
    torch.save(raw, root / "flipped.pt")
    (root / "empty_run").mkdir()
    (root / "src.en").write_text("a b c\nd e\n", encoding="utf-8")
    (root / "bad.en").write_bytes(b"fine\nbroken \xff\n")
    (root / "hyp.txt").write_text("x y\n", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "ref.de").write_text("x y\nz\n", encoding="utf-8")
    (root / "ref.txt").write_text("x y\n", encoding="utf-8")
    (root / "outdir").mkdir()
    good = gzip.compress(("ein Satz\n" * 100).encode())
    (root / "corrupt.en.gz").write_bytes(good[: len(good) // 2])
    (root / "unknown.yaml").write_text("model:\n  d_modle: 8\n", encoding="utf-8")
    (root / "fine.yaml").write_text("train:\n  max_steps: 10\n", encoding="utf-8")
    (root / "dup.yaml").write_text("train:\n  seed: 1\n  seed: 2\n", encoding="utf-8")
    (root / "eps.yaml").write_text("train:\n  adam_eps: -1.0e-9\n", encoding="utf-8")
    (root / "nan.yaml").write_text("train:\n  peak_lr: .nan\n", encoding="utf-8")
    (root / "notyaml.yaml").write_text("model: [\n", encoding="utf-8")
    (root / "empty.en").write_text("", encoding="utf-8")
    (root / "bad.txt").write_bytes(b"x y\n\xc3\x28\n")
    (root / "text.pt").write_text("not a checkpoint\n", encoding="utf-8")
    (root / "not_a_run").mkdir()
    (root / "afile").write_text("x\n", encoding="utf-8")
    missing_keys = dict(raw)
    missing_keys.pop("model")
    missing_keys.pop("checksum", None)
    torch.save(missing_keys, root / "nomodel.pt")
    misfit = torch.load(FIXTURE, weights_only=True)
    misfit.pop("checksum", None)
    misfit["config"]["model"]["d_model"] = 2 * misfit["config"]["model"]["d_model"]
    torch.save(misfit, root / "misfit.pt")
    misfit = torch.load(OTHER, weights_only=True)  # an exportable model: export reads its weights
    misfit.pop("checksum", None)
    misfit["config"]["model"]["d_model"] = 2 * misfit["config"]["model"]["d_model"]
    torch.save(misfit, root / "misfit_abs.pt")
    broken_vocab = torch.load(FIXTURE, weights_only=True)  # written before checksums: nothing catches it on load
    broken_vocab.pop("checksum", None)
    broken_vocab["vocab"]["spm_model"] = torch.frombuffer(bytearray(b"not a sentencepiece model"), dtype=torch.uint8)
    torch.save(broken_vocab, root / "broken_vocab.pt")
    torch.save({"fn": _Pickled()}, root / "code.pt")
    for name, text in {
        "heads.yaml": "model:\n  d_model: 10\n  n_heads: 4\n",
        "dropout.yaml": "model:\n  dropout: 1.5\n",
        "clip.yaml": "model:\n  clip: -1\n",
        "scheme.yaml": "model:\n  positions: rotary\n",
        "tokens.yaml": "train:\n  max_tokens: 0\n",
        "list.yaml": "model: [1, 2]\n",
        "toplist.yaml": "- model\n",
        "empty.yaml": "",
        "section.yaml": "trainer:\n  seed: 1\n",
        "final.yaml": "train:\n  final_lr_fraction: -0.5\n",
        "lp.yaml": "decode:\n  length_penalty: .nan\n",
        "beam.yaml": "decode:\n  beam_size: 0\n",
        "vocab.yaml": "data:\n  vocab_size: -5\n",
        "bool.yaml": "model:\n  use_key: maybe\n",
        "runfile.yaml": f"train:\n  run_dir: {root / 'afile'}\n",
        "initfrom.yaml": f"train:\n  init_from: {root / 'nope.pt'}\n",
        "tok.yaml": "data:\n  tgt_lang: klingon\n",
    }.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "mismatch.en").write_text("a\nb\nc\n", encoding="utf-8")
    (root / "mismatch.de").write_text("a\nb\n", encoding="utf-8")
    (root / "badtrain.de").write_bytes(b"a\n\xff\xfe\nc\n")
    (root / "three.en").write_text("a\nb\nc\n", encoding="utf-8")
    (root / "empty.de").write_text("", encoding="utf-8")
    (root / "gzipped.en").write_bytes(gzip.compress(b"a\nb\nc\n"))  # gzip under a plain name
    (root / "three.en.xz").write_bytes(lzma.compress(b"a\nb\nc\n"))  # compressions that are not read
    (root / "three.en.bz2").write_bytes(bz2.compress(b"a\nb\nc\n"))
    for name, (src, tgt) in {"mismatch_files.yaml": ("mismatch.en", "mismatch.de"),
                             "gzip_files.yaml": ("gzipped.en", "three.en"),
                             "xz_files.yaml": ("three.en", "three.en.xz"),
                             "utf8_files.yaml": ("three.en", "badtrain.de"),
                             "empty_files.yaml": ("empty.en", "empty.de")}.items():
        (root / name).write_text(f"data:\n  source: files\n  output_dir: {root / 'prepared'}\n  splits:\n"
                                 f"    train: {{src: {root / src}, tgt: {root / tgt}}}\n", encoding="utf-8")
    (root / "files.yaml").write_text(f"data:\n  source: files\n  output_dir: {root / 'prepared'}\n  splits:\n"
                                     f"    train: {{src: {root / 'src.en'}, tgt: {root / 'missing.de'}}}\n",
                                     encoding="utf-8")
    # --- for the cases added second: nested config, data sources, output safety, plot, usage errors
    xl = torch.load(FIXTURE, weights_only=True)
    xl.pop("checksum", None)
    xl["config"]["model"]["positions"] = "xl"  # export refuses it from the config, before building the model
    torch.save(xl, root / "xl.pt")
    demo = root / "data" / "demo"  # the fixture checkpoints' data.output_dir, relative to the working directory
    demo.mkdir(parents=True)
    for name in ("dev.en", "dev.de", "test.en", "test.de"):
        (demo / name).write_text("a b\n", encoding="utf-8")
    (root / "config_dir.yaml").mkdir()
    (root / "notab.tsv").write_text("no tab here\n", encoding="utf-8")
    for name, text in {
        "nested.yaml": "model:\n  t5:\n    num_bucket: 8\n",
        "nested_scalar.yaml": "model:\n  xl: 5\n",
        "split_key.yaml": "data:\n  source: files\n  splits:\n    train: {srcc: a.en, tgt: a.de}\n",
        "betas.yaml": "train:\n  adam_betas: [0.9]\n",
        "fraction.yaml": "train:\n  max_steps: 10.5\n",
        "fp16.yaml": "train:\n  precision: fp16\n  device: cpu\n",
        "tab.yaml": "model:\n\td_model: 8\n",
        "pairs.yaml": "data:\n  max_train_pairs: -5\n",
        "output_file.yaml": f"data:\n  output_dir: {root / 'afile'}\n",
        "no_train.yaml": f"data:\n  output_dir: {root / 'prepared'}\n  demo_sizes: {{dev: 5}}\n",
        "multi30k.yaml": f"data:\n  source: multi30k\n  multi30k_dir: {root / 'no_multi30k'}\n"
                         f"  output_dir: {root / 'prepared'}\n",
        "tsv.yaml": f"data:\n  source: files\n  output_dir: {root / 'prepared'}\n  splits:\n"
                    f"    train: {{tsv: {root / 'notab.tsv'}}}\n",
        "dir_input.yaml": f"data:\n  source: files\n  output_dir: {root / 'prepared'}\n  splits:\n"
                          f"    train: {{src: {root / 'outdir'}, tgt: {root / 'src.en'}}}\n",
    }.items():
        (root / name).write_text(text, encoding="utf-8")
    for name, text in {"metrics_ok": b'{"step": 1, "loss": 2.0, "lr": 0.1}\n',
                       # a bad line before the last is corruption (a cut-off last line is what a kill leaves)
                       "metrics_bad": b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n{"step": 3, "loss": 1.0}\n',
                       "metrics_utf8": b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "\xff"}\n'
                                       b'{"step": 3, "loss": 1.0}\n'}.items():
        (root / name).mkdir()
        (root / name / "metrics.jsonl").write_bytes(text)
    # an average of updates 4 and 8 beside the numbered checkpoint it averages (not in run/: --which average there
    # must find none)
    from rpr_mt import checkpoint_files as ckpt

    (root / "avg_run" / "checkpoints").mkdir(parents=True)
    shutil.copy(FIXTURE, root / "avg_run" / "checkpoints" / "checkpoint_00000004.pt")
    average = ckpt.load_checkpoint(FIXTURE)
    average.update(step=8, averaged_steps=[4, 8], averaged_from=[
        str(root / "avg_run" / "checkpoints" / f"checkpoint_{step:08d}.pt") for step in (4, 8)])
    ckpt.save_checkpoint(average, root / "avg_run" / "checkpoints" / "checkpoint_avg.pt")
    # prepared data (a manifest listing its one file) with a run directory kept inside it
    (root / "used_data" / "run_in_data").mkdir(parents=True)
    (root / "used_data" / "spm.model").write_bytes(b"model")
    (root / "used_data" / "manifest.json").write_text('{"format_version": 1, "files": ["spm.model"]}\n')
    # run directories holding one of the run's own entries as the wrong kind (a file for a directory, or the reverse)
    (root / "run_ckfile").mkdir()
    (root / "run_ckfile" / "checkpoints").write_text("x\n", encoding="utf-8")
    (root / "run_cfgdir" / "config.yaml").mkdir(parents=True)
    (root / "run_metricsdir" / "metrics.jsonl").mkdir(parents=True)
    return {}


CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    # translate
    ("translate: missing checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/nope.pt"], "checkpoint not found"),
    ("translate: truncated checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/truncated.pt", "-i",
                                                   f"{r}/src.en"], "truncated.pt is corrupt or truncated"),
    ("translate: checksum mismatch", lambda r: ["translate", "--checkpoint", f"{r}/flipped.pt", "-i", f"{r}/src.en"],
     "flipped.pt is corrupt: its tensors differ"),
    ("translate: output is a directory", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                    "-o", f"{r}/outdir"], "outdir is a directory"),
    ("translate: output directory missing", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                       f"{r}/src.en", "-o", f"{r}/no/out.de"], "does not exist"),
    ("translate: input missing", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/nope.en"],
     "nope.en: file not found"),
    ("translate: invalid UTF-8", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/bad.en"],
     "bad.en: line 2: invalid UTF-8"),
    ("translate: corrupt gzip", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/corrupt.en.gz"],
     "corrupt.en.gz: cannot read"),
    ("translate: bad --which", lambda r: ["translate", "--checkpoint", f"{r}/run", "--which", "newest"], "--which"),
    ("translate: nbest above beam", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                               "--beam-size", "2", "--nbest", "3"], "nbest"),
    ("translate: run without checkpoints", lambda r: ["translate", "--checkpoint", f"{r}/empty_run"], "empty_run"),
    # eval-bleu
    ("eval-bleu: mismatched lines", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/ref.de"],
     "line-aligned"),
    ("eval-bleu: missing reference", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/nope.de"],
     "nope.de: file not found"),
    ("eval-bleu: no language", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/ref.txt"],
     "pass --lang"),
    ("eval-bleu: empty hypotheses", lambda r: ["eval-bleu", "--hyp", f"{r}/empty.txt", "--ref", f"{r}/ref.txt",
                                               "--lang", "de"], "empty"),
    ("eval-bleu: both modes", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--checkpoint", f"{r}/model.pt"],
     "--hyp goes with --ref, not with --checkpoint"),
    ("eval-bleu: --save-hyp is a directory", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt", "--save-hyp",
                                                        f"{r}/outdir"], "outdir is a directory"),
    ("eval-bleu: neither mode", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt"], "give --hyp and --ref"),
    # average-checkpoints
    ("average: numbered output name", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                 f"{r}/run/checkpoints/checkpoint_00000008.pt"], "reserved"),
    ("average: no numbered checkpoints", lambda r: ["average-checkpoints", f"{r}/empty_run"], "no numbered checkpoints"),
    ("average: --last 0", lambda r: ["average-checkpoints", f"{r}/run", "--last", "0"], "--last must be >= 1"),
    ("average: files without --output", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/model.pt"],
     "--output is required"),
    ("average: different models", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/other.pt", "-o",
                                             f"{r}/avg.pt"], "different model config"),
    ("average: output in a missing directory", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                          f"{r}/no/avg.pt"], "does not exist"),
    # train and prepare: the config
    ("train: missing config", lambda r: ["train", "--config", f"{r}/nope.yaml"], "config file not found"),
    ("train: unknown key", lambda r: ["train", "--config", f"{r}/unknown.yaml"], "did you mean 'model.d_model'"),
    ("train: duplicate key", lambda r: ["train", "--config", f"{r}/dup.yaml"], "duplicate key 'seed'"),
    # a value out of range names the file and line, or the --set, that gave it, and which key is wrong
    ("train: negative epsilon", lambda r: ["train", "--config", f"{r}/eps.yaml"],
     "eps.yaml: line 2: train.adam_eps must be positive"),
    ("train: NaN learning rate", lambda r: ["train", "--config", f"{r}/nan.yaml"],
     "nan.yaml: line 2: train.peak_lr must be a finite number (got .nan)"),
    ("train: --set max_steps 0", lambda r: ["train", "--config", f"{r}/fine.yaml", "--set", "train.max_steps=0"],
     "error: --set train.max_steps=0: train.max_steps must be positive"),
    ("train: --set a negative lr_scale", lambda r: ["train", "--set", "train.lr_scale=-2"],
     "error: --set train.lr_scale=-2: train.lr_scale must be positive (got -2.0)"),
    ("train: invalid YAML", lambda r: ["train", "--config", f"{r}/notyaml.yaml"], "invalid YAML"),
    ("train: bad --set", lambda r: ["train", "--set", "train.max_steps"], "section.key=value"),
    ("train: mistyped --set", lambda r: ["train", "--set", "train.max_step=3"], "did you mean 'train.max_steps'"),
    ("train: wrong type", lambda r: ["train", "--set", "model.d_model=big"], "model.d_model must be an integer"),
    ("train: negative weight decay", lambda r: ["train", "--set", "train.weight_decay=-1"], "train.weight_decay"),
    ("train: odd rope head", lambda r: ["train", "--set", "model.positions=rope", "--set", "model.d_model=12",
                                       "--set", "model.n_heads=4"], "even head dimension"),
    ("prepare: missing input file", lambda r: ["prepare", "--config", f"{r}/files.yaml"], "missing.de"),
    # export
    ("export: per-head Shaw tables", lambda r: ["export", f"{r}/model.pt", "--output", f"{r}/ct2"],
     "share_across_heads=true"),
    ("export: missing checkpoint", lambda r: ["export", f"{r}/nope.pt", "--output", f"{r}/ct2"], "checkpoint not found"),
    # --- more cases: checkpoints of the wrong kind, decoding options, every config class, data, plot, export
    ("translate: not a checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/text.pt", "-i", f"{r}/src.en"],
     "text.pt is not a checkpoint"),
    ("translate: checkpoint with code", lambda r: ["translate", "--checkpoint", f"{r}/code.pt", "-i", f"{r}/src.en"],
     "code.pt holds more than weights"),
    ("translate: checkpoint without weights", lambda r: ["translate", "--checkpoint", f"{r}/nomodel.pt", "-i",
                                                         f"{r}/src.en"], "nomodel.pt"),
    ("translate: weights that do not fit the config", lambda r: ["translate", "--checkpoint", f"{r}/misfit.pt", "-i",
                                                                 f"{r}/src.en"], "misfit.pt"),
    ("translate: a broken vocabulary inside the checkpoint", lambda r: ["translate", "--checkpoint",
                                                                       f"{r}/broken_vocab.pt", "-i", f"{r}/src.en"],
     "broken_vocab.pt: its vocabulary is broken"),
    ("export: weights that do not fit the config", lambda r: ["export", f"{r}/misfit_abs.pt", "--output", f"{r}/ct2"],
     "misfit_abs.pt: its weights do not fit the model its config describes"),
    ("translate: directory that is not a run", lambda r: ["translate", "--checkpoint", f"{r}/not_a_run"],
     "not_a_run"),
    ("translate: input is a directory", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                   f"{r}/outdir"], "outdir is a directory; give a text file"),
    ("translate: empty input", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/empty.en"],
     "empty.en"),
    ("translate: beam size 0", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                          "--beam-size", "0"], "--beam-size"),
    ("translate: max tokens 0", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                           "--max-tokens", "0"], "--max-tokens"),
    ("translate: negative length penalty", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                      f"{r}/src.en", "--length-penalty", "-1"], "length"),
    ("translate: unknown device", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                             "--device", "tpu"], "--device"),
    ("eval-bleu: invalid UTF-8 hypotheses", lambda r: ["eval-bleu", "--hyp", f"{r}/bad.txt", "--ref", f"{r}/ref.de"],
     "bad.txt: line 2: invalid UTF-8"),
    ("eval-bleu: missing hypotheses", lambda r: ["eval-bleu", "--hyp", f"{r}/nope.txt", "--ref", f"{r}/ref.de"],
     "nope.txt: file not found"),
    ("eval-bleu: unknown language", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/ref.txt",
                                               "--lang", "klingon"], "klingon"),
    ("eval-bleu: truncated checkpoint", lambda r: ["eval-bleu", "--checkpoint", f"{r}/truncated.pt"],
     "truncated.pt is corrupt or truncated"),
    ("average: a truncated input", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/truncated.pt", "-o",
                                              f"{r}/avg.pt"], "truncated.pt"),
    ("average: output is a directory", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                  f"{r}/outdir"], "outdir is a directory"),
    ("average: missing input", lambda r: ["average-checkpoints", f"{r}/nope.pt", f"{r}/model.pt", "-o",
                                          f"{r}/avg.pt"], "nope.pt"),
    ("train: run_dir below a file", lambda r: ["train", "--set", f"train.run_dir={r}/afile/run", "--set",
                                               f"data.output_dir={r}/data", "--set", "data.source=demo"],
     "afile/run cannot be created"),
    ("train: heads do not divide d_model", lambda r: ["train", "--config", f"{r}/heads.yaml"], "n_heads"),
    ("train: dropout above 1", lambda r: ["train", "--config", f"{r}/dropout.yaml"], "model.dropout"),
    ("train: negative clip", lambda r: ["train", "--config", f"{r}/clip.yaml"], "model.clip"),
    ("train: unknown scheme", lambda r: ["train", "--config", f"{r}/scheme.yaml"], "model.positions"),
    ("train: max tokens 0", lambda r: ["train", "--config", f"{r}/tokens.yaml"], "train.max_tokens"),
    ("train: section is a list", lambda r: ["train", "--config", f"{r}/list.yaml"], "model"),
    ("train: config is a list", lambda r: ["train", "--config", f"{r}/toplist.yaml"], "toplist.yaml"),
    ("train: empty config", lambda r: ["train", "--config", f"{r}/empty.yaml"], "empty.yaml"),
    ("train: unknown section", lambda r: ["train", "--config", f"{r}/section.yaml"], "trainer"),
    ("train: negative final lr fraction", lambda r: ["train", "--config", f"{r}/final.yaml"],
     "train.final_lr_fraction"),
    ("train: NaN length penalty", lambda r: ["train", "--config", f"{r}/lp.yaml"], "decode.length_penalty"),
    ("train: beam size 0", lambda r: ["train", "--config", f"{r}/beam.yaml"], "decode.beam_size"),
    ("train: negative vocabulary", lambda r: ["train", "--config", f"{r}/vocab.yaml"], "data.vocab_size"),
    ("train: not a boolean", lambda r: ["train", "--config", f"{r}/bool.yaml"], "model.use_key"),
    ("train: run_dir is a file", lambda r: ["train", "--config", f"{r}/runfile.yaml"], "afile"),
    ("train: init_from missing", lambda r: ["train", "--config", f"{r}/initfrom.yaml"], "nope.pt"),
    ("train: unknown BLEU tokenizer", lambda r: ["train", "--config", f"{r}/tok.yaml"], "klingon"),
    ("prepare: mismatched parallel files", lambda r: ["prepare", "--config", f"{r}/mismatch_files.yaml"],
     "mismatch"),
    ("prepare: invalid UTF-8 in training data", lambda r: ["prepare", "--config", f"{r}/utf8_files.yaml"],
     "badtrain.de: line 2: invalid UTF-8"),
    ("prepare: empty training data", lambda r: ["prepare", "--config", f"{r}/empty_files.yaml"], "empty"),
    # compressed bytes read as text gave a wrong line count ("has 66 lines but ... 96") or invalid UTF-8
    ("prepare: gzip without .gz", lambda r: ["prepare", "--config", f"{r}/gzip_files.yaml"],
     "gzipped.en is gzip-compressed but its name does not end in .gz"),
    # xz and bzip2 read as text: "invalid UTF-8" at some line
    ("prepare: xz input", lambda r: ["prepare", "--config", f"{r}/xz_files.yaml"],
     "three.en.xz is xz-compressed: rpr-mt reads plain text or gzip (.gz); unxz three.en.xz and give it"),
    ("translate: empty output path", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                "-o", ""], "--output: an empty path"),
    # Path("") is ".": an empty path was reported as a directory, or as "no checkpoint_best.pt in ."
    ("translate: empty checkpoint path", lambda r: ["translate", "--checkpoint", "", "-i", f"{r}/src.en"],
     "error: --checkpoint: an empty path"),
    ("translate: empty input path", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", ""],
     "error: --input: an empty path"),
    ("eval-bleu: empty --ref path", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt", "--ref", ""],
     "error: --ref: an empty path"),
    ("export: empty checkpoint path", lambda r: ["export", "", "-o", f"{r}/ct2"], "error: CHECKPOINT: an empty path"),
    ("average: empty input path", lambda r: ["average-checkpoints", "", f"{r}/model.pt", "-o", f"{r}/avg.pt"],
     "error: INPUTS: an empty path"),
    ("plot: empty output path", lambda r: ["plot", f"{r}/empty_run", "-o", ""], "error: --output: an empty path"),
    ("train: empty config path", lambda r: ["train", "--config", ""], "error: --config: an empty path"),
    ("translate: gzip without .gz", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/gzipped.en"],
     "gzipped.en is gzip-compressed but its name does not end in .gz"),
    ("translate: bzip2 input", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/three.en.bz2"],
     "three.en.bz2 is bzip2-compressed: rpr-mt reads plain text"),
    ("plot: run without metrics", lambda r: ["plot", f"{r}/empty_run"], "metrics.jsonl"),
    ("plot: missing run", lambda r: ["plot", f"{r}/nope_run"], "nope_run"),
    ("export: unknown quantization", lambda r: ["export", f"{r}/model.pt", "--output", f"{r}/ct2", "--quantization",
                                                "int3"], "--quantization"),
    ("export: truncated checkpoint", lambda r: ["export", f"{r}/truncated.pt", "--output", f"{r}/ct2"],
     "truncated.pt is corrupt or truncated"),
    # --- added second: outputs that would replace an input or a checkpoint
    ("translate: output is the input", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                  "-o", f"{r}/src.en"], "src.en is also an input"),
    ("translate: output is the checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                       f"{r}/src.en", "-o", f"{r}/model.pt"], "model.pt is also an input"),
    ("translate: output over a training checkpoint", lambda r: [
        "translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en", "-o",
        f"{r}/run/checkpoints/checkpoint_00000004.pt"], "checkpoint_00000004.pt is a checkpoint"),
    # translations written over a run's learning curves or a prepared file, with exit 0
    ("translate: output over a run's metrics", lambda r: [
        "translate", "--checkpoint", f"{r}/run", "-i", f"{r}/src.en", "-o", f"{r}/run/metrics.jsonl"],
     "metrics.jsonl is the metrics.jsonl of the run in"),
    ("average: output over a run's metrics", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/other.pt", "-o",
                                                        f"{r}/run/metrics.jsonl"], "is the metrics.jsonl of the run in"),
    ("eval-bleu: --hyp and --ref both stdin", lambda r: ["eval-bleu", "--hyp", "-", "--ref", "-", "--lang", "de"],
     "--hyp and --ref cannot both be stdin"),
    ("eval-bleu: --save-hyp over prepared data", lambda r: [
        "eval-bleu", "--checkpoint", f"{r}/model.pt", "--save-hyp", f"{r}/prepared_x/spm.vocab"],
     "spm.vocab is a file of the prepared data in"),
    ("eval-bleu: --save-hyp is the reference", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt", "--ref",
                                                          f"{r}/ref.de", "--save-hyp", f"{r}/ref.de"],
     "ref.de is also an input"),
    ("eval-bleu: --ref not aligned with the split", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt",
                                                              "--ref", f"{r}/ref.de"],  # before decoding, not after
     "ref.de has 2 lines but"),
    ("eval-bleu: --save-hyp is the split's reference", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt",
                                                                  "--save-hyp", "data/demo/test.de"],
     "test.de is also an input"),
    ("eval-bleu: --save-hyp over a checkpoint", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt",
                                                           "--save-hyp", f"{r}/other.pt"], "other.pt is a checkpoint"),
    ("eval-bleu: --save-hyp without --checkpoint", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref",
                                                              f"{r}/ref.txt", "--lang", "de", "--save-hyp",
                                                              f"{r}/out.txt"], "--save-hyp goes with --checkpoint"),
    ("eval-bleu: --no-split without --checkpoint", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref",
                                                             f"{r}/ref.txt", "--lang", "de", "--no-split"],
     "--no-split goes with --checkpoint"),
    ("eval-bleu: --split-sentences without --checkpoint", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref",
                                                                    f"{r}/ref.txt", "--lang", "de",
                                                                    "--split-sentences"],
     "--split-sentences goes with --checkpoint"),
    ("average: output over the best checkpoint", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                            f"{r}/run/checkpoints/checkpoint_best.pt"],
     "checkpoint_best.pt is reserved"),
    ("average: output is an input", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/model.pt", "-o",
                                               f"{r}/model.pt"], "model.pt is also an input"),
    ("export: output under a file", lambda r: ["export", f"{r}/other.pt", "--output", f"{r}/afile/deeper/ct2"],
     "afile is not a directory"),
    ("export: output is an existing file", lambda r: ["export", f"{r}/other.pt", "--output", f"{r}/afile"],
     "afile exists and is not a CTranslate2 model directory; refusing to replace it (even with --force)"),
    ("export: --force over a run", lambda r: ["export", f"{r}/model.pt", "--output", f"{r}/run", "--force"],
     "not a CTranslate2 model directory"),
    # --- added second: plot
    ("plot: invalid UTF-8 in metrics", lambda r: ["plot", f"{r}/metrics_utf8"], "line 2: invalid UTF-8"),
    ("plot: a broken metrics line", lambda r: ["plot", f"{r}/metrics_bad"], "line 2 is not a metrics record"),
    ("plot: output is a directory", lambda r: ["plot", f"{r}/metrics_ok", "-o", f"{r}/outdir"],
     "outdir is a directory"),
    ("plot: output directory missing", lambda r: ["plot", f"{r}/metrics_ok", "-o", f"{r}/no/curves.png"],
     "does not exist"),
    ("plot: unknown image format", lambda r: ["plot", f"{r}/metrics_ok", "-o", f"{r}/curves.xyz"], "image format"),
    # --- added second: kinds of checkpoint and model
    ("average: a text file among the inputs", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/text.pt", "-o",
                                                         f"{r}/avg.pt"], "text.pt is not a checkpoint"),
    ("export: refused pickled code", lambda r: ["export", f"{r}/code.pt", "--output", f"{r}/ct2"],
     "Unsupported global"),
    ("export: a model CTranslate2 cannot hold", lambda r: ["export", f"{r}/xl.pt", "--output", f"{r}/ct2"],
     "model.positions=xl cannot be exported"),
    ("export: --which average without one", lambda r: ["export", f"{r}/run", "--output", f"{r}/ct2", "--which",
                                                       "average"], "no checkpoint_avg.pt"),
    ("translate: --which average without one", lambda r: ["translate", "--checkpoint", f"{r}/run", "--which",
                                                          "average"], "no checkpoint_avg.pt"),
    ("translate: a checkpoint as input text", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                         f"{r}/model.pt"], "model.pt is a PyTorch checkpoint, not text"),
    ("translate: nbest 0", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en", "--nbest",
                                      "0"], "--nbest"),
    ("translate: NaN length penalty", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                 "--length-penalty", "nan"], "--length-penalty must be a finite"),
    ("translate: negative min length", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                  "--min-length", "-1"], "--min-length must be >= 0"),
    ("eval-bleu: unknown split", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt", "--split", "valid"],
     "no such split (it has dev, test)"),
    ("eval-bleu: invalid UTF-8 reference", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref",
                                                      f"{r}/bad.txt", "--lang", "de"], "bad.txt: line 2: invalid UTF-8"),
    ("eval-bleu: reference is a directory", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/outdir",
                                                       "--lang", "de"], "outdir is a directory; give a text file"),
    # --- added second: usage errors (click's framed block before) are one line too
    ("usage: value of the wrong type", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "--beam-size",
                                                  "four"], "'--beam-size'"),
    ("usage: unknown option", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "--beem", "4"],
     "No such option: --beem"),
    ("usage: missing option", lambda r: ["translate"], "Missing option '--checkpoint'"),
    ("usage: unknown command", lambda r: ["trian"], "No such command 'trian'"),
    ("usage: a flag given a value", lambda r: ["train", "--dry-run=true"], "does not take a value"),
    ("usage: an option missing its value", lambda r: ["train", "--set"],
     "train: Option '--set' requires an argument"),
    # --- added second: config at nested levels, types, and train's checks before work
    ("train: config is a directory", lambda r: ["train", "--config", f"{r}/config_dir.yaml"], "is a directory"),
    ("train: unknown nested key", lambda r: ["train", "--config", f"{r}/nested.yaml"],
     "did you mean 'model.t5.num_buckets'"),
    ("train: nested section is a number", lambda r: ["train", "--config", f"{r}/nested_scalar.yaml"],
     "model.xl must be a mapping"),
    ("train: unknown key in a split", lambda r: ["train", "--config", f"{r}/split_key.yaml"],
     "did you mean 'data.splits.train.src'"),
    ("train: pair of the wrong length", lambda r: ["train", "--config", f"{r}/betas.yaml"],
     "train.adam_betas must be a list of 2 values in brackets ([a, b])"),
    ("train: fraction where an integer is due", lambda r: ["train", "--config", f"{r}/fraction.yaml"],
     "train.max_steps must be an integer"),
    ("train: fp16 on CPU", lambda r: ["train", "--config", f"{r}/fp16.yaml"], "'fp16' needs CUDA"),
    ("train: tab in YAML", lambda r: ["train", "--config", f"{r}/tab.yaml"], "line 2 invalid YAML"),
    ("train: negative max_train_pairs", lambda r: ["train", "--config", f"{r}/pairs.yaml"],
     "data.max_train_pairs must be positive"),
    ("train: --set below a value", lambda r: ["train", "--set", "model.d_model.x=1"],
     "--set model.d_model.x=1: model.d_model is a value, not a section"),
    ("train: --set a value to a section", lambda r: ["train", "--set", "model.t5=3"],
     "--set model.t5=3: model.t5 is a section, not a value"),
    ("train: --set unknown section", lambda r: ["train", "--set", "modle.d_model=8"], "did you mean 'model'"),
    ("train: --more-steps without checkpoints", lambda r: ["train", "--set", f"train.run_dir={r}/fresh",
                                                           "--more-steps", "3"], "no checkpoint to continue"),
    ("train: --more-steps on a budget run", lambda r: ["train", "--set", f"train.run_dir={r}/run", "--set",
                                                       "train.lr_schedule=budget", "--set", "train.max_time=60",
                                                       "--more-steps", "3"], "'budget' schedule"),
    # --- added second: prepare's sources
    ("prepare: output_dir is a file", lambda r: ["prepare", "--config", f"{r}/output_file.yaml"],
     "does not hold prepared data"),
    ("prepare: demo without a train split", lambda r: ["prepare", "--config", f"{r}/no_train.yaml"],
     "data.demo_sizes must have a 'train' entry"),
    ("prepare: missing multi30k_dir", lambda r: ["prepare", "--config", f"{r}/multi30k.yaml"],
     "data.multi30k_dir not found"),
    # the shipped configs' ../shared/data/multi30k, run from another directory: where it was looked for
    ("prepare: relative multi30k_dir", lambda r: ["prepare", "--config", f"{r}/multi30k.yaml", "--set",
                                                  "data.multi30k_dir=no_such/multi30k"],
     "data.multi30k_dir not found: no_such/multi30k (that is "),
    ("prepare: TSV line without a tab", lambda r: ["prepare", "--config", f"{r}/tsv.yaml"],
     "notab.tsv:1: expected exactly one tab"),
    ("prepare: the same file as src and tgt", lambda r: ["prepare", "--config", f"{r}/files.yaml", "--set",
                                                         f"data.splits.train.tgt={r}/src.en"],
     "data.splits.train: src and tgt are the same file"),
    # data.source is demo by default: the directory was ignored and the synthetic corpus prepared without a word
    ("prepare: multi30k_dir without source multi30k", lambda r: ["prepare", "--set", f"data.multi30k_dir={r}",
                                                                "--set", f"data.output_dir={r}/prepared"],
     "data.multi30k_dir is read only when data.source is multi30k (it is demo)"),
    # the local files were prepared; the demo's split sizes and seed, which the user may think apply, changed nothing
    ("prepare: demo_sizes under source files", lambda r: ["prepare", "--config", f"{r}/files.yaml", "--set",
                                                          "data.demo_sizes.train=100"],
     "data.demo_sizes is read only when data.source is demo (it is files)"),
    ("train: demo_seed under source multi30k", lambda r: ["train", "--config", f"{r}/multi30k.yaml", "--set",
                                                          "data.demo_seed=7"],
     "data.demo_seed is read only when data.source is demo (it is multi30k)"),
    # train prepares the data first: it said "preparing DIR (why)" (and before that "needs preparing") before these
    ("train: missing input file", lambda r: ["train", "--config", f"{r}/files.yaml"], "missing.de"),
    ("train: input is a directory", lambda r: ["train", "--config", f"{r}/dir_input.yaml"], "outdir"),
    ("train: mismatched parallel files", lambda r: ["train", "--config", f"{r}/mismatch_files.yaml"],
     "mismatch.en has 3 lines but"),
    ("train: invalid UTF-8 in training data", lambda r: ["train", "--config", f"{r}/utf8_files.yaml"],
     "badtrain.de: line 2: invalid UTF-8"),
    ("prepare: input is a directory", lambda r: ["prepare", "--config", f"{r}/dir_input.yaml"],
     "input is not a file"),
    # --- added third (issue #31): path problems are said before naming conventions and before other options
    ("eval-bleu: reference directory, no --lang", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref",
                                                            f"{r}/outdir"], "outdir is a directory; give a text file"),
    ("eval-bleu: missing reference, no language in its name", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt",
                                                                        "--ref", f"{r}/nope.txt"],
     "nope.txt: file not found"),
    ("eval-bleu: hypotheses are a directory", lambda r: ["eval-bleu", "--hyp", f"{r}/outdir", "--ref",
                                                         f"{r}/ref.txt"], "outdir is a directory; give a text file"),
    ("eval-bleu: missing reference with --checkpoint", lambda r: ["eval-bleu", "--checkpoint", f"{r}/truncated.pt",
                                                                  "--ref", f"{r}/nope.de"],
     "nope.de: file not found"),
    ("translate: missing input before the checkpoint loads", lambda r: ["translate", "--checkpoint",
                                                                        f"{r}/truncated.pt", "-i", f"{r}/nope.en"],
     "nope.en: file not found"),
    ("average: missing run with --last", lambda r: ["average-checkpoints", f"{r}/nope_run", "--last", "2"],
     "nope_run does not exist"),
    ("average: a run directory among files", lambda r: ["average-checkpoints", f"{r}/run", f"{r}/model.pt", "-o",
                                                       f"{r}/avg.pt"], "run is a directory: give one run directory"),
    ("average: output is an existing text file", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                           f"{r}/hyp.txt"],
     "hyp.txt exists and is not an rpr-mt checkpoint; refusing to replace it (even with --force)"),
    ("average: --force over a text file", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                     f"{r}/hyp.txt", "--force"], "is not an rpr-mt checkpoint"),
    ("average: a file listed twice", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/model.pt", "-o",
                                                f"{r}/avg.pt"], "model.pt is listed twice"),
    ("average: a copy listed beside it", lambda r: ["average-checkpoints", f"{r}/model.pt",
                                                    f"{r}/run/checkpoints/checkpoint_00000004.pt", "-o", f"{r}/avg.pt"],
     "are the same checkpoint"),
    ("average: an average among the inputs", lambda r: ["average-checkpoints",
                                                       f"{r}/avg_run/checkpoints/checkpoint_00000004.pt",
                                                       f"{r}/avg_run/checkpoints/checkpoint_avg.pt", "-o",
                                                       f"{r}/avg.pt"],
     "checkpoint_avg.pt is already an average (2 checkpoints: checkpoint_00000004.pt .. checkpoint_00000008.pt)"),
    # a bad --set value is the override's error, not the config file's (which was blamed for it)
    ("train: --set a word to an integer", lambda r: ["train", "--config", f"{r}/fine.yaml", "--set", "model.clip=abc"],
     "error: --set model.clip=abc: model.clip must be an integer, got abc"),
    ("train: --set maybe to a bool", lambda r: ["train", "--config", f"{r}/fine.yaml", "--set",
                                               "train.valid_bleu=maybe"],
     "error: --set train.valid_bleu=maybe: train.valid_bleu must be true or false"),
    ("train: --set an unknown choice", lambda r: ["train", "--config", f"{r}/fine.yaml", "--set",
                                                 "model.positions=relatve"],
     "error: --set model.positions=relatve: model.positions must be one of"),
    # rebuilding replaces the directory whole: a run kept inside it was deleted with it, --force or not
    ("prepare: output_dir holds a run directory", lambda r: ["prepare", "--set", f"data.output_dir={r}/used_data",
                                                            "--force"],
     "holds run_in_data, which `rpr-mt prepare` did not write"),
    ("train: --set a word to a mapping entry", lambda r: ["train", "--config", f"{r}/fine.yaml", "--set",
                                                         "data.demo_sizes.train=many"],
     "error: --set data.demo_sizes.train=many: data.demo_sizes.train must be an integer"),
    # the run's own entries of the wrong kind ended the run in a traceback at its first log line, validation or save
    ("train: checkpoints is a file", lambda r: ["train", "--set", f"train.run_dir={r}/run_ckfile", "--set",
                                                f"data.output_dir={r}/data"],
     "run_ckfile/checkpoints is not a directory, but the run writes its checkpoints directory there"),
    ("train: config.yaml is a directory", lambda r: ["train", "--set", f"train.run_dir={r}/run_cfgdir", "--set",
                                                     f"data.output_dir={r}/data"],
     "run_cfgdir/config.yaml is a directory, but the run writes its config.yaml file there"),
    ("train: metrics.jsonl is a directory", lambda r: ["train", "--set", f"train.run_dir={r}/run_metricsdir", "--set",
                                                       f"data.output_dir={r}/data"],
     "run_metricsdir/metrics.jsonl is a directory, but the run writes its metrics.jsonl file there"),
]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


class _ToCurrentStderr(logging.Handler):
    """rpr_mt's log lines to whatever sys.stderr is when they are emitted: the CLI shows them on stderr, but under
    pytest its handler is pytest's, so lines logged before an error ("preparing DIR (why)") were not counted."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(self.format(record) + "\n")


@pytest.fixture
def log_lines_on_stderr():
    logger, handler = logging.getLogger("rpr_mt"), _ToCurrentStderr()
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)


@pytest.mark.parametrize("name, args, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, monkeypatch, log_lines_on_stderr, name, args, fragment):
    setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, args(tmp_path))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith(("loaded ", "warning"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert snapshot(tmp_path) == before, "a failed command changed the disk"
