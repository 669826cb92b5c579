"""Integration tests of the training loop on tiny models and the demo corpus (CPU, seconds each)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_from_dict, config_to_dict, save_config
from rpr_mt.data.prepare import prepare
from rpr_mt.errors import UserError
from rpr_mt.train.loss import TranslationLoss
from rpr_mt.train import device as device_module
from rpr_mt.train.trainer import train

REPO = Path(__file__).resolve().parents[2]


def tiny(data_dir: Path, run_dir: Path, **sections) -> dict:
    raw = {
        "data": {"source": "demo", "output_dir": str(data_dir), "demo_sizes": {"train": 400, "dev": 20, "test": 20},
                 "vocab_size": 300},
        "model": {"d_model": 32, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64,
                  "dropout": 0.1, "clip": 4, "max_positions": 128},
        "train": {"run_dir": str(run_dir), "max_tokens": 400, "max_steps": 12, "log_every": 4, "save_every": 4,
                  "validate_every": 6, "valid_max_sentences": 5, "lr_schedule": "inverse_sqrt", "peak_lr": 3e-3,
                  "warmup_steps": 5, "num_threads": 1, "seed": 7},
        "decode": {"beam_size": 2, "max_len_b": 5, "max_len_a": 1.0},
    }
    for section, values in sections.items():
        raw[section] = {**raw[section], **values}
    return raw


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("demo") / "data"
    prepare(config_from_dict(tiny(data_dir, data_dir.parent / "unused")).data, progress=False)
    return data_dir


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_checkpoint(ckpt.list_step_checkpoints(run_dir)[-1])["model"]


@pytest.mark.parametrize("positions", ["relative", "absolute", "absolute+relative", "none", "t5", "xl", "rope", "alibi"])
def test_tiny_model_overfits_twenty_pairs(tmp_path, demo_data, positions):
    overfit_data = tmp_path / "data20"
    raw = tiny(overfit_data, tmp_path / "run", data={"max_train_pairs": 20, "demo_sizes": {"train": 400, "dev": 20, "test": 20}},
               model={"positions": positions, "dropout": 0.0, "d_model": 64, "ff_dim": 128},
               train={"max_steps": 150, "validate_every": 1000, "save_every": 1000, "warmup_steps": 20,
                      "peak_lr": 5e-3, "label_smoothing": 0.0, "valid_bleu": False})
    cfg = config_from_dict(raw)
    result = train(cfg, progress=False)
    assert result.step == 150 and result.stopped_by == "max_steps"
    train_losses = losses(tmp_path / "run")
    # Per-token NLL of memorised pairs: far below ln(vocab) ~ 5.7 at the start.
    assert train_losses[0] > 3.0
    assert train_losses[-1] < 0.5, f"{positions}: final loss {train_losses[-1]:.3f}"


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, demo_data):
    whole = config_from_dict(tiny(demo_data, tmp_path / "whole"))
    uninterrupted = train(whole, progress=False)
    first = config_from_dict(tiny(demo_data, tmp_path / "split", train={"max_steps": 6}))
    first_half = train(first, progress=False)
    assert first_half.step == 6
    second = config_from_dict(tiny(demo_data, tmp_path / "split"))  # same run dir, longer max_steps: resumes
    result = train(second, progress=False)
    assert result.step == 12
    # The run's totals carry over through the checkpoint; this invocation's own count covers only its half.
    assert result.run_target_tokens == uninterrupted.target_tokens == uninterrupted.run_target_tokens
    assert result.target_tokens + first_half.target_tokens == uninterrupted.target_tokens
    assert result.run_seconds > result.seconds
    a, b = final_weights(tmp_path / "whole"), final_weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_bf16_autocast_trains_on_cpu(tmp_path, demo_data, monkeypatch, capsys):
    # as on a CPU without bfloat16 instructions: the run is warned of at its start, and trains all the same
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    cfg = config_from_dict(tiny(demo_data, tmp_path / "bf16", train={"precision": "bf16", "max_steps": 30,
                                                                     "validate_every": 30}))
    result = train(cfg, progress=False)
    values = losses(tmp_path / "bf16")
    assert result.step == 30 and all(math.isfinite(v) for v in values) and values[-1] < values[0]
    assert "warning: train.precision is bf16 but this CPU has no bfloat16 instructions" in capsys.readouterr().err


def test_ddp_two_gloo_processes_equal_one_process(tmp_path, demo_data):
    # Gradients that are zero in exact arithmetic (the key-projection bias: softmax ignores a per-row constant) are
    # rounding noise, which Adam with eps=1e-9 would blow up to full-size steps of random sign. A larger eps keeps
    # the comparison about the gradients DDP computes, not about the sign of noise.
    raw = tiny(demo_data, tmp_path / "single", model={"dropout": 0.0},
               train={"max_steps": 5, "valid_bleu": False, "adam_eps": 1e-6})
    train(config_from_dict(raw), progress=False)
    raw["train"]["run_dir"] = str(tmp_path / "ddp")
    config_path = tmp_path / "ddp.yaml"
    save_config(config_from_dict(raw), config_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rpr_mt.cli",
         "train", "--config", str(config_path), "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5, rtol=1e-4), key
    # the logged loss is the whole update's (each rank's share summed), not rank 0's share
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "single"), rel=1e-4)


def test_ddp_refuses_another_config_on_every_rank(tmp_path, demo_data):
    """Rank 0 compares the run directory's config; every rank stops with the refusal (before, rank 1 waited at a
    barrier until torchrun killed it for rank 0's failure): rank 0 names the difference; rank 1 stops silently, being
    on the same machine (another machine's first rank would point to rank 0's message: "rank 0 says why")."""
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2, "valid_bleu": False})),
          progress=False)
    raw = tiny(demo_data, tmp_path / "run", model={"clip": 2}, train={"max_steps": 2, "valid_bleu": False})
    config_path = tmp_path / "other.yaml"
    save_config(config_from_dict(raw), config_path)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rpr_mt.cli",
         "train", "--config", str(config_path), "--no-progress"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "different config (model.clip: 4 -> 2)" in errors[0], proc.stderr[-3000:]


@pytest.mark.parametrize("fault, file, update, every", [
    ("checkpoint_write:1", r"checkpoint_0+2\.pt", 2, {"save_every": 2}),
    ("checkpoint_write:1", r"checkpoint_best\.pt", 2, {"validate_every": 2, "save_every": 4}),
    ("metrics_write:2", r"metrics\.jsonl", 2, {"log_every": 2}),  # the first record is update 1's
])
def test_ddp_a_full_disk_stops_every_rank_in_one_line(tmp_path, demo_data, fault, file, update, every):
    """Rank 0 alone writes files (a numbered checkpoint, the best after a validation, the metrics). Its full disk
    raised on rank 0 while rank 1 waited at a barrier (or a broadcast) for a rank that had left, until torchrun
    killed it (or, under gloo, the broken process group ended it in a traceback): now every rank stops at the same
    update, rank 0 with the one line that says what it kept."""
    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 4, "valid_bleu": False, **every})
    config_path = tmp_path / "ddp.yaml"
    save_config(config_from_dict(raw), config_path)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rpr_mt.cli",
         "train", "--config", str(config_path), "--no-progress"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "RPR_MT_FULL_DISK_AT": fault},
        capture_output=True, text=True, timeout=180,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert re.search(rf"cannot write .*{file} \(No space left on device\).*the run stops at update {update}: it "
                     r"has no checkpoint yet", errors[0]), errors[0]
    # no rank died in a traceback of the broken process group (torchrun's own summary follows: a rank that exits
    # first makes it SIGTERM the others, which may be on their way out with code 2 too)
    assert proc.returncode != 0 and not re.search(r"\[rank\d\]: Traceback", proc.stderr), proc.stderr[-3000:]
    assert re.search(r"exitcode\s*:\s*2 ", proc.stderr), proc.stderr[-3000:]
    assert not list((tmp_path / "run" / "checkpoints").glob("*.pt"))


def test_run_dir_with_another_config_is_refused_unless_overwrite(tmp_path, demo_data):
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2})), progress=False)
    other = config_from_dict(tiny(demo_data, tmp_path / "run", model={"clip": 2}, train={"max_steps": 2}))
    with pytest.raises(UserError, match=r"different config \(model.clip: 4 -> 2\)"):
        train(other, progress=False)
    assert train(other, overwrite=True, progress=False).step == 2


def test_overwrite_deletes_the_previous_run_only_after_the_new_inputs_are_checked(tmp_path, demo_data):
    """--overwrite removed the old run first, then the new config failed on its data (mismatched files, a vocabulary
    too large, a sentence limit no pair fits): neither the old run nor a new one was left."""
    run_dir = tmp_path / "run"
    train(config_from_dict(tiny(demo_data, run_dir, train={"max_steps": 4})), progress=False)
    before = sorted(path.name for path in run_dir.rglob("*") if path.is_file())
    failing = config_from_dict(tiny(demo_data, run_dir, model={"max_positions": 2}, train={"max_steps": 4}))
    with pytest.raises(UserError, match="no training pair"):
        train(failing, overwrite=True, progress=False)
    assert sorted(path.name for path in run_dir.rglob("*") if path.is_file()) == before
    assert [path.name for path in ckpt.list_step_checkpoints(run_dir)] == ["checkpoint_00000004.pt"]


def test_overwrite_with_the_same_config_starts_the_run_over(tmp_path, demo_data):
    """--overwrite replaced only a run of another config: with the same one (a run to redo after a code fix) it
    resumed the run, or said a finished one had nothing to train, and replaced nothing."""
    config = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2, "tensorboard": False}))
    train(config, progress=False)
    again = train(config, overwrite=True, progress=False)
    assert again.step == 2 and again.target_tokens > 0  # trained again, from update 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(1) == 1  # the old run's records went with it


def test_a_run_whose_checkpoints_all_fail_to_load_is_refused_not_started_over(tmp_path, demo_data):
    """Every numbered checkpoint corrupt: the resume warned about each and then trained from update 0, replacing them
    and the best checkpoint with a new run's. It is refused in one line, before the data is read; --overwrite is
    how to start over."""
    config = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 8, "tensorboard": False}))
    train(config, progress=False)
    for path in ckpt.list_step_checkpoints(tmp_path / "run"):
        path.write_bytes(path.read_bytes()[:1000])
    before = {p.name: p.read_bytes() for p in ckpt.checkpoint_dir(tmp_path / "run").iterdir()}
    with pytest.raises(UserError, match=r"no checkpoint in .*checkpoints loads \(each is named above\), so .*run "
                                        r"cannot be resumed; restore one, or pass --overwrite"):
        train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 9, "tensorboard": False})),
              progress=False)
    assert {p.name: p.read_bytes() for p in ckpt.checkpoint_dir(tmp_path / "run").iterdir()} == before
    assert train(config, overwrite=True, progress=False).step == 8


def test_a_full_disk_stops_the_run_in_one_line_naming_its_latest_checkpoint(tmp_path, demo_data, monkeypatch):
    """A checkpoint write that failed for want of space ended the run in a traceback."""
    saves = []
    real_save = torch.save

    def fills_the_disk(obj, handle, *args, **kwargs):  # the second write: the best checkpoint at update 8
        saves.append(1)
        if len(saves) == 2:
            raise OSError(28, "No space left on device")
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", fills_the_disk)
    config = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 8, "validate_every": 100,
                                                                       "tensorboard": False}))
    with pytest.raises(UserError, match=r"^cannot write .*checkpoint_best.pt \(No space left on device\); nothing was "
                                        r"written; the run stops at update 8: its latest checkpoint is "
                                        r".*checkpoint_00000004.pt \(free some space, then run the same command"):
        train(config, progress=False)


def test_a_signal_while_the_model_is_built_stops_in_one_line_with_nothing_saved(tmp_path, demo_data, monkeypatch):
    """SIGTERM before the first update (the data loading, the model building) ended the process silently with 143,
    where the README promises a stop with a word; the run directory is left as it was (here: not made)."""
    import signal

    from rpr_mt.train import trainer
    from rpr_mt.train.signals import Terminated

    def terminated_while_building(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the start-up")

    monkeypatch.setattr(trainer, "initial_model", terminated_while_building)
    config = config_from_dict(tiny(demo_data, tmp_path / "run"))
    with pytest.raises(Terminated, match=r"^SIGTERM before the first update; nothing to save$") as info:
        train(config, progress=False)
    assert info.value.signum == signal.SIGTERM and not (tmp_path / "run").exists()


def test_average_last_raised_on_a_finished_run_writes_the_average_once(tmp_path, demo_data, capsys):
    """A finished run re-run with train.average_last said 'nothing changed' and wrote no average, though the
    checkpoints it needs were there; asked again, the same average is not made again."""
    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 8, "validate_every": 100, "tensorboard": False})
    train(config_from_dict(raw), progress=False)
    average = tmp_path / "run" / "checkpoints" / "checkpoint_avg.pt"
    assert not average.exists()
    raw["train"]["average_last"] = 2
    result = train(config_from_dict(raw), progress=False)
    assert result.stopped_by == "max_steps" and result.step == 8
    assert ckpt.averaged_steps(average) == [4, 8]
    assert "nothing to train, averaging its last checkpoints" in capsys.readouterr().err
    written = average.stat().st_mtime_ns
    train(config_from_dict(raw), progress=False)
    assert "nothing to train, nothing changed" in capsys.readouterr().err and average.stat().st_mtime_ns == written


def test_a_full_disk_writing_config_yaml_stops_in_one_line_and_leaves_no_temporary(tmp_path, demo_data, monkeypatch):
    """config.yaml written on a full disk ended the run in a traceback (a checkpoint's write said one line)."""
    import rpr_mt.config

    def full_disk(name):
        if name == "config_write":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(rpr_mt.config, "fault_point", full_disk)
    run = tmp_path / "run"
    run.mkdir()  # (one made by the run and left empty is removed)
    with pytest.raises(UserError, match=rf"^cannot write {run / 'config.yaml'} \(No space left on device\); the run "
                                        r"stops at update 0: it has no checkpoint yet \(free some space"):
        train(config_from_dict(tiny(demo_data, run)), progress=False)
    assert sorted(p.name for p in run.iterdir()) == [".train.lock"]  # no .config.yaml.tmp


def test_a_run_without_its_config_yaml_is_compared_with_its_checkpoints_config(tmp_path, demo_data):
    """config.yaml deleted: another model config is refused in one line (before, loading the weights into the
    other model ended in a traceback of size mismatches), and --overwrite replaces the run, TensorBoard events
    included (left behind, they drew the old run's curves beside the new one's)."""
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2})), progress=False)
    (tmp_path / "run" / "config.yaml").unlink()
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    other = config_from_dict(tiny(demo_data, tmp_path / "run", model={"d_model": 64}, train={"max_steps": 2,
                                                                                             "tensorboard": False}))
    with pytest.raises(UserError, match=r"different config \(model.d_model: 32 -> 64\); to resume it, train with its own settings \(in its "
                       r"checkpoints\).*another train.run_dir.*--overwrite to delete that run"):
        train(other, progress=False)
    assert train(other, overwrite=True, progress=False).step == 2
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_tensorboard_can_be_turned_off_when_resuming(tmp_path, demo_data):
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2})), progress=False)
    resumed = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 3, "tensorboard": False}))
    assert train(resumed, progress=False).step == 3


def _small_corpus(tmp_path: Path) -> Path:
    """A directory with train.en/train.de: 120 pairs of a 16-word language and its upper-cased twin."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the a red small big old dog cat bird man woman sees runs eats house tree".split()
    pairs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 4)) for i in range(120)]
    (corpus / "train.en").write_text("\n".join(pairs) + "\n")
    (corpus / "train.de").write_text("\n".join(p.upper() for p in pairs) + "\n")
    return corpus


def _trained_on_small_corpus(tmp_path: Path) -> tuple[Path, dict, bytes]:
    """A run of 2 updates on ``_small_corpus``: the corpus, the run's raw config and its SentencePiece model's bytes."""
    corpus = _small_corpus(tmp_path)
    raw = tiny(tmp_path / "data", tmp_path / "run", train={"max_steps": 2, "valid_bleu": False})
    raw["data"] = {"source": "files", "output_dir": str(tmp_path / "data"), "vocab_size": 60,
                   "splits": {"train": {"src": str(corpus / "train.en"), "tgt": str(corpus / "train.de")}}}
    train(config_from_dict(raw), progress=False)
    return corpus, raw, (tmp_path / "data" / "spm.model").read_bytes()


def test_resuming_after_the_corpus_changed_is_refused_before_the_data_is_prepared_again(tmp_path):
    """The training text changed under a run with checkpoints: re-preparing would replace the vocabulary the
    checkpoints need (and then refuse to resume, with the old data gone). The refusal comes first and leaves the
    prepared data as it was; --overwrite starts over on the new text."""
    corpus, raw, vocab = _trained_on_small_corpus(tmp_path)
    with open(corpus / "train.en", "a") as handle, open(corpus / "train.de", "a") as other:
        handle.write("zebra quagga okapi\n")
        other.write("ZEBRA QUAGGA OKAPI\n")
    raw["train"]["max_steps"] = 3
    with pytest.raises(UserError, match=r"holds checkpoints trained on the data in .*inputs changed since .*train.en"):
        train(config_from_dict(raw), progress=False)
    assert (tmp_path / "data" / "spm.model").read_bytes() == vocab
    assert train(config_from_dict(raw), overwrite=True, progress=False).step == 3


def test_resuming_on_training_pairs_prepared_again_from_changed_inputs_is_refused(tmp_path):
    """The corpus changed and the user ran `rpr-mt prepare` before resuming: the inputs then match the rewritten
    manifest and the vocabulary came out the same, so the run went on, silently, on other pairs. Its checkpoints
    now keep the fingerprint of the pairs they were trained on."""
    corpus, raw, vocab = _trained_on_small_corpus(tmp_path)
    for name in ("train.en", "train.de"):  # the same pairs in another order: the same vocabulary, other pairs
        lines = (corpus / name).read_text().splitlines()
        (corpus / name).write_text("\n".join(lines[60:] + lines[:60]) + "\n")
    prepare(config_from_dict(raw).data, progress=False)
    assert (tmp_path / "data" / "spm.model").read_bytes() == vocab
    raw["train"]["max_steps"] = 3
    with pytest.raises(UserError, match=r"checkpoint_00000002.pt was trained on other training pairs than .*data "
                                        r"holds now"):
        train(config_from_dict(raw), progress=False)
    assert train(config_from_dict(raw), overwrite=True, progress=False).step == 3
    # and the data prepared again from the same inputs is the same data: the run resumes
    prepare(config_from_dict(raw).data, force=True, progress=False)
    raw["train"]["max_steps"] = 4
    assert train(config_from_dict(raw), progress=False).step == 4


def test_resuming_after_a_dev_file_was_corrected_prepares_it_again_and_warns(tmp_path, capsys):
    """SentencePiece learns from the training pairs alone, so a corrected dev reference cannot change the vocabulary
    the checkpoints need: the run resumes on the data prepared again (it was refused, with advice to delete its
    checkpoints), with a warning that its best dev score was measured on the old set."""
    corpus = _small_corpus(tmp_path)
    (corpus / "dev.en").write_text("the dog\nthe cat\n")
    (corpus / "dev.de").write_text("THE DOG\nTHE CAT\n")
    raw = tiny(tmp_path / "data", tmp_path / "run", train={"max_steps": 2, "valid_bleu": False})
    raw["data"] = {"source": "files", "output_dir": str(tmp_path / "data"), "vocab_size": 60,
                   "splits": {"train": {"src": str(corpus / "train.en"), "tgt": str(corpus / "train.de")},
                              "dev": {"src": str(corpus / "dev.en"), "tgt": str(corpus / "dev.de")}}}
    train(config_from_dict(raw), progress=False)
    vocab = (tmp_path / "data" / "spm.model").read_bytes()
    (corpus / "dev.de").write_text("THE DOG\nTHE BIRD\n")
    raw["train"]["max_steps"] = 3
    capsys.readouterr()
    assert train(config_from_dict(raw), progress=False).step == 3
    assert (tmp_path / "data" / "dev.de").read_text() == "THE DOG\nTHE BIRD\n"
    assert (tmp_path / "data" / "spm.model").read_bytes() == vocab
    assert f"warning: the dev set of {tmp_path / 'run'} changed since its last validation (input " \
           f"{corpus / 'dev.de'} changed (sha256 differs))" in capsys.readouterr().err


def test_data_prepared_since_by_another_config_is_said_as_that_not_as_a_reason_to_overwrite(tmp_path):
    """Two configs shared one data.output_dir: the second prepared it with another vocabulary size, and resuming the
    first was refused with advice to --overwrite (delete its checkpoints). It is now told what happened and that
    `prepare` with its own config rebuilds its data, after which it resumes."""
    raw = tiny(tmp_path / "data", tmp_path / "run", train={"max_steps": 2, "valid_bleu": False})
    train(config_from_dict(raw), progress=False)
    other = tiny(tmp_path / "data", tmp_path / "other", data={"vocab_size": 280}, train={"max_steps": 1})
    prepare(config_from_dict(other).data, progress=False)
    raw["train"]["max_steps"] = 3
    with pytest.raises(UserError) as refused:
        train(config_from_dict(raw), progress=False)
    assert "was prepared since with other data settings than this run's (data.vocab_size 280 there, 300 in this " \
           "config)" in str(refused.value) and "--overwrite" not in str(refused.value)
    prepare(config_from_dict(raw).data, progress=False)
    assert train(config_from_dict(raw), progress=False).step == 3


def test_run_dir_from_before_a_config_key_existed_resumes(tmp_path, demo_data):
    """A run whose config.yaml predates the model.t5/xl/rope sections (and a nested key) is the same run at their
    defaults, and another run when one of them is set."""
    import yaml

    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 2})), progress=False)
    config_path = tmp_path / "run" / "config.yaml"
    saved = yaml.safe_load(config_path.read_text())
    for section in ("t5", "xl"):
        del saved["model"][section]
    del saved["model"]["rope"]["base"]
    config_path.write_text(yaml.safe_dump(saved))
    assert train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 3})), progress=False).step == 3

    config_path.write_text(yaml.safe_dump(saved))
    other = config_from_dict(tiny(demo_data, tmp_path / "run", model={"d_model": 64}, train={"max_steps": 4}))
    with pytest.raises(UserError, match=r"different config \(model.d_model: 32 -> 64\)"):
        train(other, progress=False)


def test_a_setting_the_position_scheme_ignores_may_change_on_resume(tmp_path, demo_data):
    """model.clip of an absolute model changes nothing, so a resume with another clip (a sweep's base config edited,
    a --set dropped) resumes instead of being refused as another run; a setting the scheme reads is still another
    run, and so is a nested one of a scheme that reads it (a t5 section the old config lacks, set now)."""
    from rpr_mt.config import Config, config_to_dict
    from rpr_mt.train.run_dir import config_differences

    absolute = {"positions": "absolute"}
    train(config_from_dict(tiny(demo_data, tmp_path / "run", model=absolute, train={"max_steps": 2})), progress=False)
    ignored = {"clip": 2, "use_key": False, "t5": {"num_buckets": 8}}
    resumed = tiny(demo_data, tmp_path / "run", model={**absolute, **ignored}, train={"max_steps": 3})
    assert train(config_from_dict(resumed), progress=False).step == 3
    learned = tiny(demo_data, tmp_path / "run", model={**absolute, "absolute_kind": "learned"}, train={"max_steps": 4})
    with pytest.raises(UserError, match=r"different config \(model.absolute_kind: sinusoidal -> learned\)"):
        train(config_from_dict(learned), progress=False)

    old = config_to_dict(Config())
    old["model"]["positions"] = "t5"
    del old["model"]["t5"]
    new = config_to_dict(config_from_dict({"model": {"positions": "t5", "t5": {"num_buckets": 16}}}))
    assert config_differences(old, new) == ["model.t5.num_buckets: null -> 16"]
    old["model"]["positions"] = new["model"]["positions"] = "relative"
    assert config_differences(old, new) == []
    new["model"]["positions"] = "absolute"  # another scheme: its settings too may differ
    assert config_differences(old, new) == ["model.positions: relative -> absolute"]


def test_a_mapping_setting_that_gains_entries_is_a_different_config():
    """The default rule is for settings added to rpr-mt, not for entries of a mapping: demo splits added to a run
    that had none change the run (validation, best checkpoints), even at their default sizes."""
    import copy

    from rpr_mt.config import Config, config_to_dict
    from rpr_mt.train.run_dir import config_differences

    new = config_to_dict(Config())
    old = copy.deepcopy(new)
    old["data"]["demo_sizes"] = {"train": new["data"]["demo_sizes"]["train"]}
    assert [d.split(":")[0] for d in config_differences(old, new)] == ["data.demo_sizes"]
    assert config_differences(new, copy.deepcopy(new)) == []


def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, demo_data, capsys):
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 8})), progress=False)
    latest = ckpt.list_step_checkpoints(tmp_path / "run")[-1]
    assert latest.name == "checkpoint_00000008.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    result = train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 10})), progress=False)
    err = capsys.readouterr().err
    assert "checkpoint_00000008.pt is corrupt or truncated" in err
    assert "resuming from" in err and "checkpoint_00000004.pt" in err
    assert result.step == 10


def test_non_finite_losses_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path, demo_data, monkeypatch):
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 4})), progress=False)
    good = ckpt.list_step_checkpoints(tmp_path / "run")[-1]
    before = good.read_bytes()

    def nan_forward(self, src, tgt_in, tgt_out):
        nan = torch.tensor(float("nan"), requires_grad=True)
        return nan * 1.0, nan * 1.0

    monkeypatch.setattr(TranslationLoss, "forward", nan_forward)
    cfg = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 8, "max_bad_updates": 3}))
    with pytest.raises(UserError, match="3 non-finite losses in a row"):
        train(cfg, progress=False)
    assert ckpt.list_step_checkpoints(tmp_path / "run")[-1] == good and good.read_bytes() == before


def test_dry_run_prints_parameters_without_training(tmp_path, capsys):
    cfg = config_from_dict({"model": {"preset": "base"}, "data": {"vocab_size": 32768},
                            "train": {"run_dir": str(tmp_path / "dry"), "update_freq": 6, "max_tokens": 4096}})
    result = train(cfg, dry_run=True)
    out = capsys.readouterr().out
    assert result.stopped_by == "dry_run" and f"parameters: {result.parameters:,}" in out
    assert "24,576" in out  # 4096 x 6 tokens per update
    assert not (tmp_path / "dry").exists()


def test_saved_config_round_trips(tmp_path, demo_data):
    cfg = config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 1}))
    train(cfg, progress=False)
    state = ckpt.load_checkpoint(ckpt.list_step_checkpoints(tmp_path / "run")[-1])
    assert state["config"] == config_to_dict(cfg)
    assert state["vocab"]["size"] > 0 and len(state["vocab"]["fingerprint"]) == 64


def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(tmp_path, demo_data):
    import signal
    import time

    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 100000, "log_every": 1, "save_every": 100000,
                                                   "validate_every": 100000, "average_last": 2})
    config_path = tmp_path / "long.yaml"
    save_config(config_from_dict(raw), config_path)
    command = [sys.executable, "-m", "rpr_mt.cli", "train", "--config", str(config_path), "--no-progress"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]  # 143, as a shell reports a SIGTERM
    assert "run the same command again to resume" in err
    saved = ckpt.list_step_checkpoints(tmp_path / "run")
    assert len(saved) == 1
    averaged = ckpt.checkpoint_dir(tmp_path / "run") / "checkpoint_avg.pt"
    assert not averaged.exists()  # averaging waits for the end of the run
    step = ckpt.load_checkpoint(saved[0])["step"]
    assert step >= 3
    raw["train"]["max_steps"] = step + 2
    save_config(config_from_dict(raw), config_path)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming from {saved[0]}" in done.stderr
    assert ckpt.list_step_checkpoints(tmp_path / "run")[-1].name == f"checkpoint_{step + 2:08d}.pt"
    assert averaged.is_file()


@pytest.mark.parametrize("sections, cap", [
    ({"data": {"max_train_tokens": 12}}, "12 pieces (data.max_train_tokens)"),
    ({"model": {"max_positions": 14}}, "13 pieces (model.max_positions=14 with eos)"),
    ({"data": {"max_train_tokens": 20}, "model": {"max_positions": 14}}, "13 pieces (model.max_positions=14 with eos)"),
])
def test_the_log_names_the_length_limit_that_binds(tmp_path, demo_data, capsys, sections, cap):
    from rpr_mt.data.binarize import load_split
    from rpr_mt.train.batching import usable_examples

    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 1}, **{
        name: {**tiny(demo_data, tmp_path)[name], **values} for name, values in sections.items()})
    cfg = config_from_dict(raw)
    train(cfg, progress=False)
    data = load_split(demo_data, "train")
    dropped = len(data) - len(usable_examples(data, cfg.model.max_positions, cfg.data.max_train_tokens))
    assert dropped > 0 and f"({dropped:,} skipped: empty or a side over {cap})" in capsys.readouterr().err


@pytest.mark.parametrize("kind, words", [("learned", "learned absolute positions"),
                                         ("sinusoidal", "absolute positions")])
def test_the_log_says_which_absolute_positions_the_model_has(tmp_path, demo_data, capsys, kind, words):
    """A learned table was reported as "model: absolute positions", the sinusoids' name."""
    raw = tiny(demo_data, tmp_path / "run", model={"positions": "absolute", "absolute_kind": kind},
               train={"max_steps": 1, "valid_bleu": False})
    train(config_from_dict(raw), progress=False)
    assert f"\nmodel: {words}, " in "\n" + capsys.readouterr().err


def train_whose_log_reader_leaves(tmp_path: Path, demo_data: Path, **train_section) -> subprocess.Popen:
    """`rpr-mt train ... 2>&1 | head -3`: a training whose stderr reader leaves after three lines."""
    raw = tiny(demo_data, tmp_path / "run", train={"log_every": 1, "validate_every": 100000, "valid_bleu": False,
                                                    **train_section})
    config_path = tmp_path / "c.yaml"
    save_config(config_from_dict(raw), config_path)
    proc = subprocess.Popen([sys.executable, "-m", "rpr_mt.cli", "train", "--config", str(config_path),
                             "--no-progress"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(3):
        proc.stderr.readline()
    proc.stderr.close()
    return proc


def test_a_log_reader_that_goes_away_does_not_end_the_run(tmp_path, demo_data):
    """The run goes on to max_steps and saves its checkpoints (before, the next log line raised BrokenPipeError and
    the run ended with exit 0 and nothing saved)."""
    proc = train_whose_log_reader_leaves(tmp_path, demo_data, max_steps=40, save_every=20)
    assert proc.wait(timeout=300) == 0
    names = [p.name for p in ckpt.list_step_checkpoints(tmp_path / "run")]
    assert names == ["checkpoint_00000020.pt", "checkpoint_00000040.pt"]


def test_a_second_training_into_the_same_run_dir_is_refused(tmp_path, demo_data):
    """Two `rpr-mt train` into one directory interleaved their metrics and overwrote each other's checkpoints. The
    directory's lock is held (here by this process, as a running training would hold it): the training is refused
    in one line; once it is free, the same command trains, and leaves no lock file behind."""
    from rpr_mt.train.run_dir import RunDirLock

    cfg = config_from_dict(tiny(demo_data, tmp_path / "runs" / "run", train={"max_steps": 2, "valid_bleu": False}))
    with RunDirLock(tmp_path / "runs" / "run") as lock:
        assert lock.acquired
        with pytest.raises(UserError, match="another `rpr-mt train` is training in"):
            train(cfg, progress=False)
    assert not (tmp_path / "runs").exists()  # created for the lock, empty: removed, the parent it made too
    assert train(cfg, progress=False).step == 2
    with RunDirLock(tmp_path / "runs" / "run") as lock:  # the finished run let go of it
        assert lock.acquired


def test_a_run_stopped_after_its_log_reader_left_still_exits_as_stopped(tmp_path, demo_data):
    """The 'interrupted: saved ...' line goes nowhere once the reader is gone, but the exit code still says the run
    stopped early (before, the broken pipe of that line turned it into 0, 'finished')."""
    import signal
    import time

    proc = train_whose_log_reader_leaves(tmp_path, demo_data, max_steps=100000, save_every=100000)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    assert ckpt.list_step_checkpoints(tmp_path / "run")  # the stop saved one


def test_max_epochs_stops_at_the_epochs_last_batch_and_a_rerun_is_finished(tmp_path, demo_data):
    """max_epochs 1 trains exactly the epoch's batches (before: one update of the second epoch too, whose first
    batch had to be drawn for the epoch counter to move), and the same command again changes nothing."""
    from rpr_mt.data.binarize import load_split
    from rpr_mt.train.batching import make_batches, usable_examples

    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": None, "max_epochs": 1, "lr_schedule": "inverse_sqrt",
                                                    "save_every": 1000, "validate_every": 1000, "valid_bleu": False})
    cfg = config_from_dict(raw)
    data = load_split(demo_data, "train")
    epoch = make_batches(data, usable_examples(data, cfg.model.max_positions), cfg.train.max_tokens, cfg.train.seed, 0)
    result = train(cfg, progress=False)
    assert result.stopped_by == "max_epochs" and result.step == len(epoch)
    again = train(cfg, progress=False)
    assert again.stopped_by == "max_epochs" and again.step == len(epoch)
    assert len(ckpt.list_step_checkpoints(tmp_path / "run")) == 1


def test_max_epochs_with_update_freq_trains_one_pass_and_resumes_as_planned(tmp_path, demo_data):
    """update_freq 5 over an epoch of 24 batches: the epoch's last update takes its 4 batches left (as in fairseq),
    not 1 of the next epoch too, so max_epochs 1 trains exactly one pass (before: 'update 5 (epoch 2)'). Every epoch
    ends so, so the run resumed there for a second epoch equals one planned for two from the start."""
    from rpr_mt.data.binarize import load_split
    from rpr_mt.train.batching import make_batches, usable_examples

    sections = {"max_steps": None, "max_epochs": 1, "update_freq": 5, "lr_schedule": "inverse_sqrt",
                "save_every": 1000, "validate_every": 1000, "valid_bleu": False}
    cfg = config_from_dict(tiny(demo_data, tmp_path / "run", train=sections))
    data = load_split(demo_data, "train")
    epochs = [make_batches(data, usable_examples(data, cfg.model.max_positions), cfg.train.max_tokens,
                           cfg.train.seed, epoch) for epoch in (0, 1)]
    assert [len(batches) for batches in epochs] == [24, 24]  # 4 updates of 5 batches, then one of 4, each epoch
    epoch = epochs[0]
    result = train(cfg, progress=False)
    assert result.stopped_by == "max_epochs" and (result.step, result.epoch) == (5, 0)
    assert result.target_tokens == sum(int(data.tgt_lengths[i]) + 1 for rows in epoch for i in rows)
    saved = ckpt.load_checkpoint(ckpt.list_step_checkpoints(tmp_path / "run")[-1])
    assert (saved["epoch"], saved["position"]) == (0, len(epoch))

    two = {**sections, "max_epochs": 2}
    for run_dir in ("run", "whole"):  # resumed for a second epoch; both epochs in one go
        assert train(config_from_dict(tiny(demo_data, tmp_path / run_dir, train=two)), progress=False).step == 10
    a, b = final_weights(tmp_path / "whole"), final_weights(tmp_path / "run")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_changing_save_every_on_resume_keeps_the_checkpoints_of_the_old_grid(tmp_path, demo_data):
    """save_every may change on resume (RESUMABLE_TRAIN_KEYS); the checkpoints saved on the old grid are regular
    ones, not an interrupted run's, and stay (before: 5 and 15 were deleted as off the new grid of 10)."""
    sections = dict(save_every=5, keep_last=10, validate_every=1000, valid_bleu=False)
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={**sections, "max_steps": 20})), progress=False)
    resumed = tiny(demo_data, tmp_path / "run", train={**sections, "max_steps": 30, "save_every": 10})
    assert train(config_from_dict(resumed), progress=False).step == 30
    steps = [int(p.stem.split("_")[1]) for p in ckpt.list_step_checkpoints(tmp_path / "run")]
    assert steps == [5, 10, 15, 20, 30]


def test_an_interrupted_more_steps_run_says_how_to_reach_its_target(tmp_path, demo_data):
    """'Run the same command again' would count --more-steps from the new checkpoint and move the target; the
    message names the target instead."""
    import signal

    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 4, "log_every": 1, "save_every": 100000,
                                                    "validate_every": 100000, "valid_bleu": False})
    config_path = tmp_path / "c.yaml"
    save_config(config_from_dict(raw), config_path)
    command = [sys.executable, "-m", "rpr_mt.cli", "train", "--config", str(config_path), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=300).returncode == 0
    proc = subprocess.Popen(command + ["--more-steps", "100000"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    while True:  # until the run has trained past its checkpoint (or ended: EOF)
        line = proc.stderr.readline()
        if not line or line.startswith("update 6 "):
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    assert "run it again with --set train.max_steps=100004 instead of --more-steps" in rest


def test_pairs_longer_than_max_tokens_are_said_before_training(tmp_path, demo_data, capsys):
    """train.max_tokens below a sentence's length: the log promised '<= 5 tokens per side per update' while every
    batch held one pair of about 35 pieces, with nothing said."""
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 1, "max_tokens": 6})),
          progress=False)
    err = capsys.readouterr().err
    assert re.search(r"warning: [\d,]+ training pair\(s\) have a side longer than train.max_tokens \(6 tokens", err)
    train(config_from_dict(tiny(demo_data, tmp_path / "ok", train={"max_steps": 1})), progress=False)
    assert "longer than train.max_tokens" not in capsys.readouterr().err


@pytest.mark.parametrize("threads, warned", [(1, False), (3, True)])
def test_more_threads_than_cores_is_warned_of(tmp_path, demo_data, monkeypatch, capsys, threads, warned):
    """On 2 cores, 3 OpenMP threads wait on a descheduled sibling: an update gets slower, and nothing said why."""
    monkeypatch.setattr(device_module, "usable_cores", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the test process keeps its own threads
    cfg = config_from_dict(tiny(demo_data, tmp_path / "run", train={"num_threads": threads, "max_steps": 1,
                                                                    "valid_bleu": False}))
    train(cfg, progress=False)
    err = capsys.readouterr().err
    assert ("warning: train.num_threads is 3 but this machine lets the run use 2 CPU core(s)" in err) is warned
