"""data.source: hub with the real ``datasets`` library on local files (parquet, json, csv) made here: the WMT/OPUS
schema and two text columns, the errors (a missing split, column or language, missing files, an unknown or
unreachable hub dataset), and `rpr-mt prepare` on parquet giving the ids that the same pairs give as local files."""

from __future__ import annotations

import csv
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rpr_mt.cli import app
from rpr_mt.config import DataConfig, HubSettings, load_config
from rpr_mt.data import binarize, sources
from rpr_mt.data.prepare import check_prepared, read_manifest
from rpr_mt.errors import UserError
from tests.data import SENTENCES_DE, SENTENCES_EN, write_lines

REPO = Path(__file__).resolve().parents[2]


def wmt_parquet(path: Path, en: list[str], de: list[str], **langs: list[str]) -> Path:
    """A parquet file in the WMT schema: one column translation of {en, de (, more)}."""
    columns = {"en": en, "de": de, **langs}
    translation = pa.StructArray.from_arrays([pa.array(v) for v in columns.values()], names=list(columns))
    pq.write_table(pa.table({"translation": translation}), path, row_group_size=5)
    return path


def wmt_jsonl(path: Path, en: list[str], de: list[str]) -> Path:
    path.write_text("".join(json.dumps({"translation": {"en": e, "de": d}}, ensure_ascii=False) + "\n"
                            for e, d in zip(en, de)), encoding="utf-8")
    return path


def hub_config(tmp_path: Path, **hub: object) -> DataConfig:
    return DataConfig(source="hub", output_dir=str(tmp_path / "prepared"), vocab_size=60, hub=HubSettings(**hub))


def read_all(config: DataConfig) -> dict[str, list[tuple[str, str]]]:
    corpus = sources.open_corpus(config)
    assert corpus.check is not None
    corpus.check()
    return {name: list(reader.open()) for name, reader in corpus.splits.items()}


def test_parquet_in_the_wmt_schema_streams_every_split_in_either_direction(tmp_path):
    train = wmt_parquet(tmp_path / "train.parquet", SENTENCES_EN, SENTENCES_DE)
    dev = wmt_parquet(tmp_path / "dev.parquet", SENTENCES_EN[:3], SENTENCES_DE[:3])
    files = {"train": str(train), "validation": [str(dev)]}
    config = hub_config(tmp_path, path="parquet", data_files=files, splits={"train": "train", "dev": "validation"})
    pairs = read_all(config)
    assert pairs == {"train": list(zip(SENTENCES_EN, SENTENCES_DE)), "dev": list(zip(SENTENCES_EN, SENTENCES_DE))[:3]}
    config.src_lang, config.tgt_lang = "de", "en"
    assert read_all(config)["dev"] == list(zip(SENTENCES_DE, SENTENCES_EN))[:3]
    inputs = sources.open_corpus(config).inputs
    assert inputs["kind"] == "hub" and inputs["dataset"] == "parquet" and inputs["revision"] is None
    recorded = inputs["data_files"]["train"][0]
    assert recorded["path"] == str(train.resolve()) and recorded["size"] == train.stat().st_size
    assert recorded["sha256"] == sources.sha256_file(train)


def test_json_lines_in_the_wmt_schema_and_a_glob_relative_to_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    wmt_jsonl(tmp_path / "data" / "part-1.jsonl", SENTENCES_EN[:6], SENTENCES_DE[:6])
    wmt_jsonl(tmp_path / "data" / "part-2.jsonl", SENTENCES_EN[6:], SENTENCES_DE[6:])
    monkeypatch.chdir(tmp_path)
    config = hub_config(tmp_path, path="json", data_files="data/part-*.jsonl", splits={"train": "train"})
    assert read_all(config) == {"train": list(zip(SENTENCES_EN, SENTENCES_DE))}


def test_two_text_columns_in_csv_and_json(tmp_path):
    rows = [("a dog, running", "ein hund, rennend"), ('she said "hi"', 'sie sagte "hallo"'), ("x", "y")]
    with open(tmp_path / "train.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["english", "german", "score"])
        writer.writerows([(e, d, 1.0) for e, d in rows])
    config = hub_config(tmp_path, path="csv", data_files={"train": str(tmp_path / "train.csv")},
                        splits={"train": "train"}, src_column="english", tgt_column="german")
    assert read_all(config)["train"] == rows
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"src": e, "tgt": d}) + "\n" for e, d in rows))
    config = hub_config(tmp_path, path="json", data_files=str(tmp_path / "train.jsonl"), splits={"train": "train"},
                        src_column="tgt", tgt_column="src")  # the columns decide the direction
    assert read_all(config)["train"] == [(d, e) for e, d in rows]


def test_null_cells_are_empty_text_so_dev_keeps_its_lines(tmp_path):
    pq.write_table(pa.table({"s": ["one", None, "three"], "t": ["eins", "zwei", None]}), tmp_path / "dev.parquet")
    config = hub_config(tmp_path, path="parquet", data_files={"train": str(tmp_path / "dev.parquet")},
                        splits={"train": "train"}, src_column="s", tgt_column="t")
    assert read_all(config)["train"] == [("one", "eins"), ("", "zwei"), ("three", "")]


def test_a_number_column_is_not_text(tmp_path):
    pq.write_table(pa.table({"s": ["one", "two"], "t": [1, 2]}), tmp_path / "train.parquet")
    config = hub_config(tmp_path, path="parquet", data_files=str(tmp_path / "train.parquet"),
                        splits={"train": "train"}, src_column="s", tgt_column="t")
    with pytest.raises(UserError, match=r"parquet files, split 'train': column 't' holds int values \(1\), not text"):
        read_all(config)


def test_a_missing_language_names_the_dataset_split_and_the_languages_there(tmp_path):
    path = wmt_parquet(tmp_path / "train.parquet", SENTENCES_EN, SENTENCES_DE)
    config = hub_config(tmp_path, path="parquet", data_files=str(path), splits={"train": "train"})
    config.tgt_lang = "fr"
    with pytest.raises(UserError) as info:
        read_all(config)  # said by the up-front check, before any pair is read
    assert str(info.value) == ("parquet files, split 'train': the translation column has no 'fr' (data.tgt_lang) "
                               "(it has: en, de); set data.src_lang and data.tgt_lang to two of its languages")
    with pytest.raises(UserError, match=r"split 'train': the translation column has no 'fr'"):
        list(sources.open_corpus(config).splits["train"].open())  # and by the stream itself


def test_a_missing_column_names_the_columns_there(tmp_path):
    pq.write_table(pa.table({"en": SENTENCES_EN, "de": SENTENCES_DE}), tmp_path / "train.parquet")
    config = hub_config(tmp_path, path="parquet", data_files=str(tmp_path / "train.parquet"),
                        splits={"train": "train"})
    with pytest.raises(UserError, match=r"^parquet files, split 'train': no column 'translation' \(it has: en, de\); "
                                        r"name the two text columns in data.hub.src_column and data.hub.tgt_column$"):
        read_all(config)
    config.hub.src_column, config.hub.tgt_column = "en", "german"
    with pytest.raises(UserError, match=r"split 'train': no column 'german' \(data.hub.tgt_column\) \(it has: en, de"):
        read_all(config)
    # csv declares no features before it is read: the stream says it at its first batch
    with open(tmp_path / "train.csv", "w") as f:
        f.write("en,de\na,b\n")
    config = hub_config(tmp_path, path="csv", data_files=str(tmp_path / "train.csv"), splits={"train": "train"})
    with pytest.raises(UserError, match=r"csv files, split 'train': no column 'translation' \(it has: en, de\)"):
        read_all(config)


def test_a_split_that_does_not_exist_names_the_ones_that_do(tmp_path):
    path = wmt_parquet(tmp_path / "train.parquet", SENTENCES_EN, SENTENCES_DE)
    config = hub_config(tmp_path, path="parquet", data_files={"train": str(path), "test": str(path)})  # default splits
    with pytest.raises(UserError) as info:
        read_all(config)
    assert str(info.value) == ("parquet files has no split 'validation' (data.hub.splits.dev); its splits: train, "
                               "test")


def test_data_files_that_do_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = hub_config(tmp_path, path="parquet", data_files={"train": "nope.parquet"}, splits={"train": "train"})
    with pytest.raises(UserError, match=rf"^data.hub.data_files: no such file: nope.parquet \(read from the current "
                                        rf"directory {tmp_path}\)$"):
        sources.open_corpus(config)
    config.hub.data_files = "shards/*.parquet"
    with pytest.raises(UserError, match=r"^data.hub.data_files: no file matches shards/\*.parquet"):
        sources.open_corpus(config)
    (tmp_path / "shards").mkdir()
    config.hub.data_files = "shards"
    with pytest.raises(UserError, match=r"shards is a directory; give its files"):
        sources.open_corpus(config)


def test_a_local_path_as_a_hub_id_says_how_to_read_it(tmp_path):
    config = hub_config(tmp_path, path=str(tmp_path))
    with pytest.raises(UserError, match="is a local path: set data.hub.path to its files' format"):
        sources.open_corpus(config)


def test_an_unreachable_hub_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: False)
    with pytest.raises(UserError, match=r"^the Hugging Face hub is unreachable, cannot load dataset 'wmt/wmt16'"):
        sources.open_corpus(hub_config(tmp_path, path="wmt/wmt16", name="ro-en"))


class _NotFound(http.server.BaseHTTPRequestHandler):
    """A hub endpoint that has no dataset at all (404 with the hub's error code)."""

    def _answer(self) -> None:
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "RepoNotFound")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b'{"error": "Repository not found"}')

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_a_dataset_the_hub_does_not_have_is_one_line(tmp_path):
    """The real huggingface_hub client against a hub endpoint on 127.0.0.1 that answers 404."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}", HF_HOME=str(tmp_path / "hf"),
                   PYTHONPATH=str(REPO))
        result = subprocess.run(
            [sys.executable, "-m", "rpr_mt.cli", "prepare", "--set", "data.source=hub",
             "--set", "data.hub.path=someone/no-such-data", "--set", f"data.output_dir={tmp_path / 'out'}"],
            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    finally:
        server.shutdown()
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "error: dataset 'someone/no-such-data' was not found on the Hugging Face hub (data.hub.path; a private one "
        "needs a login: hf auth login, or HF_TOKEN)"), result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_hub_keys_are_checked_on_load(tmp_path):
    with pytest.raises(UserError, match=r"unknown key 'data.hub.paht' \(did you mean 'data.hub.path'\?\)"):
        load_config(None, ["data.source=hub", "data.hub.path=parquet", "data.hub.paht=x"])
    with pytest.raises(UserError, match=r"^data.hub.path is read only when data.source is hub \(it is wmt14\)"):
        load_config(None, ["data.source=wmt14", "data.hub.path=wmt/wmt16"])
    with pytest.raises(UserError, match=r"data.hub.data_files is required with data.hub.path: parquet"):
        load_config(None, ["data.source=hub", "data.hub.path=parquet"])
    with pytest.raises(UserError, match=r"data.hub.revision is for datasets on the hub"):
        load_config(None, ["data.source=hub", "data.hub.path=json", "data.hub.data_files=a.jsonl",
                           "data.hub.revision=abc"])
    with pytest.raises(UserError, match=r"data.hub.splits must map 'train'"):
        load_config(None, ["data.source=hub", "data.hub.path=wmt/wmt16", "data.hub.splits={dev: validation}"])
    with pytest.raises(UserError, match=r"data.hub.tgt_column needs its partner"):
        load_config(None, ["data.source=hub", "data.hub.path=wmt/wmt16", "data.hub.tgt_column=de"])
    home = load_config(None, ["data.source=hub", "data.hub.path=parquet", "data.hub.data_files={train: ~/a.parquet}"])
    assert home.data.hub.data_files == {"train": os.path.expanduser("~/a.parquet")}


def test_wmt14_is_the_hub_source_with_its_pair_config():
    settings = sources.wmt14_settings("en", "fr")
    assert (settings.path, settings.name, settings.splits, settings.src_column) == (
        "wmt/wmt14", "fr-en", {"train": "train", "dev": "validation", "test": "test"}, None)


def _prepare(tmp_path: Path, name: str, sets: list[str]) -> Path:
    sets = [f"data.output_dir={tmp_path / name}", "data.vocab_size=60", "data.dedup=true", *sets]
    result = CliRunner().invoke(app, ["prepare", "--no-progress", *(arg for s in sets for arg in ("--set", s))])
    assert result.exit_code == 0, result.output
    return tmp_path / name


def test_prepare_from_parquet_gives_the_ids_of_the_same_pairs_as_files(tmp_path):
    en, de = SENTENCES_EN * 5 + ["the cat sits on the mat"], SENTENCES_DE * 5 + ["ein anderer satz"]
    shards = [wmt_parquet(tmp_path / f"train-{i}.parquet", en[i::2], de[i::2]) for i in range(2)]
    order_en, order_de = en[0::2] + en[1::2], de[0::2] + de[1::2]  # shard 0, then shard 1
    wmt_parquet(tmp_path / "dev.parquet", SENTENCES_EN[:4], SENTENCES_DE[:4])
    files = json.dumps({"train": [str(s) for s in shards], "validation": str(tmp_path / "dev.parquet")})
    hub = _prepare(tmp_path, "hub", ["data.source=hub", "data.hub.path=parquet", f"data.hub.data_files={files}",
                                     "data.hub.splits={train: train, dev: validation}"])
    write_lines(tmp_path / "train.en", order_en)
    write_lines(tmp_path / "train.de", order_de)
    write_lines(tmp_path / "dev.en", SENTENCES_EN[:4])
    write_lines(tmp_path / "dev.de", SENTENCES_DE[:4])
    local = _prepare(tmp_path, "files", ["data.source=files"] + [
        f"data.splits.{split}.{side}={tmp_path / f'{split}.{lang}'}"
        for split in ("train", "dev") for side, lang in (("src", "en"), ("tgt", "de"))])
    assert (hub / "spm.model").read_bytes() == (local / "spm.model").read_bytes()
    for split in ("train", "dev"):
        a, b = binarize.load_split(hub, split), binarize.load_split(local, split)
        assert len(a) == len(b) and len(a) > 0
        for i in range(len(a)):
            assert np.array_equal(a.src(i), b.src(i)) and np.array_equal(a.tgt(i), b.tgt(i))
    manifest = read_manifest(hub)
    assert manifest["splits"]["train"]["dropped"]["duplicate"] == len(en) - 13  # 12 distinct pairs and one more
    assert set(manifest["seconds"]) >= {"reading", "cleaning", "sentencepiece", "encoding", "binarizing", "total"}
    config = load_config(None, ["data.source=hub", "data.hub.path=parquet", f"data.hub.data_files={files}",
                                "data.hub.splits={train: train, dev: validation}", "data.vocab_size=60",
                                "data.dedup=true", f"data.output_dir={hub}"]).data
    assert check_prepared(config) is None
    wmt_parquet(shards[1], en[1::2][:-1], de[1::2][:-1])  # one pair fewer
    assert check_prepared(config) == f"stale: input {shards[1]} changed (sha256 differs)"
