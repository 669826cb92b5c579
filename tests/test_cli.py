"""The command line: exit codes and one-line errors for bad input (no tracebacks)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import rpr_mt
from rpr_mt import checkpoint_files as ckpt
from rpr_mt.cli import app

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


@pytest.mark.parametrize("args, fragment", [
    (["train", "--set", "train.max_stepz=3"], "did you mean 'train.max_steps'"),  # a UserError
    (["train", "--max-step", "3"], "No such option"),  # a usage error
])
def test_under_torchrun_a_bad_input_is_said_once_per_machine(monkeypatch, args, fragment):
    """torchrun starts the same command in every process, and each stopped on the same bad input with its own copy
    of the error line (8 on a machine of 8 GPUs): only LOCAL_RANK 0 says it; the others exit with the same code."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert_one_line_error(run(*args), fragment)
    monkeypatch.setenv("LOCAL_RANK", "1")
    result = run(*args)
    assert result.exit_code == 2 and result.output == ""


def test_under_torchrun_config_warnings_are_said_once_per_machine(monkeypatch):
    """The warnings of loading the config (every process loads it) came once per process too."""
    import logging

    package = logging.getLogger("rpr_mt")
    before = package.level
    monkeypatch.setenv("WORLD_SIZE", "2")
    try:
        for local_rank, level in (("1", logging.ERROR), ("0", logging.INFO)):
            monkeypatch.setenv("LOCAL_RANK", local_rank)
            run("train", "--set", "train.max_stepz=3")
            assert package.level == level
    finally:
        package.setLevel(before)  # (setLevel: it also clears the loggers' cached levels)


def test_missing_and_corrupt_checkpoints(tmp_path):
    assert_one_line_error(run("translate", "--checkpoint", str(tmp_path / "nope.pt")), "checkpoint not found")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert_one_line_error(runner.invoke(app, ["translate", "--checkpoint", str(bad)], input="a line\n"),
                          "corrupt or truncated")
    assert_one_line_error(run("average-checkpoints", str(tmp_path)), "no numbered checkpoints")
    # the input's first line is read before the model loads: its bad bytes are said, not the checkpoint's problem
    assert_one_line_error(runner.invoke(app, ["translate", "--checkpoint", str(bad)], input=b"\xff line\n"),
                          "stdin: line 1: invalid UTF-8")


def test_eval_bleu_line_count_mismatch_and_invalid_utf8(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c\n", encoding="utf-8")
    ref.write_text("a b c\nd e f\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--lang", "en")
    assert_one_line_error(result, "hyp.txt has 1 lines but")
    ref.write_bytes(b"ok\n\xff\xfe broken\n")
    hyp.write_text("a\nb\n", encoding="utf-8")
    assert_one_line_error(run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--lang", "en"),
                          "ref.txt: line 2: invalid UTF-8")


def test_eval_bleu_of_identical_files_is_100(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("the cat sat on the mat .\nein Haus am See .\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(hyp), "--json", "--lang", "en")
    assert result.exit_code == 0, result.output
    assert '"sacrebleu": 100.0' in result.output.replace("100.00000000000004", "100.0")


def test_eval_bleu_reports_the_literature_bleu_raw_or_pretokenized(tmp_path):
    """Raw text is lowercased, normalized and tokenized before the literature's BLEU; --pretokenized text is not."""
    ref, hyp = tmp_path / "ref.de", tmp_path / "hyp.txt"
    ref.write_text("Ein Hund läuft „schnell“.\n", encoding="utf-8")
    hyp.write_text("ein Hund läuft \"schnell\" .\n", encoding="utf-8")
    raw = json.loads(run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json").output.strip().splitlines()[-1])
    assert raw["lc_tok_bleu"] == pytest.approx(100.0) and raw["sacrebleu"] < 100
    assert raw["lc_tok_bleu_signature"].endswith("|prep:lc.norm.tok")
    ref.write_text("ein hund läuft &quot; schnell &quot; .\n", encoding="utf-8")
    hyp.write_text("ein hund läuft &quot; schnell &quot; .\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json", "--pretokenized")
    scores = json.loads(result.output.strip().splitlines()[-1])
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and scores["lc_tok_bleu_signature"].endswith("|prep:pretokenized")
    # without the flag, lines already tokenized are taken as they are: the same literature BLEU
    assert "Multi30k lit. BLEU" in run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref)).output


def test_eval_bleu_warns_of_tokenized_hypotheses_scored_against_raw_references(tmp_path):
    """A tok model's translations (translate writes them lowercased and tokenized) against the raw references gave
    sacreBLEU 6.82 where the literature BLEU was 33.04, with nothing said: the first number read looked like a
    failed model. Raw against raw, or tokenized against tokenized, says nothing."""
    ref, hyp, tok = tmp_path / "ref.de", tmp_path / "hyp.txt", tmp_path / "tok.de"
    ref.write_text('Ein Kind mit der Nummer "93" fährt Ski.\nZwei Hunde spielen.\n', encoding="utf-8")
    hyp.write_text("ein kind mit der nummer &quot; 93 &quot; fährt ski .\nzwei hunde spielen .\n", encoding="utf-8")
    tok.write_text(hyp.read_text(encoding="utf-8"), encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json")
    assert result.exit_code == 0, result.output
    assert f"warning: {hyp} looks like Multi30k's lowercased, Moses-tokenized text and {ref} like raw text" \
        in result.output
    assert json.loads(result.output.strip().splitlines()[-1])["lc_tok_bleu"] == pytest.approx(100.0)
    for args in (["--hyp", str(ref), "--ref", str(ref)], ["--hyp", str(hyp), "--ref", str(tok), "--pretokenized"],
                 ["--hyp", str(hyp), "--ref", str(tok)]):
        result = run("eval-bleu", *args, "--lang", "de")
        assert result.exit_code == 0 and "warning" not in result.output, result.output
    # tokenized against tokenized without --pretokenized: one line of its own, not sacreBLEU's three (which advised
    # detokenizing the text the literature scores)
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(tok), "--lang", "de")
    assert f"note: {hyp} and {tok} both look like Multi30k's lowercased, Moses-tokenized text" in result.output


def test_eval_bleu_refuses_raw_text_called_pretokenized_and_warns_of_raw_hypotheses_against_tok_references(tmp_path):
    """--pretokenized with the raw test file as --ref scored a tok model's translations 36.14 where the literature
    BLEU was 62.49, with nothing said; and raw (detokenized) translations against the tok/ reference printed a
    sacreBLEU that compares two forms, with nothing said either."""
    ref, tok = tmp_path / "ref.de", tmp_path / "tok.de"
    ref.write_text('Ein Kind mit der Nummer "93" fährt Ski.\nZwei Hunde spielen.\n', encoding="utf-8")
    tok.write_text("ein kind mit der nummer &quot; 93 &quot; fährt ski .\nzwei hunde spielen .\n", encoding="utf-8")
    for hyp, raw_side in ((tok, ref), (ref, ref)):
        assert_one_line_error(run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--pretokenized"),
                              f"{raw_side}: --pretokenized, but 2 of 2 lines look like raw text (line 1")
    assert_one_line_error(run("eval-bleu", "--hyp", str(ref), "--ref", str(tok), "--pretokenized"),
                          f"{ref}: --pretokenized, but 2 of 2 lines look like raw text")
    # one raw-looking line of the tok/ files (an abbreviation's full stop) among many is still tokenized text
    tok.write_text("zwei menschen halten einen globus von ca. 120 cm .\n"
                   + "".join(f"{i} hunde spielen .\n" for i in range(10)), encoding="utf-8")
    assert run("eval-bleu", "--hyp", str(tok), "--ref", str(tok), "--pretokenized").exit_code == 0
    ref.write_text("Zwei Menschen halten einen Globus.\n" + "".join(f"{i} Hunde spielen.\n" for i in range(10)),
                   encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(ref), "--ref", str(tok), "--json")
    assert result.exit_code == 0, result.output
    assert f"warning: {tok} looks like Multi30k's lowercased, Moses-tokenized text and {ref} like raw text" \
        in result.output


def test_eval_bleu_warns_of_lowercase_hypotheses_scored_against_cased_references(tmp_path):
    """translate detokenizes a tok model's translations of raw text, but they stay lowercase: against the raw
    references sacreBLEU read 52.6 where the literature BLEU, which lowercases both, read 62.1 (200 test lines), with
    nothing said. Cased hypotheses, or lowercase references, say nothing."""
    ref, hyp = tmp_path / "ref.de", tmp_path / "hyp.de"
    ref.write_text('Ein Kind mit der Nummer "93" fährt Ski.\nZwei Hunde spielen.\n', encoding="utf-8")
    hyp.write_text('ein kind mit der nummer "93" fährt ski.\nzwei hunde spielen.\n', encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json")
    assert result.exit_code == 0, result.output
    assert f"warning: {hyp} is all lowercase and {ref} is cased" in result.output
    scores = json.loads(result.output.strip().splitlines()[-1])
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and scores["sacrebleu"] < 100
    for h, r in ((ref, ref), (hyp, hyp)):
        result = run("eval-bleu", "--hyp", str(h), "--ref", str(r))
        assert result.exit_code == 0 and "warning" not in result.output, result.output


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


def _numbered(run_dir: Path, *steps: int) -> list[Path]:
    """Tiny numbered checkpoints of ``run_dir`` whose weights are their update number."""
    payload = {"format": ckpt.FORMAT, "config": {"model": {"d_model": 4}},
               "vocab": {"fingerprint": "x" * 64, "size": 10, "spm_model": torch.zeros(1, dtype=torch.uint8)}}
    for step in steps:
        ckpt.save_checkpoint({**payload, "step": step, "model": {"w": torch.full((2,), float(step))}},
                             ckpt.step_checkpoint_path(run_dir, step))
    return [ckpt.step_checkpoint_path(run_dir, step) for step in steps]


def test_average_checkpoints_replaces_an_existing_output_only_with_force(tmp_path):
    """RUN's default output is checkpoint_avg.pt, in a finished run the checkpoint result.json scored: a second
    average (another --last) silently replaced it. -o replaced any file, a checkpoint or not."""
    _numbered(tmp_path, 1, 2, 3)
    assert run("average-checkpoints", str(tmp_path), "--last", "3").exit_code == 0
    default = ckpt.checkpoint_dir(tmp_path) / "checkpoint_avg.pt"
    before = default.read_bytes()
    assert_one_line_error(run("average-checkpoints", str(tmp_path), "--last", "2"),
                          f"--output {default} already exists; pass --force to replace it")
    assert default.read_bytes() == before
    result = run("average-checkpoints", str(tmp_path), "--last", "2", "--force")
    assert result.exit_code == 0, result.output
    assert ckpt.load_checkpoint(default)["averaged_steps"] == [2, 3]
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    # not "pass --force" first, which --force would then refuse
    for force in ([], ["--force"]):
        assert_one_line_error(run("average-checkpoints", str(tmp_path), "--last", "3", "-o", str(text), *force),
                              f"--output {text} exists and is not an rpr-mt checkpoint; refusing to replace it")
    assert text.read_text() == "not a checkpoint\n"


def test_average_checkpoints_takes_the_newest_listed_by_update_not_by_position(tmp_path):
    old, new = _numbered(tmp_path, 5750, 6000)
    output = tmp_path / "x.pt"
    result = run("average-checkpoints", str(new), str(old), "-o", str(output))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (f"averaged 2 checkpoints ({old.name} .. {new.name}) into {output}")
    assert ckpt.load_checkpoint(output)["step"] == 6000
    assert_one_line_error(run("average-checkpoints", str(new), str(new), "-o", str(tmp_path / "y.pt")),
                          f"{new} is listed twice")
    assert not (tmp_path / "y.pt").exists()


def test_average_of_one_checkpoint_says_checkpoint(tmp_path):
    (only,) = _numbered(tmp_path, 4)
    result = run("average-checkpoints", str(tmp_path), "--last", "1")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (f"averaged 1 checkpoint ({only.name}) into "
                                              f"{ckpt.checkpoint_dir(tmp_path) / 'checkpoint_avg.pt'}")


def _tok_bleu_language(output: str) -> str:
    description = json.loads(output.strip().splitlines()[-1])["tok_bleu_description"]
    return re.search(r"tokenizer\.perl -l (\w+)", description).group(1)


def test_eval_bleu_takes_the_language_from_the_reference_suffix(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("Ein Haus am See .\n", encoding="utf-8")
    plain, gzipped = tmp_path / "newstest.de", tmp_path / "test.fr.gz"
    plain.write_text("Ein Haus am See .\n", encoding="utf-8")
    with gzip.open(gzipped, "wt", encoding="utf-8") as handle:
        handle.write("Ein Haus am See .\n")
    for ref, lang in ((plain, "de"), (gzipped, "fr")):
        result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json")
        assert result.exit_code == 0, result.output
        assert _tok_bleu_language(result.stdout) == lang
    # --lang wins over the suffix, and says so (the tokenizer's rules change the score)
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(plain), "--json", "--lang", "cs")
    assert result.exit_code == 0 and _tok_bleu_language(result.stdout) == "cs"
    assert "note: --lang cs overrides the language its name gives newstest.de (de)" in result.stderr
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(plain), "--json", "--lang", "de")
    assert result.exit_code == 0 and "overrides" not in result.stderr


def test_eval_bleu_asks_for_lang_when_the_suffix_is_not_a_language(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    assert_one_line_error(run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref)), "pass --lang")
    # --pretokenized text is not tokenized again, so no language is needed (it was asked for all the same)
    for path in (hyp, ref):
        path.write_text("zwei hunde spielen im schnee .\n", encoding="utf-8")
    result = run("eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--pretokenized", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["lc_tok_bleu"] == pytest.approx(100.0)


def test_version_is_the_package_version():
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"rpr-mt {rpr_mt.__version__}"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{rpr_mt.__version__}"' in pyproject  # one version, wherever it is read


def _commands():
    """(name, click command) of the top level and every command of the tree, as `rpr-mt` builds them."""
    import typer.main

    group = typer.main.get_command(app)
    return [("rpr-mt", group)] + sorted(group.commands.items())


def test_every_option_and_argument_of_every_command_has_help_text():
    import click

    root = click.Context(_commands()[0][1], info_name="rpr-mt")
    missing = [f"{name} {param.opts[0]}" for name, command in _commands()
               for param in command.get_params(click.Context(command, parent=root, info_name=name))
               if not (getattr(param, "help", None) or "").strip()]
    assert len(_commands()) > 5 and not missing, missing


@pytest.mark.parametrize("name", [name for name, _ in _commands()])
def test_short_help_on_every_command(name):
    command = [] if name == "rpr-mt" else [name]
    short, long = run(*command, "-h"), run(*command, "--help")
    assert short.exit_code == 0 and "Usage:" in short.output, short.output
    assert short.output == long.output


@pytest.mark.parametrize("command, usage", [
    ("average-checkpoints", "average-checkpoints [OPTIONS] INPUTS..."),
    ("export", "export [OPTIONS] CHECKPOINT"),
    ("plot", "plot [OPTIONS] RUN"),
])
def test_usage_line_names_arguments_without_braces(command, usage):
    # typer 0.29 writes a required argument as {NAME}, which reads as a set or a template; click and the README
    # write NAME
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    assert usage in " ".join(result.output.split()) and "{" not in result.output, result.output


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_short_and_long_version(flag):
    result = run(flag)
    assert result.exit_code == 0 and result.stdout.strip() == f"rpr-mt {rpr_mt.__version__}"


def test_train_help_says_config_is_optional_and_where_set_keys_are():
    text = " ".join(run("train", "--help").output.replace("│", " ").split())
    assert "Optional: without it every setting has its default" in text
    assert "rpr_mt/config.py" in text
    assert "docs/configuration.md" in text and (Path(__file__).parents[1] / "docs" / "configuration.md").is_file()


@pytest.mark.parametrize("command", ["translate", "eval-bleu", "export"])
def test_help_says_which_checkpoint_a_run_directory_gives_by_default(command):
    # the default of --which is None (so that a given value can be told from the default); the help must say it
    text = " ".join(run(command, "--help").output.replace("│", " ").split())
    assert "--which" in text and "best (the default)" in text, text


def test_best_of_a_run_without_a_best_checkpoint_is_said_to_be_the_newest(tmp_path):
    """A run that has not validated yet has no checkpoint_best.pt: best (the default) silently loaded the newest
    numbered checkpoint, which --help did not say. It is said, for the default and for --which best."""
    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    folder = ckpt.checkpoint_dir(tmp_path / "run")
    folder.mkdir(parents=True)
    for step in (4, 8):
        ckpt.save_checkpoint(ckpt.load_checkpoint(fixture), folder / f"checkpoint_{step:08d}.pt")
    note = f"note: {folder} has no checkpoint_best.pt (no validation has saved one yet); loading its newest numbered"
    for which in ([], ["--which", "best"]):
        result = runner.invoke(app, ["translate", "--checkpoint", str(tmp_path / "run"), "--beam-size", "1", *which],
                               input="a\n")
        assert result.exit_code == 0, result.output
        assert note in result.output and "checkpoint_00000008.pt" in result.output
    result = runner.invoke(app, ["translate", "--checkpoint", str(tmp_path / "run"), "--beam-size", "1", "--which",
                                 "last"], input="a\n")
    assert result.exit_code == 0 and note not in result.output, result.output


@pytest.mark.parametrize("command", [[], ["train"], ["prepare"], ["eval-bleu"], ["average-checkpoints"]])
def test_help_shows_flags_without_a_type(command):
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_boolean_flags_parse_the_typer_way(monkeypatch):
    from rpr_mt.train import trainer

    seen = {}

    class Done:
        stopped_by = "max_steps"

    def fake_train(cfg, **kwargs):
        seen.update(kwargs)
        return Done()

    monkeypatch.setattr(trainer, "train", fake_train)
    assert run("train", "--dry-run", "--no-progress", "--more-steps", "7").exit_code == 0
    assert seen == {"overwrite": False, "dry_run": True, "progress": False, "more_steps": 7}
    assert run("train", "--progress").exit_code == 0 and seen["progress"] is True and seen["dry_run"] is False
    # no option: rpr_mt.progress.show_progress decides, as for every command; CliRunner's stderr is no terminal
    assert run("train").exit_code == 0 and seen["progress"] is False and seen["more_steps"] is None
    result = run("train", "--dry-run=true")  # a flag takes no value
    assert result.exit_code == 2 and "does not take a value" in result.output


def test_export_bad_input(tmp_path):
    assert_one_line_error(run("export", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "ct2")),
                          "checkpoint not found")
    assert_one_line_error(run("export", str(tmp_path), "--output", str(tmp_path / "ct2"), "--quantization", "int3"),
                          "--quantization must be one of")
    (tmp_path / "notes.txt").write_text("not a model\n")
    assert_one_line_error(run("export", str(tmp_path), "--output", str(tmp_path), "--force"),
                          "not a CTranslate2 model directory")


def test_translate_splits_sentences_unless_no_split(tmp_path, monkeypatch):
    """translate splits each line by the checkpoint's source language; --no-split turns it off; one line out per
    line in either way."""
    from rpr_mt.decode import translate

    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    src = tmp_path / "para.txt"
    src.write_text("A man rides a bike. A dog runs after him. They stop.\n\nTwo kids play.\n", encoding="utf-8")
    seen = []
    real = translate.iter_translations
    monkeypatch.setattr(translate, "iter_translations",
                        lambda *a, **k: seen.append((k["decode"].split_sentences, k["src_lang"])) or real(*a, **k))
    # a model whose config turns splitting off: --split-sentences turns it back on
    payload = ckpt.load_checkpoint(fixture)
    payload["config"]["decode"]["split_sentences"] = False
    unsplit = tmp_path / "unsplit.pt"
    ckpt.save_checkpoint(payload, unsplit)
    cases = [(fixture, []), (fixture, ["--no-split"]), (unsplit, []), (unsplit, ["--split-sentences"])]
    for i, (checkpoint, extra) in enumerate(cases):
        out = tmp_path / f"out{i}.txt"
        result = run("translate", "--checkpoint", str(checkpoint), "-i", str(src), "-o", str(out), "--device", "cpu",
                     *extra)
        assert result.exit_code == 0, result.output
        assert len(out.read_text(encoding="utf-8").split("\n")) == 4  # 3 lines and the final newline
    cfg_src = payload["config"]["data"]["src_lang"]
    assert seen == [(True, cfg_src), (False, cfg_src), (False, cfg_src), (True, cfg_src)]


def test_the_cli_shows_rpr_mt_info_lines_and_no_other_library_s(tmp_path):
    """A second Ctrl-C during start-up once ended in torch's "FakeTensor cache stats" lines: torch logs them at INFO
    from an atexit hook, and an interrupted import leaves torch's loggers unconfigured (level NOTSET), so an INFO
    root logger showed them. The CLI shows INFO lines of rpr_mt's own modules only."""
    script = (
        "import logging\n"
        "from rpr_mt import cli\n"
        "cli._setup(version=False)\n"
        "import torch._subclasses.fake_tensor  # registers the atexit hook that logs the stats\n"
        "logging.getLogger('torch').setLevel(logging.NOTSET)  # as an import interrupted before torch set it leaves it\n"
        "logging.getLogger('rpr_mt.data.prepare').info('an rpr_mt line')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(Path(rpr_mt.__file__).parent.parent)})
    assert result.returncode == 0, result.stderr
    assert "an rpr_mt line" in result.stderr
    assert "FakeTensor" not in result.stderr, result.stderr


def test_translate_checks_its_input_and_options_before_loading_the_model(tmp_path):
    """A model can take a minute to load: bad options, bad bytes and empty input are said first. The checkpoint
    here is corrupt, so any message but the corruption's comes from a check made before loading it."""
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    source = tmp_path / "in.txt"
    source.write_text("a sentence\n", encoding="utf-8")
    for options, fragment in [(["--beam-size", "0"], "--beam-size must be >= 1"),
                              (["--beam-size", "4", "--nbest", "5"], "--nbest must be between 1 and the beam size 4"),
                              (["--length-penalty", "nan"], "--length-penalty must be a finite number")]:
        assert_one_line_error(run("translate", "--checkpoint", str(bad), "-i", str(source), *options), fragment)
    source.write_bytes(b"ok\n\xff broken\n")
    assert_one_line_error(run("translate", "--checkpoint", str(bad), "-i", str(source)), "line 2: invalid UTF-8")
    source.write_text("", encoding="utf-8")
    assert_one_line_error(run("translate", "--checkpoint", str(bad), "-i", str(source)), "no lines to translate")


def test_which_with_a_checkpoint_file_is_said_to_be_unused(tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    result = runner.invoke(app, ["translate", "--checkpoint", str(bad), "--which", "average"], input="a line\n")
    assert "warning: --which average chooses within a run directory" in result.output
    assert "corrupt or truncated" in result.output  # and the file itself was what it loaded
    quiet = runner.invoke(app, ["translate", "--checkpoint", str(bad)], input="a line\n")
    assert "warning" not in quiet.output


def test_eval_bleu_refuses_checkpoint_options_with_hyp_and_ref(tmp_path):
    """--hyp is scored as it is: options that change how a checkpoint translates would silently do nothing."""
    ref = tmp_path / "ref.de"
    ref.write_text("ein hund läuft über die wiese .\n", encoding="utf-8")
    for options in (["--split", "dev"], ["--which", "last"], ["--beam-size", "0"], ["--length-penalty", "-3"],
                    ["--min-length", "2"], ["--device", "cuda"]):
        assert_one_line_error(run("eval-bleu", "--hyp", str(ref), "--ref", str(ref), *options),
                              f"{options[0]} goes with --checkpoint")
    assert run("eval-bleu", "--hyp", str(ref), "--ref", str(ref)).exit_code == 0


def test_eval_bleu_checks_its_decoding_options_before_loading_the_model(tmp_path):
    """The checkpoint is corrupt: a message other than the corruption's comes from a check made before loading."""
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    for options, fragment in [(["--beam-size", "0"], "--beam-size must be >= 1"),
                              (["--length-penalty", "-3"], "--length-penalty must be a finite number >= 0"),
                              (["--min-length", "-1"], "--min-length must be >= 0"),
                              (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N")]:
        assert_one_line_error(run("eval-bleu", "--checkpoint", str(bad), *options), fragment)


def test_nbest_below_one_is_said_without_a_beam_size_and_cuda_n_is_a_device(tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    # the lower bound needs no model; the beam size a default config has is not this model's
    assert_one_line_error(run("translate", "--checkpoint", str(bad), "--nbest", "0"), "--nbest must be >= 1 (got 0)")
    if not torch.cuda.is_available():
        assert_one_line_error(run("translate", "--checkpoint", str(bad), "--device", "cuda:0"),
                              "--device cuda:0: no CUDA device is available")


def _tok_multi30k_model(tmp_path: Path) -> Path:
    """The fixture checkpoint with its config made a tok/ Multi30k En-De one (its weights do not matter here)."""
    payload = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de")
    model = tmp_path / "tok_model.pt"
    ckpt.save_checkpoint(payload, model)
    return model


def test_a_model_of_tokenized_multi30k_gets_raw_lines_tokenized(tmp_path, monkeypatch):
    """A model trained on the dataset's lowercased, Moses-tokenized text translated raw sentences markedly worse:
    translate gives it raw-looking lines as that text is, says so, keeps tokenized lines, and --no-tokenize turns it
    off. (The fixture's config is made a tok/ Multi30k one; its weights do not matter here.)"""
    from rpr_mt.decode import translate

    model = _tok_multi30k_model(tmp_path)
    src = tmp_path / "in.en"
    src.write_text("A man rides a bike.\na boy sits on a woman &apos;s shoulders .\n", encoding="utf-8")
    seen = []
    real = translate.iter_translations
    monkeypatch.setattr(translate, "iter_translations", lambda model, vocab, lines, **k: seen.append(list(lines))
                        or real(model, vocab, seen[-1], **k))
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(tmp_path / "out.de"))
    assert result.exit_code == 0, result.output
    assert seen[-1] == ["a man rides a bike .", "a boy sits on a woman &apos;s shoulders ."]
    assert "1 of 2 input lines looked like raw text" in result.output
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(tmp_path / "out.de"),
                 "--no-tokenize")
    assert result.exit_code == 0, result.output
    assert seen[-1][0] == "A man rides a bike." and "looked like raw text" not in result.output


def test_a_tok_models_translations_of_raw_lines_are_detokenized(tmp_path, monkeypatch):
    """Raw text in gave Moses-tokenized, escaped text out (``l&apos; équipe .``): the translations of the lines
    translate tokenized are detokenized back, those of lines given tokenized stay as the model wrote them, and
    --no-detokenize keeps all in the model's form; n-best entries find their line by their number."""
    from rpr_mt.decode import translate

    model = _tok_multi30k_model(tmp_path)  # an en->de model: the German detokenizer
    src = tmp_path / "in.en"
    src.write_text("A man's bike.\na man &apos;s bike .\nTwo dogs.\n", encoding="utf-8")

    def fixed(model, vocab, lines, decode, **kwargs):  # the model's form, whatever the input
        for index, _ in enumerate(lines):  # read lazily, as the real one reads window by window
            if decode.nbest == 1:
                yield "ein &quot; mann &quot; ."
            else:
                yield from (f"{index}\t-0.5000\tein &quot; mann &quot; ." for _ in range(decode.nbest))

    monkeypatch.setattr(translate, "iter_translations", fixed)
    out = tmp_path / "out.de"
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--buffer-lines", "2")
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == ['ein "mann".', "ein &quot; mann &quot; .", 'ein "mann".']
    assert "2 of 3 input lines looked like raw text" in result.output and "detokenized back" in result.output
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--no-detokenize")
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == ["ein &quot; mann &quot; ."] * 3
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--beam-size", "2",
                 "--nbest", "2")
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[2] for line in out.read_text(encoding="utf-8").splitlines()] == \
        ['ein "mann".'] * 2 + ["ein &quot; mann &quot; ."] * 2 + ['ein "mann".'] * 2
    # a lowercase line without punctuation, typed alone: plain text out too (it came back as `ein &quot; mann ...`)
    src.write_text("the man sits on the bench\n", encoding="utf-8")
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == ['ein "mann".']


def test_an_interrupted_translation_by_a_tok_model_still_says_how_many_lines_it_tokenized(tmp_path, monkeypatch):
    """The note on raw-looking lines tokenized for a tok/ Multi30k model came only after a complete run: stopped by
    Ctrl-C (or SIGTERM, the same KeyboardInterrupt), the lines kept in OUTPUT.partial had been tokenized unsaid."""
    from rpr_mt.decode import translate

    model = _tok_multi30k_model(tmp_path)
    src = tmp_path / "in.en"
    src.write_text("A man rides a bike.\na boy sits on a woman &apos;s shoulders .\nTwo dogs play.\n", encoding="utf-8")

    def stopped(model, vocab, lines, **kwargs):
        lines = iter(lines)
        for _ in range(2):  # the first window (--buffer-lines 2) is read, and tokenized, before the interrupt
            yield next(lines)
        raise KeyboardInterrupt

    monkeypatch.setattr(translate, "iter_translations", stopped)
    out = tmp_path / "out.de"
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--buffer-lines", "2",
                 "--no-detokenize")  # the outputs are the inputs as the model got them
    assert result.exit_code == 130, result.output
    assert (tmp_path / "out.de.partial").read_text(encoding="utf-8").splitlines()[0] == "a man rides a bike ."
    assert "note: 1 of 2 input lines read so far looked like raw text" in result.output


def test_eval_bleu_of_a_tokenized_multi30k_model_against_a_raw_reference(tmp_path, monkeypatch):
    """Such a model translates into Multi30k's tokenized text; with a raw --ref (the dataset's test.de.gz) the
    literature BLEU was scored as if the reference were tokenized too (prep:pretokenized: 0 where the translations
    were perfect). The raw reference is now tokenized as the dataset's script does, and that is said."""
    from rpr_mt.decode import translate

    payload = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    data = tmp_path / "data"
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de", output_dir=str(data))
    model = tmp_path / "tok_model.pt"
    ckpt.save_checkpoint(payload, model)
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"sentencepiece": {"model_sha256": payload["vocab"]["fingerprint"]}}))
    # the tok/ files' few raw-looking lines (an abbreviation's full stop): one such line took the model's own
    # reference (and its translations) for raw text and tokenized them again (dev 41.12 for 41.76)
    tokenized = ["ein kind mit der nummer &quot; 93 &quot; fährt ski .", "ein globus von ca. 120 cm ."] + [
        f"{i} hunde spielen ." for i in range(10)]
    (data / "test.en").write_text("".join(f"source {i} .\n" for i in range(len(tokenized))))
    (data / "test.de").write_text("\n".join(tokenized) + "\n")
    raw = tmp_path / "test.de"
    raw.write_text('Ein Kind mit der Nummer "93" fährt Ski.\nEin Globus von ca. 120 cm.\n'
                   + "".join(f"{i} Hunde spielen.\n" for i in range(10)))
    monkeypatch.setattr(translate, "translate_lines", lambda *args, **kwargs: list(tokenized))
    result = run("eval-bleu", "--checkpoint", str(model), "--json")  # the split's own (tokenized) reference
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output.splitlines()[-1])
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and scores["lc_tok_bleu_signature"].endswith("pretokenized")
    result = run("eval-bleu", "--checkpoint", str(model), "--ref", str(raw), "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output.splitlines()[-1])
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and scores["lc_tok_bleu_signature"].endswith("lc.norm.tok")
    assert f"note: {raw} is raw text" in result.output


def test_an_interrupted_translation_keeps_its_finished_lines_in_a_partial_file(tmp_path, monkeypatch):
    """translate writes window by window; stopped midway (Ctrl-C, an error), the lines done so far are kept in
    OUTPUT.partial and an existing OUTPUT is left as it was."""
    from rpr_mt.decode import translate

    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    src = tmp_path / "in.en"
    src.write_text("one\ntwo\nthree\n", encoding="utf-8")
    out = tmp_path / "out.de"
    out.write_text("an earlier translation\n", encoding="utf-8")

    def stopped(*args, **kwargs):
        yield "eins"
        yield "zwei"
        raise KeyboardInterrupt

    monkeypatch.setattr(translate, "iter_translations", stopped)
    result = run("translate", "--checkpoint", str(fixture), "-i", str(src), "-o", str(out))
    assert result.exit_code == 130, result.output
    assert "the 2 output lines written so far are in" in result.output
    assert (tmp_path / "out.de.partial").read_text(encoding="utf-8") == "eins\nzwei\n"
    assert out.read_text(encoding="utf-8") == "an earlier translation\n"
    assert not list(tmp_path.glob(".*.tmp"))
    assert_one_line_error(run("translate", "--checkpoint", str(fixture), "-i", str(src), "--buffer-lines", "0"),
                          "--buffer-lines must be >= 1")


def test_a_complete_translation_removes_the_partial_file_of_an_earlier_interrupted_run(tmp_path, monkeypatch):
    """An interrupted run leaves OUTPUT.partial; the same command run to the end wrote OUTPUT and left the stale
    OUTPUT.partial beside it, where it looked like this run's unfinished output. The complete file supersedes it."""
    from rpr_mt.decode import translate

    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    src = tmp_path / "in.en"
    src.write_text("one\ntwo\nthree\n", encoding="utf-8")
    out, partial = tmp_path / "out.de", tmp_path / "out.de.partial"

    def stopped(*args, **kwargs):
        yield "eins"
        raise KeyboardInterrupt

    monkeypatch.setattr(translate, "iter_translations", stopped)
    assert run("translate", "--checkpoint", str(fixture), "-i", str(src), "-o", str(out)).exit_code == 130
    assert partial.read_text(encoding="utf-8") == "eins\n" and not out.exists()
    monkeypatch.setattr(translate, "iter_translations", lambda *args, **kwargs: iter(["eins", "zwei", "drei"]))
    result = run("translate", "--checkpoint", str(fixture), "-i", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == "eins\nzwei\ndrei\n"
    assert not partial.exists() and f"removed {partial}" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "out.de"]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_translation_stopped_by_sigterm_or_sighup_keeps_its_finished_lines(tmp_path, signame):
    """`timeout`, a batch scheduler's time limit (SIGTERM) or a closed terminal (SIGHUP) stop translate as Ctrl-C
    does: the finished lines in OUTPUT.partial, an existing OUTPUT as it was, no temporary left, exit 128 + signal.
    Their default ended the process at once, losing the lines and leaving the hidden temporary behind. In a child
    process: without the handling, the signal would end the test run itself."""
    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    src = tmp_path / "in.en"
    src.write_text("one\ntwo\nthree\n", encoding="utf-8")
    out = tmp_path / "out.de"
    out.write_text("an earlier translation\n", encoding="utf-8")
    script = f"""
import os, signal, sys
signal.signal(signal.{signame}, signal.SIG_DFL)  # under nohup SIGHUP arrives ignored, and translate keeps it so
from rpr_mt.decode import translate
from rpr_mt.cli import app

def stopped(*args, **kwargs):
    yield "eins"
    yield "zwei"
    os.kill(os.getpid(), signal.{signame})
    yield "drei"

translate.iter_translations = stopped
sys.argv = ["rpr-mt", "translate", "--checkpoint", {str(fixture)!r}, "-i", {str(src)!r}, "-o", {str(out)!r}]
app()
"""
    import signal

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 128 + getattr(signal, signame), (result.returncode, result.stderr)
    assert "the 2 output lines written so far are in" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "out.de.partial").read_text(encoding="utf-8") == "eins\nzwei\n"
    assert out.read_text(encoding="utf-8") == "an earlier translation\n"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_prepare_stopped_by_sigterm_removes_its_temporary_directory(tmp_path, command):
    """`timeout` or a scheduler's SIGTERM during `prepare` (or the preparing that `train` starts with) unwinds as
    Ctrl-C does: the hidden temporary directory beside data.output_dir removed, one line, exit 143. Its default ended
    the process at once, leaving a possibly corpus-sized .DIR.tmp-PID behind, silently. In a child process: without
    the handling, the signal would end the test run itself."""
    out = tmp_path / "prepared"
    script = f"""
import os, signal, sys
from rpr_mt.data import binarize
from rpr_mt.cli import app

def stopped(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)

binarize.binarize_text = stopped
sys.argv = ["rpr-mt", {command!r}, "--set", "data.output_dir={out}", "--set", "data.vocab_size=120", "--set",
            "data.demo_sizes={{train: 400, dev: 30, test: 30}}", "--set", "train.run_dir={tmp_path / 'run'}"]
app()
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 143, (result.returncode, result.stderr)
    said = {"prepare": "stopped by SIGTERM", "train": "stopped by SIGTERM before the first update; nothing to save"}
    assert result.stderr.splitlines()[-1] == said[command] and "Traceback" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".prepared.*"))


def test_translate_to_dev_null_works_and_leaves_it_a_device(tmp_path, monkeypatch):
    """`-o /dev/null` (timing a decode) writes through the device; /dev is never written beside it, and the device
    node is never replaced (as root, the rename once turned /dev/null into a regular file)."""
    import pathlib
    import stat

    real_replace = pathlib.Path.replace

    def guarded(self, target):  # a regression must fail this test, not damage the machine running it
        assert not str(target).startswith("/dev/"), f"renaming over {target}"
        return real_replace(self, target)

    monkeypatch.setattr(pathlib.Path, "replace", guarded)
    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    src = tmp_path / "in.en"
    src.write_text("one\ntwo\n", encoding="utf-8")
    try:
        result = run("translate", "--checkpoint", str(fixture), "-i", str(src), "-o", "/dev/null", "--device", "cpu")
        assert result.exit_code == 0, result.output
    finally:
        for stray in (Path("/dev/.null.tmp"), Path("/dev/null.partial")):  # what a regression would leave
            if stray.is_file() and not stray.is_symlink():
                stray.unlink()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_error_while_stdin_is_still_open_exits_cleanly(tmp_path):
    """stdin is read on a thread (ArrivingLines): through sys.stdin.buffer, a thread still blocked in it when the
    program ended on an error held the lock Python's shutdown takes to close stdin: "Fatal Python error: could not
    acquire lock for <stdin>", exit 134 instead of the one-line error and exit 2."""
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    process = subprocess.Popen(
        [sys.executable, "-m", "rpr_mt.cli", "translate", "--checkpoint", str(bad), "--device", "cpu"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(rpr_mt.__file__).parent.parent), "OMP_NUM_THREADS": "1"})
    try:
        process.stdin.write("the dog\n")  # the first line is in, so the model loads, and stdin stays open
        process.stdin.flush()
        assert process.wait(timeout=240) == 2
        err = process.stderr.read()
        assert "is corrupt or truncated" in err and "Fatal" not in err, err
    finally:
        process.kill()
        process.wait()


def test_translate_with_stdin_closed_is_one_line_error(tmp_path):
    """`rpr-mt translate <&-` (descriptor 0 closed: Python's sys.stdin is None) ended in a traceback."""
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    done = subprocess.run(
        [sys.executable, "-m", "rpr_mt.cli", "translate", "--checkpoint", str(bad)], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=240, preexec_fn=lambda: os.close(0),
        env={**os.environ, "PYTHONPATH": str(Path(rpr_mt.__file__).parent.parent), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: stdin is closed: nothing to read (give the input with --input FILE)"


def test_translate_streams_stdin_window_by_window(tmp_path):
    """`(echo a; sleep 8; echo b) | rpr-mt translate --buffer-lines 1` printed both lines after 8 s: the whole of stdin
    was read first. Then, with the default window (2,000 lines), a line written by a program that waits for its
    translation was not translated until 1,999 more came or stdin was closed. Each line's translation must come back
    while stdin is still open, at the default window size (tests/decode/test_arriving.py)."""
    import select

    fixture = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
    process = subprocess.Popen(
        [sys.executable, "-m", "rpr_mt.cli", "translate", "--checkpoint", str(fixture), "--device", "cpu",
         "--no-progress"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(rpr_mt.__file__).parent.parent), "OMP_NUM_THREADS": "1"})
    try:
        for line in ("the dog", "the old farmer"):
            process.stdin.write(line + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 240)  # start-up loads torch and the model
            assert ready, f"no translation of {line!r} while stdin stays open"
            process.stdout.readline()
        process.stdin.close()
        assert process.wait(timeout=60) == 0 and process.stdout.read() == ""
    finally:
        process.kill()
        process.wait()


def test_eval_bleu_on_a_run_without_its_data_names_the_prepare_command(tmp_path, monkeypatch):
    """The data of a run trained elsewhere is not prepared here: the error said `rpr-mt prepare` without saying with
    which config; a run directory has its own."""
    payload = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    payload["config"]["data"]["output_dir"] = str(tmp_path / "not_prepared")
    run_dir = tmp_path / "run"
    ckpt.save_checkpoint(payload, ckpt.checkpoint_dir(run_dir) / "checkpoint_best.pt")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(payload["config"]), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(run("eval-bleu", "--checkpoint", str(run_dir)),
                          f"prepare the data first (rpr-mt prepare --config {run_dir / 'config.yaml'})")


def test_a_config_kept_as_a_new_runs_config_yaml_is_refused_not_replaced(tmp_path):
    """The run writes its resolved config to run_dir/config.yaml: a user's own config kept there was refused as 'a
    run with a different config' (defaults filled in), and --overwrite replaced it, comments and all."""
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    config = run_dir / "config.yaml"
    text = f"# my experiment\ntrain:\n  run_dir: {run_dir}\n  max_steps: 2\n"
    config.write_text(text, encoding="utf-8")
    for extra in ([], ["--overwrite"]):
        assert_one_line_error(run("train", "--config", str(config), *extra),
                              "is train.run_dir's config.yaml, where the run writes its resolved config")
    assert config.read_text(encoding="utf-8") == text


def _with_casing(payload: dict, words: dict) -> dict:
    from rpr_mt.text.casing import Casing

    text = Casing("de", words).to_json().encode("utf-8")
    payload["vocab"]["casing_model"] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return payload


def test_a_tok_models_translations_of_raw_lines_are_recased_unless_no_recase(tmp_path, monkeypatch):
    """A model trained on Multi30k's lowercased text answered raw text in lowercase (cased sacreBLEU 8.45 where the
    lowercased score was 41.85: German capitalises nouns): the casing model its checkpoint carries recases the
    detokenized translations of raw lines; lines given tokenized, --no-recase and --no-detokenize keep lowercase."""
    from rpr_mt.decode import translate

    model = _tok_multi30k_model(tmp_path)
    ckpt.save_checkpoint(_with_casing(ckpt.load_checkpoint(model), {"mann": "Mann", "hut": "Hut"}), model)
    src = tmp_path / "in.en"
    src.write_text("A man's hat.\na man &apos;s hat .\n", encoding="utf-8")

    def fixed(model, vocab, lines, decode, **kwargs):
        for _ in lines:
            yield "ein mann mit &quot; hut &quot; . zwei hunde ."

    monkeypatch.setattr(translate, "iter_translations", fixed)
    out = tmp_path / "out.de"
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == [
        'Ein Mann mit "Hut". Zwei hunde.', "ein mann mit &quot; hut &quot; . zwei hunde ."]
    assert "detokenized back and recased" in result.output
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--no-recase")
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines()[0] == 'ein mann mit "hut". zwei hunde.'
    assert "detokenized back, lowercase" in result.output
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out), "--no-detokenize")
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == ["ein mann mit &quot; hut &quot; . zwei hunde ."] * 2


def test_an_old_tok_checkpoint_takes_the_casing_model_of_its_data_or_says_it_has_none(tmp_path, monkeypatch):
    """A checkpoint from before casing models takes the one its prepared data (data.output_dir, with its
    vocabulary) holds; with none there either, its output stays lowercase, and that is said."""
    from rpr_mt.decode import translate
    from rpr_mt.text import casing

    payload = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    data = tmp_path / "data"
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de", output_dir=str(data))
    assert "casing_model" not in payload["vocab"]
    model = tmp_path / "tok_model.pt"
    ckpt.save_checkpoint(payload, model)
    data.mkdir()
    manifest = {"sentencepiece": {"model_sha256": payload["vocab"]["fingerprint"]}}
    (data / "manifest.json").write_text(json.dumps(manifest))
    src = tmp_path / "in.en"
    src.write_text("A dog.\n", encoding="utf-8")
    monkeypatch.setattr(translate, "iter_translations",
                        lambda model, vocab, lines, **kwargs: ("ein hund ." for _ in lines))
    out = tmp_path / "out.de"
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == "ein hund.\n"
    assert "still lowercase: neither the checkpoint nor its prepared data has a casing model" in result.output
    casing.save(casing.Casing("de", {"hund": "Hund"}), data / casing.FILE_NAME)
    result = run("translate", "--checkpoint", str(model), "-i", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == "Ein Hund.\n" and "recased" in result.output


def test_eval_bleu_of_a_tok_model_with_a_casing_model_reports_recased_sacrebleu_against_a_raw_reference(
        tmp_path, monkeypatch):
    """Against the raw reference, sacreBLEU of the tokenized, lowercased translations says nothing of a system that
    answers raw text cased: eval-bleu adds the sacreBLEU of the translations as translate gives them for raw text
    (detokenized and recased), beside the literature BLEU; against the tokenized reference there is no such line."""
    from rpr_mt.decode import translate

    payload = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    data = tmp_path / "data"
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de", output_dir=str(data))
    model = tmp_path / "tok_model.pt"
    ckpt.save_checkpoint(_with_casing(payload, {"kind": "Kind", "nummer": "Nummer", "ski": "Ski", "hunde": "Hunde"}),
                         model)
    data.mkdir()
    manifest = {"sentencepiece": {"model_sha256": payload["vocab"]["fingerprint"]}}
    (data / "manifest.json").write_text(json.dumps(manifest))
    tokenized = ["ein kind mit der nummer &quot; 93 &quot; fährt ski ."] + [f"{i} hunde spielen ." for i in range(10)]
    (data / "test.en").write_text("".join(f"source {i} .\n" for i in range(len(tokenized))))
    (data / "test.de").write_text("\n".join(tokenized) + "\n")
    raw = tmp_path / "test.de"
    raw.write_text('Ein Kind mit der Nummer "93" fährt Ski.\n' + "".join(f"{i} Hunde spielen.\n" for i in range(10)))
    monkeypatch.setattr(translate, "translate_lines", lambda *args, **kwargs: list(tokenized))
    result = run("eval-bleu", "--checkpoint", str(model), "--ref", str(raw), "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output.splitlines()[-1])
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and scores["sacrebleu"] < 50
    assert scores["recased_sacrebleu"] == pytest.approx(100.0) and scores["recased_chrf"] == pytest.approx(100.0)
    result = run("eval-bleu", "--checkpoint", str(model), "--ref", str(raw))
    assert result.exit_code == 0, result.output
    assert re.search(r"^sacreBLEU, recased +100\.00 ", result.output, re.M)
    result = run("eval-bleu", "--checkpoint", str(model), "--json")  # the split's own tokenized reference
    assert result.exit_code == 0, result.output
    assert "recased_sacrebleu" not in json.loads(result.output.splitlines()[-1])


def test_a_tiny_model_trained_on_lowercased_multi30k_answers_raw_text_recased(tmp_path):
    """End to end: prepare learns the casing model, training puts it into the checkpoint, and translate of raw text
    gives the model's tokenized output recased and detokenized (--no-recase: detokenized only), whatever the
    prepared data holds by then."""
    import shutil

    from rpr_mt.config import config_from_dict
    from rpr_mt.data.prepare import prepare
    from rpr_mt.text.multi30k import detokenize_multi30k
    from rpr_mt.text import casing
    from rpr_mt.train.trainer import train
    from tests.data import multi30k_tok_corpus

    data = multi30k_tok_corpus(tmp_path / "m30k")
    prepare(data, progress=False)
    cfg = config_from_dict({
        "data": {"source": "multi30k", "multi30k_dir": data.multi30k_dir, "multi30k_text": "tok",
                 "output_dir": data.output_dir, "vocab_size": 80},
        "model": {"d_model": 32, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64, "dropout": 0.0,
                  "clip": 4, "max_positions": 64},
        "train": {"run_dir": str(tmp_path / "run"), "max_tokens": 400, "max_steps": 40, "log_every": 40,
                  "save_every": 40, "validate_every": 1000, "valid_bleu": False, "peak_lr": 5e-3, "warmup_steps": 5,
                  "label_smoothing": 0.0, "num_threads": 1, "seed": 3},
        "decode": {"beam_size": 2},
    })
    train(cfg, progress=False)
    checkpoint = ckpt.list_step_checkpoints(tmp_path / "run")[-1]
    model = casing.load(Path(data.output_dir) / casing.FILE_NAME)
    assert ckpt.load_checkpoint(checkpoint)["vocab"]["casing_model"].numpy().tobytes() == \
        (Path(data.output_dir) / casing.FILE_NAME).read_bytes()
    shutil.rmtree(data.output_dir)  # the checkpoint carries what translate needs

    src = tmp_path / "in.en"
    src.write_text("A dog runs in the park.\nThe old man reads a book.\n", encoding="utf-8")
    outputs = {}
    for option in ("--recase", "--no-recase", "--no-detokenize"):
        out = tmp_path / f"out{option}.de"
        result = run("translate", "--checkpoint", str(checkpoint), "-i", str(src), "-o", str(out), option)
        assert result.exit_code == 0, result.output
        outputs[option] = out.read_text(encoding="utf-8").splitlines()
    tokenized = outputs["--no-detokenize"]
    assert any(line.strip() for line in tokenized) and all(line == line.lower() for line in tokenized)
    assert outputs["--no-recase"] == detokenize_multi30k(tokenized, "de")
    assert outputs["--recase"] == detokenize_multi30k([model.recase(line) for line in tokenized], "de")
    assert outputs["--recase"] != outputs["--no-recase"]  # each line's first letter at least


def test_every_command_only_turns_options_into_calls():
    """A command's body (its options are its signature) stays short: policy (what to score, what to warn of, how
    files are written) lives in the library, where scripts reuse it."""
    import ast

    from rpr_mt import cli

    tree = ast.parse(Path(cli.__file__).read_text(encoding="utf-8"))
    commands = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                and any("command" in ast.unparse(d) for d in node.decorator_list)]
    assert {node.name for node in commands} >= {"translate", "eval_bleu", "train", "prepare"}
    long = {node.name: node.end_lineno - node.body[0].lineno + 1 for node in commands}
    assert all(lines <= 50 for lines in long.values()), long
