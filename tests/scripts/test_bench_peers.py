"""benchmarks/bench_peers.py's pure parts: each toolkit's settings, the parsers of their logs and outputs, the piece
text round trip and the table row. The runs themselves need the peers' virtual environments and an hour each
(results/peers/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm
import yaml

from rpr_mt.config import load_config
from rpr_mt.errors import UserError

from . import load_script

peers = load_script("benchmarks/bench_peers.py")


def pairs(args: list[str]) -> dict[str, str]:
    """--option value pairs of a command line (flags map to "")."""
    found, i = {}, 0
    while i < len(args):
        if args[i].startswith("--"):
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            found[args[i]] = args[i + 1] if has_value else ""
            i += 2 if has_value else 1
        else:
            i += 1
    return found


def test_onmt_config_is_transformer_tiny_with_shaw_k16_and_the_literature_peak_rate(tmp_path):
    config = peers.onmt_config(tmp_path / "work", tmp_path / "run", max_updates=None, save_every=None)
    assert yaml.safe_load(yaml.safe_dump(config)) == config  # what onmt_train reads is what was built
    assert (config["enc_layers"], config["dec_layers"], config["hidden_size"], config["word_vec_size"],
            config["transformer_ff"], config["heads"], config["dropout"]) == (4, 4, 128, 128, 256, 4, [0.3])
    assert config["max_relative_positions"] == 16 and config["position_encoding"] is False
    assert config["share_embeddings"] and config["share_vocab"]
    # noam's peak, at the end of warm-up: learning_rate * d^-0.5 * warmup^-0.5 = the literature's 5e-3
    peak = config["learning_rate"] * 128 ** -0.5 * config["warmup_steps"] ** -0.5
    assert config["decay_method"] == "noam" and config["warmup_steps"] == 2000 and peak == pytest.approx(5e-3, rel=1e-3)
    assert (config["batch_type"], config["batch_size"], config["label_smoothing"]) == ("tokens", 4096, 0.1)
    assert config["train_steps"] == 1_000_000 and config["save_checkpoint_steps"] == 100
    assert config["data"]["corpus_1"]["path_tgt"] == str(tmp_path / "work" / "pieces" / "train.de")
    assert config["save_model"] == str(tmp_path / "run" / "model")
    smoke = peers.onmt_config(tmp_path, tmp_path, max_updates=60, save_every=20)
    assert (smoke["train_steps"], smoke["save_checkpoint_steps"]) == (60, 20)


def test_fairseq_arguments_are_the_literature_recipe_with_the_budget_as_its_stop_time(tmp_path):
    args = peers.fairseq_train_args(tmp_path / "bin", tmp_path / "ckpt", minutes=60, max_updates=None)
    assert args[0] == str(tmp_path / "bin")
    options = pairs(args)
    assert {k: options[k] for k in ("--lr", "--warmup-updates", "--max-tokens", "--label-smoothing", "--dropout",
                                    "--lr-scheduler", "--criterion", "--keep-last-epochs", "--stop-time-hours")} == {
        "--lr": "0.005", "--warmup-updates": "2000", "--max-tokens": "4096", "--label-smoothing": "0.1",
        "--dropout": "0.3", "--lr-scheduler": "inverse_sqrt", "--criterion": "label_smoothed_cross_entropy",
        "--keep-last-epochs": "10", "--stop-time-hours": "1.000000"}
    assert {k: options[k] for k in ("--encoder-layers", "--decoder-layers", "--encoder-embed-dim",
                                    "--encoder-ffn-embed-dim", "--encoder-attention-heads")} == {
        "--encoder-layers": "4", "--decoder-layers": "4", "--encoder-embed-dim": "128",
        "--encoder-ffn-embed-dim": "256", "--encoder-attention-heads": "4"}
    assert "--share-all-embeddings" in options and "--cpu" in options and "--max-update" not in options
    smoke = pairs(peers.fairseq_train_args(tmp_path, tmp_path, minutes=3, max_updates=60))
    assert smoke["--max-update"] == "60" and smoke["--stop-time-hours"] == "0.050000"


@pytest.mark.parametrize("toolkit, precision, steps", [("rpr-mt-fp32", "fp32", 6000), ("rpr-mt-bf16", "bf16", 8500)])
def test_rpr_mt_arguments_are_the_recipe_with_the_budget_as_max_time(toolkit, precision, steps, tmp_path):
    args = peers.rpr_mt_train_args(toolkit, tmp_path / "work", tmp_path / "run", tmp_path / "m30k", minutes=60,
                                   max_updates=None, save_every=None)
    assert args[:3] == ["train", "--config", str(peers.RECIPES[toolkit])]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = load_config(args[2], sets)  # every key is one rpr-mt knows
    assert cfg.train.max_time == 3600 and cfg.train.max_steps == steps and cfg.train.precision == precision
    assert Path(cfg.train.run_dir) == tmp_path / "run" and Path(cfg.data.output_dir) == tmp_path / "work" / "data"
    assert cfg.train.average_last == 10 and cfg.decode.beam_size == 5
    smoke = peers.rpr_mt_train_args(toolkit, tmp_path, tmp_path, tmp_path, minutes=3, max_updates=40, save_every=20)
    cfg = load_config(args[2], [smoke[i + 1] for i, a in enumerate(smoke) if a == "--set"])
    assert (cfg.train.max_time, cfg.train.max_steps, cfg.train.save_every) == (180, 40, 20)


def test_onmt_log_gives_updates_and_target_tokens_from_bsz():
    log = [
        "[2026-12-06 06:50:23,325 INFO] Saving checkpoint /tmp/smoke/onmt/model_step_20.pt",
        "[2026-12-06 06:51:33,799 INFO] Step 50/   60; acc: 3.6; ppl: 6519.5; xent: 8.8; lr: 0.00013; sents:   13154; "
        "bsz: 3310/3638/263; 957/1052 tok/s;    173 sec;",
        "[2026-12-06 06:52:33,799 INFO] Step 100/1000000; acc: 9.1; ppl: 900.1; xent: 6.8; lr: 0.00025; "
        "sents:   13000; "
        "bsz: 3300/3600/260; 1957/2052 tok/s;    233 sec;",
    ]
    progress = peers.parse_onmt_log(log)
    assert progress.updates == 100 and progress.tgt_tokens == 3638 * 50 + 3600 * 50


def test_fairseq_log_gives_updates_and_target_tokens_from_the_epoch_summaries():
    log = [
        '2026-12-06 06:55:00 | INFO | train_inner | {"epoch": 1, "update": 0.4, "loss": "13", "wpb": "9999", '
        '"num_updates": "50"}',
        '2026-12-06 06:55:58 | INFO | train | {"epoch": 1, "train_loss": "12.831", "train_wpb": "3457.4", '
        '"train_num_updates": "120", "train_wall": "189"}',
        "2026-12-06 06:55:58 | INFO | fairseq_cli.train | done training in 188.6 seconds",
        '2026-12-06 06:57:58 | INFO | train | {"epoch": 2, "train_wpb": "3400", "train_num_updates": "162"}',
    ]
    progress = peers.parse_fairseq_log(log)
    assert progress.updates == 162 and progress.tgt_tokens == pytest.approx(3457.4 * 120 + 3400 * 42)


def test_rpr_mt_metrics_give_rate_times_window_seconds_and_skip_validation_records():
    records = [{"step": 100, "tgt_tok_s": 1000.0, "elapsed": 10.0},
               {"step": 100, "dev_bleu": 1.5},
               {"step": 200, "tgt_tok_s": 2000.0, "elapsed": 15.0}]
    progress = peers.parse_rpr_mt_metrics(json.dumps(r) for r in records)
    assert progress.updates == 200 and progress.tgt_tokens == 1000 * 10 + 2000 * 5


def test_rpr_mt_stop_reason_is_read_from_its_last_line():
    log = ["update 100 | epoch 1 | loss 9.5", "averaged 10 checkpoints into runs/x/checkpoints/checkpoint_avg.pt",
           "stopped by max_time at update 5321 (epoch 40) after 3600s; best dev BLEU 40.1; use ..."]
    assert peers.rpr_mt_stop_reason(log) == "max_time"
    assert peers.rpr_mt_stop_reason(log[:2]) is None


def test_fairseq_hypotheses_come_back_in_input_order_and_a_missing_one_is_an_error():
    out = ["S-1\t▁a", "H-1\t-0.5\t▁zwei ▁hunde", "D-1\t-0.5\tzwei hunde", "P-1\t-0.1 -0.2",
           "H-0\t-0.2\t▁ein ▁mann", "H-2\t-0.9\t"]
    assert peers.parse_fairseq_hypotheses(out) == ["▁ein ▁mann", "▁zwei ▁hunde", ""]
    with pytest.raises(UserError, match="no hypothesis for line 1"):
        peers.parse_fairseq_hypotheses(["H-0\t-1\t▁a", "H-2\t-1\t▁b"])


def test_last_checkpoints_sort_by_number_not_name(tmp_path):
    names = [f"model_step_{n}.pt" for n in (20, 100, 40, 1000, 60)] + ["average.pt", "model_step_x.pt"]
    chosen = peers.last_checkpoints([tmp_path / n for n in names], r"model_step_(\d+)\.pt", count=3)
    assert [p.name for p in chosen] == ["model_step_60.pt", "model_step_100.pt", "model_step_1000.pt"]
    assert peers.last_checkpoints([tmp_path / "checkpoint_last.pt"], r"checkpoint(\d+)\.pt") == []


def test_piece_text_decodes_back_to_the_tokenized_text(tmp_path):
    lines = ["ein mann in einem blauen hemd steht auf einer leiter .",
             "zwei hunde spielen im schnee &quot; draußen &quot; .", "eine frau , die ein buch liest ."] * 40
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=60,
                                   model_type="bpe", pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    # as prepare_data writes them: the pieces of the prepared ids, joined by spaces
    piece_lines = [" ".join(sp.id_to_piece(i) for i in sp.encode(line)) for line in lines[:3]]
    assert all(" " not in p for line in piece_lines for p in line.split(" "))
    assert peers.pieces_to_text(piece_lines + [""], tmp_path / "spm.model") == lines[:3] + [""]


def test_table_row_names_every_column():
    result = {"toolkit": "onmt", "updates": 4321, "tgt_tokens_per_s": 1855.4, "peak_rss_mb": 812.2,
              "train_seconds": 3600.2, "scores": {"dev": {"lc_tok_bleu": 40.123, "sacrebleu": 30.0},
                                                  "test": {"lc_tok_bleu": 39.5, "sacrebleu": 29.26}}}
    assert peers.table_row(result) == "| onmt | 4,321 | 1,855 | 812 | 40.12 | 39.50 | 29.26 | 3,600 |"
    assert peers.TABLE_HEADER.splitlines()[0].count("|") == peers.table_row(result).count("|")


def test_allocator_env_records_a_preloaded_allocator_and_its_settings_only():
    environ = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "MALLOC_CONF": "oversize_threshold:0",
               "OMP_WAIT_POLICY": "PASSIVE", "PATH": "/usr/bin"}
    assert peers.allocator_env(environ) == {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                                            "MALLOC_CONF": "oversize_threshold:0"}
    assert peers.allocator_env({"PATH": "/usr/bin", "LD_PRELOAD": ""}) == {}  # glibc's malloc: nothing to record
