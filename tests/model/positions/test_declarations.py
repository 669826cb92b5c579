"""The declarations of rpr_mt/model/positions/schemes.py against the classes, the config and the exporter: one name
list everywhere, each settings section where the config holds it, and declarations the config can read without
torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from rpr_mt.config import ModelConfig, config_from_dict
from rpr_mt.errors import UserError
from rpr_mt.model.positions import SCHEMES
from rpr_mt.model.positions.build import CLASSES, build_position_scheme
from rpr_mt.model.positions.schemes import CT2_ALIBI_BIAS, CT2_ENCODINGS, CT2_ROTARY, CT2_SHAW, CT2_T5_BIAS, \
    Unexportable

PACKAGE = Path(__file__).resolve().parents[3] / "rpr_mt" / "model" / "positions"
LAYOUTS = {CT2_ENCODINGS, CT2_SHAW, CT2_T5_BIAS, CT2_ALIBI_BIAS, CT2_ROTARY}


def test_every_scheme_is_declared_built_and_a_choice_of_the_config():
    choices = typing.get_args(typing.get_type_hints(ModelConfig)["positions"])
    assert list(choices) == list(SCHEMES) == list(CLASSES)
    for name, scheme in SCHEMES.items():
        assert scheme.name == name and (PACKAGE / scheme.module).is_file(), name
        built = build_position_scheme(ModelConfig(d_model=16, n_heads=2, positions=name))
        assert (built.absolute is not None) == ("absolute_kind" in scheme.reads), name


def test_settings_sections_and_reads_name_fields_of_the_model_config():
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    hints = typing.get_type_hints(ModelConfig)
    for name, scheme in SCHEMES.items():
        assert set(scheme.reads) <= set(fields), name
        if scheme.settings is not None:
            assert hints[name] is scheme.settings and name in scheme.reads, name


@pytest.mark.parametrize("name", list(SCHEMES))
def test_each_scheme_says_how_ctranslate2_holds_it_or_why_not(name):
    form = SCHEMES[name].ctranslate2(ModelConfig(positions=name, share_across_heads=True))
    if name == "xl":
        assert isinstance(form, Unexportable) and "model.positions=xl" in form.reason
    elif name == "absolute+relative":  # clip > 0: refused; k = 0 carries no order and is held as encodings
        assert isinstance(form, Unexportable)
        assert SCHEMES[name].ctranslate2(ModelConfig(positions=name, clip=0)) == CT2_ENCODINGS
    else:
        assert form in LAYOUTS


def test_a_scheme_rule_is_the_config_error():
    with pytest.raises(UserError, match=r"model.positions=rope needs an even head dimension \(d_model / n_heads = 3\)"):
        config_from_dict({"model": {"positions": "rope", "d_model": 6, "n_heads": 2}})
    with pytest.raises(UserError, match="model.use_key and model.use_value cannot both be false"):
        config_from_dict({"model": {"positions": "absolute+relative", "use_key": False, "use_value": False}})
    config_from_dict({"model": {"positions": "t5", "use_key": False, "use_value": False}})  # not t5's rule
    with pytest.raises(UserError, match=r"model.t5.num_buckets must be an even number >= 4 \(got 5\)"):
        config_from_dict({"model": {"positions": "relative", "t5": {"num_buckets": 5}}})  # sections: always checked


def test_the_config_reads_the_declarations_without_torch():
    code = "import sys, rpr_mt.config; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
