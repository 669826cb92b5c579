"""Config loading: typed sections, presets, overrides, and one-line errors for bad keys and values."""

import re
from pathlib import Path

import pytest

from rpr_mt.config import Config, config_from_dict, config_to_dict, load_config, save_config, yaml_value
from rpr_mt.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_and_sections(tmp_path):
    cfg = load_config(write(tmp_path, "model:\n  d_model: 64\n  n_heads: 4\ntrain:\n  max_steps: 10\n"))
    assert cfg.model.d_model == 64 and cfg.model.n_heads == 4 and cfg.train.max_steps == 10
    assert cfg.data.source == "demo" and cfg.decode.beam_size == 4


def test_preset_then_explicit_keys_override_it(tmp_path):
    cfg = load_config(write(tmp_path, "model:\n  preset: big\n  dropout: 0.1\n"))
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.ff_dim, cfg.model.clip) == (1024, 16, 4096, 8)
    assert cfg.model.share_across_heads is True
    assert cfg.model.dropout == 0.1
    base = load_config(None, ["model.preset=base"])
    assert (base.model.d_model, base.model.ff_dim, base.model.clip, base.model.share_across_heads) == (512, 1024, 16, False)


def test_set_overrides_are_typed(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  max_steps: 10\n"), ["train.max_steps=20", "train.adam_betas=[0.8, 0.9]",
                                                                    "model.positions=absolute", "train.max_time=null"])
    assert cfg.train.max_steps == 20 and cfg.train.adam_betas == (0.8, 0.9) and cfg.model.positions == "absolute"
    assert cfg.train.max_time is None


def test_int_accepted_for_float_and_lists_become_tuples():
    cfg = config_from_dict({"train": {"label_smoothing": 0, "adam_betas": [0.9, 0.98]}})
    assert isinstance(cfg.train.label_smoothing, float) and cfg.train.adam_betas == (0.9, 0.98)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model:\n  d_modle: 3\n", "unknown key 'model.d_modle' (did you mean 'model.d_model'?)"),
        ("modle:\n  d_model: 3\n", "unknown key 'modle' (did you mean 'model'?)"),
        ("model:\n  d_model: big\n", "model.d_model must be an integer"),
        ("model:\n  d_model: 500\n  n_heads: 7\n", "divisible"),
        ("model:\n  clip: -1\n", "model.clip must be >= 0"),
        ("model:\n  positions: relatve\n", "did you mean 'relative'"),
        ("train:\n  precision: 16\n", "train.precision must be one of"),
        ("decode:\n  beam_size: 0\n", "decode.beam_size must be >= 1"),
        ("decode:\n  min_length: -1\n", "decode.min_length must be >= 0"),
        ("data:\n  source: files\n", "data.splits must name a 'train' split"),
        ("data:\n  source: files\n  splits:\n    train: {src: a.txt}\n", "data.splits.train needs both"),
        ("train:\n  use_fp16: true\n", "unknown key 'train.use_fp16'"),
        ("model: [1, 2]\n", "model must be a mapping"),
        ("- a\n", "top level must be a mapping"),
        ("model:\n  d_model: [\n", "invalid YAML"),
        ("model:\n  d_model: 64\n  n_heads: 4\n  d_model: 128\n", "line 4 invalid YAML: duplicate key 'd_model' (first on line 2)"),
        ("train:\n  max_steps: 5\ntrain:\n  seed: 2\n", "duplicate key 'train' (first on line 1)"),
        ("train:\n  final_lr_fraction: -0.1\n", "train.final_lr_fraction must be in [0, 1]"),
        ("train:\n  adam_eps: -1e-9\n", "train.adam_eps must be positive"),
        ("train:\n  adam_betas: [0.9, .nan]\n", "line 2: train.adam_betas must be a finite number (got [0.9, .nan])"),
        ("decode:\n  length_penalty: -0.6\n", "decode.length_penalty must be a finite number >= 0 (got -0.6)"),
        ("decode:\n  length_penalty: .nan\n", "decode.length_penalty must be"),
        ("train:\n  peak_lr: .inf\n", "train.peak_lr must be a finite number"),
        ("train:\n  weight_decay: -0.01\n", "train.weight_decay must be >= 0"),
        ("model:\n  t5: {num_buckets: 7}\n", "model.t5.num_buckets must be an even number >= 4"),
        ("model:\n  rope: {base: 0.5}\n", "model.rope.base must be > 1"),
        ("model:\n  positions: rope\n  d_model: 12\n  n_heads: 4\n", "needs an even head dimension"),
        ("data:\n  max_train_tokens: 0\n", "data.max_train_tokens must be positive"),
        ("train:\n  adam_eps: 1e-9x\n", "train.adam_eps must be a number"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path, text, fragment):
    with pytest.raises(UserError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_exponent_without_a_dot_is_a_number(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-9 as a string; for a float key it is the number the user meant."""
    cfg = load_config(write(tmp_path, "train:\n  adam_eps: 1e-9\n  peak_lr: 3E-4\n"))
    assert cfg.train.adam_eps == 1e-9 and cfg.train.peak_lr == 3e-4


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="section.key=value"):
        load_config(None, ["train.max_steps"])
    with pytest.raises(UserError, match="did you mean 'train.max_steps'"):
        load_config(None, ["train.max_step=3"])


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(None, ["model.preset=big", "data.source=files", "data.splits.train.tsv=x.tsv"])
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert config_to_dict(again) == config_to_dict(cfg)
    assert isinstance(again, Config) and again.data.splits["train"].tsv == "x.tsv"


def test_a_home_directory_in_a_path_setting_is_expanded(tmp_path, monkeypatch):
    """`~/...` in a path setting is the home directory, from the file and from --set alike: kept as written, it made
    a directory named `~` inside the current one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  source: files\n  output_dir: ~/data\n  splits:\n    train: {src: ~/t.en, tgt: ~/t.de}\n"
                      "    dev: {tsv: ~/dev.tsv}\n", encoding="utf-8")
    cfg = load_config(config, ["train.run_dir=~/runs/x", "train.init_from=~/runs/old"])
    home = str(tmp_path / "home")
    assert cfg.data.output_dir == f"{home}/data"
    assert load_config(None, ["data.source=multi30k", "data.multi30k_dir=~/m30k"]).data.multi30k_dir == f"{home}/m30k"
    assert (cfg.data.splits["train"].src, cfg.data.splits["train"].tgt) == (f"{home}/t.en", f"{home}/t.de")
    assert cfg.data.splits["dev"].tsv == f"{home}/dev.tsv" and cfg.data.splits["dev"].src is None
    assert cfg.train.run_dir == f"{home}/runs/x" and cfg.train.init_from == f"{home}/runs/old"
    assert load_config(None).train.init_from is None  # unset stays unset
    assert load_config(None, ["train.run_dir=runs/a~b"]).train.run_dir == "runs/a~b"  # only a leading ~


def test_the_demo_job_trains_a_fixed_number_of_updates():
    # Its BLEU must not depend on how loaded the machine is: a step count and a step-based schedule, no clock.
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert cfg.train.max_steps == 1200 and cfg.train.max_time is None and cfg.train.max_epochs is None
    assert cfg.train.lr_schedule == "cosine"
    assert cfg.train.patience is None


def test_set_errors_are_named_as_set_and_suggest_the_other_toolkits_names(tmp_path):
    """An unknown --set key is --set's, not the config file's; a fairseq name gets this project's name as the
    suggestion, not the closest spelling (max_updates once suggested max_bad_updates)."""
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  max_steps: 10\n")
    with pytest.raises(UserError, match=r"^--set train.max_updates=30: unknown key 'train.max_updates' \(did you "
                                         r"mean 'train.max_steps'\?\)"):
        load_config(config, ["train.max_updates=30"])
    with pytest.raises(UserError, match=r"unknown key 'model.t5.num_bucketz' \(did you mean 'model.t5.num_buckets'"):
        load_config(config, ["model.t5.num_bucketz=3"])
    with pytest.raises(UserError, match=r"c.yaml: unknown key 'train.lr' \(did you mean 'train.peak_lr'\?\)"):
        config.write_text("train:\n  lr: 0.001\n")
        load_config(config, [])


def test_yaml_1_1_booleans_are_text_in_text_fields(tmp_path):
    """`tgt_lang: no` is Norwegian, not False (YAML 1.2 booleans: true/false only); a number where text is wanted
    stays an error (YAML 1.1 has already changed its spelling); a bool field still wants true or false."""
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  tgt_lang: no\n")
    assert load_config(config, []).data.tgt_lang == "no"
    with pytest.raises(UserError, match=r"train.run_dir must be a string, got 8"):  # YAML 1.1's 010: not "010"
        load_config(config, ["train.run_dir=010"])
    assert load_config(None, ["data.src_lang=no"]).data.src_lang == "no"
    assert load_config(None, ["train.valid_bleu=false"]).train.valid_bleu is False
    with pytest.raises(UserError, match=r"train.valid_bleu must be true or false, got 'yes'"):
        load_config(None, ["train.valid_bleu=yes"])


def test_a_validation_split_under_another_name_is_refused():
    """A files split named 'valid' was prepared and never used: no validation, no best checkpoint, no warning."""
    splits = {"train": {"src": "a.en", "tgt": "a.de"}, "valid": {"src": "v.en", "tgt": "v.de"}}
    with pytest.raises(UserError, match=r"data.splits.valid: the validation split is named 'dev'"):
        config_from_dict({"data": {"source": "files", "splits": splits}})
    splits["dev"] = splits["valid"]  # beside a dev split, another set of that name is the user's own
    assert "valid" in config_from_dict({"data": {"source": "files", "splits": splits}}).data.splits


def test_a_whole_section_or_a_key_below_a_value_in_set_is_named_as_set(tmp_path):
    """`--set model.t5=3` gives a number to a section: --set's error, not the config file's (which was named, though
    it holds no t5 at all); so are a key below a plain value and an unknown key inside a split."""
    config = write(tmp_path, "train:\n  max_steps: 10\n")
    with pytest.raises(UserError, match=r"^--set model.t5=3: model.t5 is a section, not a value; set one of its keys "
                                        r"\(num_buckets, max_distance, per_layer\), e.g. --set model.t5.num_buckets="):
        load_config(config, ["model.t5=3"])
    with pytest.raises(UserError, match=r"^--set data.splits=x.en: data.splits is a mapping, not a value"):
        load_config(config, ["data.splits=x.en"])
    with pytest.raises(UserError, match=r"^--set data.splits.train=x.en: data.splits.train is a section"):
        load_config(config, ["data.source=files", "data.splits.train=x.en"])
    with pytest.raises(UserError, match=r"^--set model.d_model.x=3: model.d_model is a value, not a section"):
        load_config(config, ["model.d_model.x=3"])
    with pytest.raises(UserError, match=r"^--set data.splits.train.srcc=a.en: unknown key 'data.splits.train.srcc' "
                                        r"\(did you mean 'data.splits.train.src'\?\)"):
        load_config(config, ["data.source=files", "data.splits.train.srcc=a.en"])
    # a mapping (or null: the defaults) still replaces a section whole, and a split's keys are set one by one
    assert load_config(config, ["model.t5={num_buckets: 8}"]).model.t5.num_buckets == 8
    assert load_config(config, ["model.t5=null"]).model.t5.num_buckets == 32
    assert load_config(config, ["data.demo_sizes.train=7"]).data.demo_sizes["train"] == 7


def test_set_on_a_mapping_entry_keeps_the_other_entries_and_null_removes_one(tmp_path):
    """--set data.demo_sizes.train=7 with no file (or a file without demo_sizes) kept only the train entry: dev and
    test vanished, and the run trained without validation. A mapping absent from the file starts from its default;
    null on an entry removes it (a split has no null value), as `--set data.splits.test=null` reads."""
    assert load_config(None, ["data.demo_sizes.train=7"]).data.demo_sizes == {"train": 7, "dev": 500, "test": 500}
    assert load_config(None, ["data.demo_sizes.test=null"]).data.demo_sizes == {"train": 20000, "dev": 500}
    config = tmp_path / "files.yaml"
    config.write_text("data:\n  source: files\n  splits:\n    train: {src: a.en, tgt: a.de}\n"
                      "    test: {src: b.en, tgt: b.de}\n")
    assert list(load_config(config, ["data.splits.test=null"]).data.splits) == ["train"]
    splits = load_config(config, ["data.splits.dev.src=c.en", "data.splits.dev.tgt=c.de"]).data.splits
    assert (splits["dev"].src, splits["dev"].tgt, list(splits)) == ("c.en", "c.de", ["train", "test", "dev"])
    with pytest.raises(UserError, match="data.splits must name a 'train' split"):
        load_config(config, ["data.splits.train=null"])
    # a misspelt train split: its own line, and what it probably is
    config.write_text("data:\n  source: files\n  splits:\n    test: {src: b.en, tgt: b.de}\n"
                      "    trian: {src: a.en, tgt: a.de}\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(config))}: line 5: data.splits.trian: did you mean 'train'\? "
                                        "data.splits must name a 'train' split"):
        load_config(config, [])


def test_average_last_may_not_exceed_keep_last():
    """Averaging needs the last average_last checkpoints, and the run deletes all but keep_last of them before the
    end: refused up front, not warned about once the run is over."""
    with pytest.raises(UserError, match=r"^--set train.average_last=10: train.average_last \(10\) must not exceed "
                                        r"train.keep_last \(5\)") as info:
        load_config(None, ["train.average_last=10", "train.keep_last=5"])
    assert "\n" not in str(info.value)
    assert load_config(None, ["train.average_last=5", "train.keep_last=5"]).train.average_last == 5
    assert load_config(None, ["train.average_last=0", "train.keep_last=1"]).train.average_last == 0


@pytest.mark.parametrize("source", ["demo", "multi30k", "wmt14"])
def test_data_splits_are_refused_where_the_source_does_not_read_them(source):
    """Only data.source files reads data.splits; with another source the files named were ignored without a word."""
    with pytest.raises(UserError, match=rf"^--set data.splits.train.src=x.en: data.splits is read only when "
                                        rf"data.source is files \(it is {source}\)"):
        load_config(None, [f"data.source={source}", "data.splits.train.src=x.en", "data.splits.train.tgt=x.de"])
    cfg = load_config(None, ["data.source=files", "data.splits.train.src=x.en", "data.splits.train.tgt=x.de"])
    assert cfg.data.splits["train"].src == "x.en"


def test_a_negative_seed_is_a_config_error():
    """numpy's generators refuse it: it ended in a traceback when the first batches were drawn."""
    from rpr_mt.config import config_from_dict
    from rpr_mt.errors import UserError

    with pytest.raises(UserError, match=r"train.seed must be >= 0 \(got -1\)"):
        config_from_dict({"train": {"seed": -1}})


def test_a_setting_the_position_scheme_ignores_is_warned_about_once(tmp_path, caplog, monkeypatch):
    """model.clip given for an absolute model was silently ignored: one warning line names the key, the scheme and
    where it was given (the file or the --set). Settings the scheme reads, settings at the value they would have
    unset (a saved config spells out every default) and the preset's own values warn about nothing."""
    import logging

    from rpr_mt import config as config_module

    monkeypatch.setattr(config_module, "_warned", set())
    path = write(tmp_path, "model:\n  positions: absolute\n  clip: 4\n  use_key: true\n  absolute_kind: learned\n")
    with caplog.at_level(logging.WARNING, logger="rpr_mt"):
        cfg = load_config(path, ["model.t5.num_buckets=8"])
        load_config(path, ["model.t5.num_buckets=8"])  # a sweep loads its config once per cell and run
    assert cfg.model.clip == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: {path}: model.clip is ignored by model.positions=absolute (only relative and absolute+relative "
        "read it)",
        "warning: --set model.t5.num_buckets=8: model.t5 is ignored by model.positions=absolute (only t5 read it)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rpr_mt"):
        load_config(None, ["model.positions=relative", "model.clip=4", "model.absolute_kind=sinusoidal"])
        load_config(None, ["model.preset=big", "model.positions=none"])  # the preset's clip: 8 is not the user's
        save_config(load_config(None, ["model.positions=rope"]), tmp_path / "saved.yaml")
        load_config(tmp_path / "saved.yaml")
    assert caplog.records == []
    # A sweep's cell switches the scheme by an override: the file's clip is for the file's own (relative) model, a
    # warning the user cannot act on; a setting given by an override beside the switch is still said.
    relative = tmp_path / "relative.yaml"
    relative.write_text("model:\n  positions: relative\n  clip: 4\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="rpr_mt"):
        load_config(relative, ["model.positions=absolute"])
        load_config(relative, ["model.positions=absolute", "model.use_key=false"])
    assert [r.getMessage() for r in caplog.records] == [
        "warning: --set model.use_key=false: model.use_key is ignored by model.positions=absolute (only relative and "
        "absolute+relative read it)"]


def test_every_scheme_reads_only_its_settings():
    """``SCHEME_SETTINGS`` against the schemes themselves: a setting it calls ignored changes no parameter and no
    attention output of that scheme, and each setting it calls read changes some scheme that reads it."""
    import dataclasses

    import torch

    from rpr_mt.config import ModelConfig, SCHEME_SETTINGS, unused_model_settings
    from rpr_mt.model.transformer import Seq2Seq

    changed = {"absolute_kind": "learned", "clip": 2, "use_key": False, "use_value": False, "share_across_heads": True,
               "t5": dataclasses.replace(ModelConfig().t5, num_buckets=8, max_distance=16),
               "xl": dataclasses.replace(ModelConfig().xl, clip=3),
               "rope": dataclasses.replace(ModelConfig().rope, base=99.0)}
    assert set(changed) == set(SCHEME_SETTINGS)

    def outputs(cfg: ModelConfig) -> tuple[dict, torch.Tensor]:
        torch.manual_seed(0)
        model = Seq2Seq(cfg, vocab_size=20, pad_id=0).eval()
        src = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 2]])
        with torch.no_grad():
            out = model(src, src)
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}, out

    from rpr_mt.model.positions import SCHEMES

    for positions in SCHEMES:
        base = ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=16, dropout=0.0,
                           positions=positions, max_positions=32)
        shapes, out = outputs(base)
        for key, value in changed.items():
            other_shapes, other_out = outputs(dataclasses.replace(base, **{key: value}))
            same = other_shapes == shapes and torch.equal(other_out, out)
            assert same == (key in unused_model_settings(positions)), (positions, key)


# docs/configuration.md: "### `section`" headings, then "| `key` | `default` | meaning |" rows.
_DOC_HEADING = re.compile(r"^### `([a-z0-9_.A-Z]+)`$")
_DOC_ROW = re.compile(r"^\| `([a-z0-9_]+)` \| `([^`]*)` \|")


def _documented_keys() -> dict[str, dict[str, str]]:
    """section heading -> {key: default as written} of docs/configuration.md."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    tables: dict[str, dict[str, str]] = {}
    section = None
    for line in doc.read_text(encoding="utf-8").splitlines():
        if heading := _DOC_HEADING.match(line):
            section = tables.setdefault(heading.group(1), {})
        elif (row := _DOC_ROW.match(line)) and section is not None:
            section[row.group(1)] = row.group(2)
    return tables


def test_configuration_doc_lists_every_key_with_its_default():
    """The reference page users read for a key is complete and its defaults are the code's: a field added to or
    renamed in rpr_mt/config.py, or a default changed, must change the page too."""
    import dataclasses

    import yaml

    from rpr_mt.config import SplitFiles

    tables = _documented_keys()
    sections = config_to_dict(Config())  # the defaults, nested sections as dicts, tuples as lists
    sections["data.splits.NAME"] = {f.name: f.default for f in dataclasses.fields(SplitFiles)}
    for nested in ("t5", "xl", "rope"):
        sections[f"model.{nested}"] = sections["model"][nested]
    sections["data.hub"] = sections["data"]["hub"]
    assert set(tables) == set(sections)
    for name, defaults in sections.items():
        assert list(tables[name]) == list(defaults), name  # every key, in the dataclass's order
        for key, value in defaults.items():
            written = tables[name][key]
            if isinstance(value, dict) and (name == "model" or (name, key) == ("data", "hub")):
                assert written == "(section)", f"{name}.{key}"
            else:
                assert yaml.safe_load(written) == value, f"{name}.{key}: the page says {written}, the code {value!r}"


def test_configuration_doc_names_the_keys_a_resume_may_change():
    from rpr_mt.train.run_dir import RESUMABLE_TRAIN_KEYS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    paragraph = doc[doc.index("Resuming a run"):doc.index("the model settings the position scheme ignores")]
    assert set(re.findall(r"`([a-z_]+)`", paragraph)) - {"train", "decode"} == RESUMABLE_TRAIN_KEYS


def test_a_preset_set_over_a_file_that_sets_its_keys_says_which_the_file_kept(tmp_path, caplog, monkeypatch):
    """`--set model.preset=big` on a config that sets d_model and friends kept the file's values silently (the file's
    keys override a preset): a warning names them. A preset written in the file beside its own overrides (the wmt14
    big configs' way) and a preset over a file that sets none of its keys say nothing."""
    import logging

    from rpr_mt import config as config_module

    monkeypatch.setattr(config_module, "_warned", set())
    path = write(tmp_path, "model:\n  d_model: 128\n  n_heads: 4\n  max_positions: 256\n")
    with caplog.at_level(logging.WARNING, logger="rpr_mt"):
        cfg = load_config(path, ["model.preset=big"])
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.ff_dim) == (128, 4, 4096)
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: --set model.preset=big: {path} sets model.d_model, model.n_heads, which override the preset's "
        "values (--set them too, or use a config without them)"]
    caplog.clear()
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("model:\n  max_positions: 256\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="rpr_mt"):
        load_config(path, ["model.preset=big", "model.d_model=1024", "model.n_heads=16"])  # all set again
        load_config(quiet, ["model.preset=big"])
        load_config(Path(__file__).resolve().parents[1] / "configs" / "wmt14_en_de_big_rel.yaml")
    assert caplog.records == []


def test_values_in_messages_are_spelled_as_yaml():
    """A user's YAML says null, true and a bare path: messages that show a value must not say None, True or
    '/path' (Python's spellings), and must quote what YAML would read as something else."""
    assert [yaml_value(v) for v in (None, True, False, "/data/x", 0.003, (0.9, 0.98))] == \
        ["null", "true", "false", "/data/x", "0.003", "[0.9, 0.98]"]
    assert yaml_value("no") == "'no'" and yaml_value("010") == "'010'" and yaml_value("") == "''"
    assert yaml_value("a\nb") == '"a\\nb"'  # a line break stays escaped: the error is one line
    with pytest.raises(UserError, match=r"train.max_tokens must be an integer, got true$"):
        config_from_dict({"train": {"max_tokens": True}})
    with pytest.raises(UserError, match=r"train.run_dir must be a string, got null$"):
        config_from_dict({"train": {"run_dir": None}})
    with pytest.raises(UserError, match=r"model.positions must be one of relative, absolute, .*, got false"):
        config_from_dict({"model": {"positions": False}})


def test_a_value_out_of_range_names_the_file_and_line_or_the_set_that_gave_it(tmp_path):
    """train.max_steps: 0 is as much the config file's error as an unknown key: the message says where to fix it."""
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  d_model: 64\ntrain:\n  seed: 3\n  max_steps: 0\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(config))}: line 5: train.max_steps must be positive$"):
        load_config(config, [])
    with pytest.raises(UserError, match=r"^--set model.n_heads=3: model.d_model \(64\) must be divisible"):
        load_config(config, ["train.max_steps=5", "model.n_heads=3"])  # the --set made it wrong, not the file
    # the --set that left no limit, not the file (which set max_steps), is named
    with pytest.raises(UserError, match=r"^--set train.max_steps=null: train needs at least one of train.max_steps, "):
        load_config(config, ["train.max_steps=null"])
    config.write_text("train:\n  max_steps: null\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(config))}: line 2: train needs at least one of"):
        load_config(config, [])
    with pytest.raises(UserError, match=r"^train.max_steps must be positive$"):
        config_from_dict({"train": {"max_steps": 0}})  # built in code: nothing to name


def test_a_bad_learning_rate_is_named_alone():
    """'lr_scale and peak_lr must be positive' left the user to guess which; NaN is called NaN."""
    with pytest.raises(UserError, match=r"^train.peak_lr must be positive \(got -0.1\)$"):
        config_from_dict({"train": {"peak_lr": -0.1}})
    with pytest.raises(UserError, match=r"^train.lr_scale must be positive \(got 0.0\)$"):
        config_from_dict({"train": {"lr_scale": 0}})
    with pytest.raises(UserError, match=r"^train.peak_lr must be a finite number \(got .nan\)$"):
        config_from_dict({"train": {"peak_lr": float("nan")}})


def test_the_bf16_recipe_is_the_recipe_with_the_overrides_of_its_table_1():
    """configs/multi30k_en_de_lit_bf16.yaml is what results/lit_tables_en_de_v4/ trained: the fp32 recipe with
    train.precision=bf16 and train.max_steps=8500 (the sweep's overrides), nothing else but its run directory."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    bf16 = config_to_dict(load_config(configs / "multi30k_en_de_lit_bf16.yaml"))
    swept = config_to_dict(load_config(configs / "multi30k_en_de_lit.yaml",
                                       ["train.precision=bf16", "train.max_steps=8500"]))
    assert bf16["train"].pop("run_dir") != swept["train"].pop("run_dir")
    assert bf16 == swept
