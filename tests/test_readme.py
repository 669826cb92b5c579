"""Every command in the README's code blocks works as written: an `rpr-mt` command line is parsed by the CLI (its
`--help` succeeds, so the subcommand and every option exist) and the configs and inputs it names exist; a script's
command line is parsed by the script; the install line names extras that pyproject.toml defines; the test command is
the one .ci/run runs. The own-files part of the quick tour also runs, with tiny settings. A program the README calls
that this file does not know fails the test, so that a new command gets a check."""

from __future__ import annotations

import re
import shutil
import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpr_mt.cli import app

from .scripts import load_script

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
runner = CliRunner()


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def _command_lines(body: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at && | ;"""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in lexer:
            if token in ("&&", "|", ";", "||"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [command for command in commands if command]


def readme_commands() -> list[list[str]]:
    return [command for lang, body in _code_blocks(README.read_text(encoding="utf-8")) if lang in ("bash", "sh")
            for command in _command_lines(body)]


def _ci_test_command() -> list[str]:
    lines = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return shlex.split(lines[-1])


def _named_paths(args: list[str]) -> list[str]:
    """The repository files a command line names: configs, scripts, and inputs under examples/ or results/."""
    return [arg for arg in args if re.match(r"^(configs|scripts|examples|results)/", arg)]


def _check_rpr_mt(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, f"rpr-mt {shlex.join(args)} --help: {result.output}"


def _check_script(args: list[str]) -> None:
    module = load_script(args[0])
    with pytest.raises(SystemExit) as stop:
        module.main([*args[1:], "--help"])
    assert stop.value.code == 0, f"python3 {shlex.join(args)} --help"


def _check_pip(args: list[str]) -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for arg in args:
        named = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if named:
            assert set(named.group(1).split(",")) <= set(extras), arg
        if arg.startswith("torch=="):
            assert arg in _ci_test_pins(), f"{arg}: .ci/run installs another torch"


def _ci_test_pins() -> list[str]:
    return (REPO / ".ci" / "run").read_text(encoding="utf-8").split()


def check(command: list[str]) -> None:
    program, args = command[0], command[1:]
    for path in _named_paths(args):
        assert (REPO / path).exists(), f"{shlex.join(command)}: {path} does not exist"
    if program == "rpr-mt":
        _check_rpr_mt(args)
    elif program == "torchrun":
        _check_rpr_mt(args[args.index("rpr_mt.cli") + 1:])
    elif program in ("python3", "python") and args[:2] == ["-m", "pip"]:
        _check_pip(args)
    elif program in ("python3", "python") and args[:2] == ["-m", "pytest"]:
        assert command == _ci_test_command(), f"{shlex.join(command)}: .ci/run runs {shlex.join(_ci_test_command())}"
    elif program in ("python3", "python") and args and args[0].startswith("scripts/"):
        _check_script(args)
    elif program in ("echo", "printf"):
        pass
    else:
        raise AssertionError(f"the README runs {shlex.join(command)}: add a check for {program} to {__file__}")


def test_the_readme_has_its_two_setup_commands_and_a_tour():
    commands = [shlex.join(command) for command in readme_commands()]
    assert "rpr-mt train --config configs/demo.yaml" in commands
    assert "python3 -m pytest -q" in commands
    assert "rpr-mt train --config configs/example_files.yaml" in commands
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("command", readme_commands(), ids=shlex.join)
def test_every_readme_command_parses_and_names_existing_files(command):
    check(command)


@pytest.mark.parametrize("bad", [["rpr-mt", "train", "--confg", "configs/demo.yaml"],
                                 ["rpr-mt", "train", "--config", "configs/no_such.yaml"],
                                 ["rpr-mt", "translat", "--checkpoint", "runs/demo"],
                                 ["python3", "scripts/sweep.py", "configs/demo.yaml", "--tables", "no_such_table"],
                                 ["python3", "-m", "pip", "install", "-e", ".[no_such_extra]"],
                                 ["python3", "-m", "pytest"],
                                 ["curl", "https://example.org"]])
def test_the_check_refuses_a_command_that_would_not_work(bad):
    with pytest.raises(AssertionError):
        check(bad)


def test_the_readme_links_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"^[a-z]+://", target):
            assert (REPO / target).exists(), target


def test_the_own_files_tour_runs_with_tiny_settings(tmp_path):
    """README: train on configs/example_files.yaml, translate its test source, score against its reference."""
    tiny = ["--set", f"data.output_dir={tmp_path / 'data'}", "--set", f"train.run_dir={tmp_path / 'run'}",
            "--set", "train.max_steps=2", "--set", "train.validate_every=1000", "--set", "train.save_every=2",
            "--set", "train.tensorboard=false", "--set", "data.max_train_pairs=500"]
    trained = runner.invoke(app, ["train", "--config", "configs/example_files.yaml", *tiny, "--no-progress"])
    assert trained.exit_code == 0, trained.output
    source = tmp_path / "test.en"
    source.write_text("".join((REPO / "examples/corpus/test.en").read_text(encoding="utf-8").splitlines(True)[:3]))
    reference = tmp_path / "test.de"
    reference.write_text("".join((REPO / "examples/corpus/test.de").read_text(encoding="utf-8").splitlines(True)[:3]))
    hyp = tmp_path / "test.hyp"
    translated = runner.invoke(app, ["translate", "--checkpoint", str(tmp_path / "run"), "-i", str(source),
                                     "-o", str(hyp), "--beam-size", "1", "--no-progress"])
    assert translated.exit_code == 0, translated.output
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 3
    scored = runner.invoke(app, ["eval-bleu", "--hyp", str(hyp), "--ref", str(reference), "--json"])
    assert scored.exit_code == 0 and '"sacrebleu"' in scored.output, scored.output


def _tour_commands() -> list[tuple[str, list[str]]]:
    """The README's commands on runs/demo, each as (stdin, rpr-mt arguments): `echo TEXT | rpr-mt ...` gives TEXT."""
    tour = []
    for lang, body in _code_blocks(README.read_text(encoding="utf-8")):
        for line in body.replace("\\\n", " ").splitlines():
            commands = _command_lines(line)
            if commands and commands[-1][0] == "rpr-mt" and "runs/demo" in commands[-1] and commands[-1][1] != "train":
                stdin = " ".join(commands[0][1:]) + "\n" if commands[0][0] in ("echo", "printf") else ""
                tour.append((stdin, commands[-1][1:]))
    return tour


def test_the_demo_tour_runs_on_a_tiny_demo_run_and_exports_its_first_run(tmp_path, monkeypatch):
    """README: the main job, then each quick-tour command on its run, export included (the demo's Shaw tables are
    shared across heads, which CTranslate2 holds, so the first run exports as it is)."""
    tour = _tour_commands()
    assert [args[0] for _, args in tour] == ["translate", "eval-bleu", "average-checkpoints", "eval-bleu", "plot",
                                             "export"]
    pytest.importorskip("ctranslate2", reason="the export needs ctranslate2 (the ctranslate2 or dev extra)")
    pytest.importorskip("matplotlib", reason="plot needs matplotlib (the plots or dev extra)")
    monkeypatch.chdir(tmp_path)  # runs/demo and data/demo of the README, here
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "demo.yaml", tmp_path / "configs" / "demo.yaml")
    tiny = ["--set", "data.demo_sizes.train=400", "--set", "data.demo_sizes.dev=10", "--set", "data.demo_sizes.test=10",
            "--set", "data.vocab_size=120", "--set", "train.max_steps=4", "--set", "train.save_every=1",
            "--set", "train.validate_every=4", "--set", "train.tensorboard=false"]
    trained = runner.invoke(app, ["train", "--config", "configs/demo.yaml", *tiny, "--no-progress"])
    assert trained.exit_code == 0, trained.output
    for stdin, args in tour:
        result = runner.invoke(app, args, input=stdin)
        assert result.exit_code == 0, f"rpr-mt {shlex.join(args)}: {result.output}"
    assert (tmp_path / "runs/demo/checkpoints/checkpoint_avg.pt").is_file()
    assert (tmp_path / "runs/demo/curves.png").is_file()
    assert (tmp_path / "runs/demo_ct2/model.bin").is_file() and (tmp_path / "runs/demo_ct2/spm.model").is_file()
