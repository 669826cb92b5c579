"""The configuration reference generated from the config dataclasses (rpr_mt/config_reference.py) and its page."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest

from rpr_mt.config import Config, DataConfig, ModelConfig, SplitFiles, TrainConfig
from rpr_mt.config_reference import (ConfigKey, config_keys, field_comments, render_markdown, render_text,
                                     select_keys, type_name)
from rpr_mt.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_the_generated_one():
    """docs/configuration.md is written by scripts/config_reference.py: a field, default or comment changed in
    rpr_mt/config.py without regenerating the page fails here."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render_markdown(), ("docs/configuration.md is out of date: run "
                                       "python3 scripts/config_reference.py --write docs/configuration.md")


@dataclass
class _Commented:
    plain: int = 1  # a comment beside the field
    # a comment above the field,
    # on two lines
    above: Optional[str] = None
    both: float = 2.0  # noqa-free text beside; the comment block above 'above' does not reach this field
    multi: dict[str, int] = field(  # beside the first line of a field that spans lines
        default_factory=lambda: {"a": 1}
    )

    # separated by a blank line from the field below: still the lines just above it
    last: bool = True


def test_comments_beside_and_above_fields_are_read_from_the_source():
    assert field_comments(_Commented) == {
        "plain": "a comment beside the field",
        "above": "a comment above the field, on two lines",
        "both": "noqa-free text beside; the comment block above 'above' does not reach this field",
        "multi": "beside the first line of a field that spans lines",
        "last": "separated by a blank line from the field below: still the lines just above it",
    }


def test_comments_of_the_real_config_join_lines_above_and_beside():
    keys = {key.dotted: key for key in config_keys()}
    # two comment lines above the field
    assert keys["model.positions"].meaning == ("position scheme (rpr_mt/model/positions): none | absolute | "
                                               "relative (Shaw) | absolute+relative | t5 | xl | rope | alibi")
    assert keys["train.max_steps"] == ConfigKey("train", "max_steps", "int | null", "100000",
                                                "stop after this many updates")
    assert keys["decode.beam_size"].meaning == "1 = greedy"


def _fields(cls: type, prefix: str) -> list[str]:
    names = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        names.append(f"{prefix}.{f.name}")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            names += _fields(tp, f"{prefix}.{f.name}")
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            names += _fields(typing.get_args(tp)[1], f"{prefix}.{f.name}.NAME")
    return names


def test_every_field_of_every_section_is_a_key_with_a_meaning():
    expected = [name for f in dataclasses.fields(Config) for name in _fields(typing.get_type_hints(Config)[f.name],
                                                                               f.name)]
    keys = config_keys()
    assert sorted(key.dotted for key in keys) == sorted(expected)
    assert all(key.meaning for key in keys)
    # nested sections follow their parent; a section's keys keep the dataclass's order
    sections = list(dict.fromkeys(key.section for key in keys))
    assert sections == ["data", "data.splits.NAME", "data.hub", "model", "model.t5", "model.xl", "model.rope", "train",
                        "decode"]
    assert [key.name for key in keys if key.section == "train"] == [f.name for f in dataclasses.fields(TrainConfig)]
    assert [key.name for key in keys if key.section == "data.splits.NAME"] == ["src", "tgt", "tsv"]


def test_a_field_without_a_comment_is_refused(monkeypatch):
    @dataclass
    class Bare:
        documented: int = 1  # has one
        undocumented: int = 2

    with pytest.raises(ValueError, match="Bare.undocumented"):
        monkeypatch.setattr("rpr_mt.config_reference.config_sections", lambda: [("bare", Bare)])
        config_keys()


@pytest.mark.parametrize("tp, name", [
    (int, "int"), (bool, "bool"), (str, "string"), (Optional[int], "int | null"),
    (Literal["post", "pre"], "post | pre"), (Optional[Literal["base", "big"]], "base | big | null"),
    (tuple[float, float], "[float, float]"), (dict[str, int], "mapping: name -> int"), (list[int], "[int, ...]"),
    (SplitFiles, "section"),
])
def test_type_names_read_as_a_config_file_writes_values(tp, name):
    assert type_name(tp) == name


def test_defaults_are_written_as_yaml_and_parse_back_to_the_code_s():
    import yaml

    defaults = {key.dotted: key.default for key in config_keys()}
    assert defaults["train.adam_betas"] == "[0.9, 0.98]"
    assert defaults["data.demo_sizes"] == "{train: 20000, dev: 500, test: 500}"
    assert defaults["model.t5"] == "(section)"
    for section, cls in (("data", DataConfig), ("model", ModelConfig), ("train", TrainConfig)):
        for f in dataclasses.fields(cls):
            value = getattr(cls(), f.name)
            if not dataclasses.is_dataclass(value):
                parsed = yaml.safe_load(defaults[f"{section}.{f.name}"])
                assert parsed == (list(value) if isinstance(value, tuple) else value), f"{section}.{f.name}"


def test_the_page_escapes_table_pipes_and_angle_brackets():
    page = render_markdown()
    row = next(line for line in page.splitlines() if line.startswith("| `positions` |"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 5  # four cells: the pipes of the type and meaning are escaped
    assert "`relative \\| absolute \\|" in row
    assert '"source\\<TAB>target"' in page


def test_select_keys_by_section_key_or_nested_section():
    assert [key.dotted for key in select_keys("model.t5")] == ["model.t5.num_buckets", "model.t5.max_distance",
                                                               "model.t5.per_layer"]
    assert [key.dotted for key in select_keys("train.max_steps")] == ["train.max_steps"]
    model = [key.dotted for key in select_keys("model")]
    assert "model.d_model" in model and "model.rope.base" in model and not any(k.startswith("train") for k in model)
    with pytest.raises(UserError, match="no config section or key 'trian'.*did you mean 'train'"):
        select_keys("trian")


def test_the_text_listing_has_one_line_a_key_under_its_section():
    text = render_text(select_keys("decode"))
    lines = text.splitlines()
    assert lines[0].startswith("[decode]  Beam search")
    assert "decode.beam_size = 4  (int)  1 = greedy" in lines
    assert len(lines) == 1 + len(select_keys("decode"))


def _script():
    spec = importlib.util.spec_from_file_location("config_reference_script", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_writes_the_page_and_checks_it(tmp_path, capsys):
    script, page = _script(), tmp_path / "configuration.md"
    assert script.main(["--check", str(page)]) == 1  # missing
    page.write_text("# Configuration reference\nstale\n", encoding="utf-8")
    assert script.main(["--check", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert script.main(["--write", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == render_markdown()
    assert script.main(["--check", str(page)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["configuration.md"]  # no temporary left
