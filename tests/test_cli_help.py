"""The command line's help: examples in every command's --help, the config keys listed from the CLI (the same
source as docs/configuration.md), and the details of the help text."""

from __future__ import annotations

import inspect
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rpr_mt.cli import app
from rpr_mt.config import config_from_dict, config_to_dict, load_config
from rpr_mt.config_reference import render_text, select_keys

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_help(monkeypatch):
    """Rich wraps --help at the terminal's width (80 in a test): wide, a line of help is one line of output."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 300)


def run(*args: str):
    return runner.invoke(app, list(args))


def _commands():
    """(command line, click command) of every command of the tree, groups' subcommands included."""
    import typer.main

    found = []

    def walk(name: str, command) -> None:  # noqa: ANN001 (click's command)
        found.append((name, command))
        for sub, child in sorted(getattr(command, "commands", {}).items()):
            walk(f"{name} {sub}", child)

    walk("rpr-mt", typer.main.get_command(app))
    return found


LEAVES = [name for name, command in _commands() if not hasattr(command, "commands")]


def _examples(command) -> list[str]:  # noqa: ANN001
    text = command.epilog or ""
    assert text.startswith("Examples:\n\n"), text
    return [line.strip() for line in text.split("\n\n", 1)[1].splitlines()]


@pytest.mark.parametrize("name", ["rpr-mt"] + LEAVES)
def test_every_command_s_help_ends_with_examples_one_a_line(name):
    command = dict(_commands())[name]
    result = run(*name.split()[1:], "--help")
    assert result.exit_code == 0, result.output
    shown = [line.strip() for line in result.output.splitlines()]
    examples = _examples(command)
    assert "Examples:" in shown and examples
    for example in examples:  # not refilled into one paragraph, no markup eaten
        assert example in shown, (example, result.output)


def _example_args(example: str) -> list[str] | None:
    """The arguments after `rpr-mt` in an example line (the other commands of its pipe and its redirections left
    out); None for a template (rpr-mt COMMAND --help)."""
    words = shlex.split(example, comments=True)
    segments: list[list[str]] = [[]]
    for word in words:
        if word == "|":
            segments.append([])
        else:
            segments[-1].append(word)
    args = next(segment for segment in segments if segment[:1] == ["rpr-mt"])[1:]
    while "<" in args:
        at = args.index("<")
        del args[at:at + 2]
    return None if any(word.isupper() for word in args) else args


EXAMPLES = sorted({example for _, command in _commands() if command.epilog for example in _examples(command)})


def test_examples_are_command_lines_not_templates():
    assert [example for example in EXAMPLES if _example_args(example) is None] == [
        "rpr-mt COMMAND --help                         # a command's options and examples"]


@pytest.mark.parametrize("example", [example for example in EXAMPLES if _example_args(example) is not None])
def test_every_example_parses_and_names_configs_that_exist(example):
    """Each example's options exist (`--help` after them parses the line first) and its configs are in configs/."""
    args = _example_args(example)
    result = run(*args, "--help")
    assert result.exit_code == 0, (example, result.output)
    for option, value in zip(args, args[1:]):
        if option in ("--config", "-c"):
            assert (ROOT / value).is_file(), example


def test_each_command_s_line_in_the_command_list_is_one_sentence():
    """`rpr-mt --help` lists each command with its docstring's first paragraph, line breaks kept: eval-bleu's
    description broke off mid-phrase. Each first paragraph is one line and a sentence."""
    for name, command in _commands()[1:]:
        first = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert "\n" not in first and first.endswith("."), (name, first)
    rows = [line for line in run("--help").output.splitlines() if line.startswith("│ eval-bleu ")]
    assert len(rows) == 1 and rows[0].rstrip(" │").endswith("with BLEU and chrF."), rows


def test_average_checkpoints_shows_its_inputs_as_paths_not_a_python_type():
    result = run("average-checkpoints", "--help")
    assert "list[" not in result.output and "Path]" not in result.output, result.output
    assert "INPUTS" in result.output and "<path>..." in result.output


@pytest.mark.parametrize("command", ["translate", "eval-bleu", "export"])
def test_which_and_device_list_their_choices(command):
    output = run(command, "--help").output
    row = next(line for line in output.splitlines() if "--which" in line)
    assert "<best|last|average>" in row, row
    if command != "export":
        row = next(line for line in output.splitlines() if "--device" in line)
        assert "<auto|cpu|cuda[:N]>" in row, row


def test_train_help_points_to_the_config_keys():
    text = " ".join(run("train", "--help").output.replace("│", " ").split())
    assert "`rpr-mt config keys` and docs/configuration.md list each" in text
    assert "rpr-mt config keys train" in text


# -- rpr-mt config keys / show ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("section", [None, "train", "model.t5", "decode.beam_size", "data.splits"])
def test_config_keys_prints_the_reference_s_keys(section):
    result = run("config", "keys", *([section] if section else []))
    assert result.exit_code == 0, result.output
    assert result.stdout == render_text(select_keys(section)) + "\n"


def test_config_keys_lines_read_as_the_defaults_and_comments():
    lines = run("config", "keys", "train").stdout.splitlines()
    assert "train.max_steps = 100000  (int | null)  stop after this many updates" in lines
    assert "train.adam_betas = [0.9, 0.98]  ([float, float])  Adam beta1, beta2" in lines
    all_lines = run("config", "keys").stdout.splitlines()
    keys = [line.split(" = ")[0] for line in all_lines if " = " in line and not line.startswith("[")]
    assert len(keys) == len(select_keys()) and "model.positions" in keys and "decode.buffer_lines" in keys


def test_config_keys_of_an_unknown_section_is_one_line():
    result = run("config", "keys", "trian")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: no config section or key 'trian' (did you mean 'train'?)")


def test_config_show_prints_the_resolved_validated_config_as_yaml():
    result = run("config", "show", "--config", str(ROOT / "configs" / "demo.yaml"), "--set", "train.max_steps=7",
                 "--set", "model.preset=big")
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    expected = load_config(ROOT / "configs" / "demo.yaml", ["train.max_steps=7", "model.preset=big"])
    assert shown == config_to_dict(expected) and shown["train"]["max_steps"] == 7
    assert config_from_dict(shown) == expected  # what it prints is a config that loads as the same one
    defaults = yaml.safe_load(run("config", "show").stdout)
    assert defaults == config_to_dict(load_config(None))


def test_config_show_says_a_bad_key_in_one_line():
    result = run("config", "show", "--set", "train.max_step=7")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "did you mean 'train.max_steps'" in result.output
