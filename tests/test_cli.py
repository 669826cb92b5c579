"""The command line: exit codes and one-line errors for bad input (no tracebacks)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from rpr_mt.cli import app
from rpr_mt.train import checkpoint as ckpt

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def assert_one_line_error(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0]
    assert "Traceback" not in result.output


def test_mistyped_config_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  n_head: 4\n")
    assert_one_line_error(run("train", "--config", str(config)), "did you mean 'model.n_heads'")


def test_bad_override_and_missing_config(tmp_path):
    assert_one_line_error(run("prepare", "--set", "data.vocab_sise=100"), "did you mean 'data.vocab_size'")
    assert_one_line_error(run("train", "--config", str(tmp_path / "none.yaml")), "config file not found")
    assert_one_line_error(run("train", "--set", "model.d_model=30", "--set", "model.n_heads=4"), "divisible")
    assert_one_line_error(run("train", "--set", "model.clip=-2"), "model.clip must be >= 0")


def test_missing_and_corrupt_checkpoints(tmp_path):
    assert_one_line_error(run("translate", "--checkpoint", str(tmp_path / "nope.pt")), "checkpoint not found")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert_one_line_error(run("translate", "--checkpoint", str(bad)), "corrupt or truncated")
    assert_one_line_error(run("average-checkpoints", str(tmp_path)), "no numbered checkpoints")


def test_eval_bleu_line_count_mismatch_and_invalid_utf8(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c\n", encoding="utf-8")
    ref.write_text("a b c\nd e f\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref))
    assert_one_line_error(result, "1")
    ref.write_bytes(b"ok\n\xff\xfe broken\n")
    hyp.write_text("a\nb\n", encoding="utf-8")
    assert_one_line_error(run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref)), "ref.txt: line 2: invalid UTF-8")


def test_eval_bleu_of_identical_files_is_100(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("the cat sat on the mat .\nein Haus am See .\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(hyp), "--json")
    assert result.exit_code == 0, result.output
    assert '"sacrebleu": 100.0' in result.output.replace("100.00000000000004", "100.0")


def test_average_of_identical_checkpoints_is_that_checkpoint(tmp_path):
    weights = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    payload = {"format": ckpt.FORMAT, "step": 1, "config": {"model": {"d_model": 4}},
               "vocab": {"fingerprint": "x" * 64, "size": 10, "spm_model": torch.zeros(1, dtype=torch.uint8)},
               "model": weights}
    for step in (1, 2, 3):
        ckpt.save_checkpoint({**payload, "step": step}, ckpt.step_checkpoint_path(tmp_path, step))
    result = run("average-checkpoints", str(tmp_path), "--last", "3")
    assert result.exit_code == 0, result.output
    averaged = ckpt.load_checkpoint(ckpt.checkpoint_dir(tmp_path) / "checkpoint_avg.pt")["model"]
    for key, value in weights.items():
        assert torch.allclose(averaged[key], value, atol=1e-7)


def test_export_bad_input(tmp_path):
    assert_one_line_error(run("export", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "ct2")),
                          "checkpoint not found")
    assert_one_line_error(run("export", str(tmp_path), "--output", str(tmp_path / "ct2"), "--quantization", "int3"),
                          "--quantization must be one of")
    (tmp_path / "notes.txt").write_text("not a model\n")
    assert_one_line_error(run("export", str(tmp_path), "--output", str(tmp_path), "--force"),
                          "not a CTranslate2 model directory")
