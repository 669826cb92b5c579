"""Multi30k's files: the download (pinned SHA-256, the cache, the errors) from a mirror on 127.0.0.1, and the local
copies in both layouts, with the precedence of data.multi30k_dir, $RPR_MT_MULTI30K_DIR and the download."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpr_mt.cli import app
from rpr_mt.config import DataConfig
from rpr_mt.data import multi30k, sources
from rpr_mt.data.prepare import check_prepared, prepare
from rpr_mt.errors import UserError
from tests.data.multi30k_mirror import PROXY_VARIABLES, MirrorServer, build_mirror, closed_port_url

TOK_EN_DE = [multi30k.upstream_name(prefix, lang, "tok") for prefix in ("train", "val", "test_2016_flickr")
             for lang in ("en", "de")]


@pytest.fixture(scope="module")
def mirror(multi30k_dir, tmp_path_factory) -> Path:
    return build_mirror(multi30k_dir, tmp_path_factory.mktemp("mirror"))


@pytest.fixture
def server(mirror):
    with MirrorServer(mirror) as running:
        yield running


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """No local copy named by the environment, the cache under tmp_path, no proxy between us and 127.0.0.1; the
    download's URL is each test's to set."""
    monkeypatch.delenv(multi30k.DIR_ENV, raising=False)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "rpr-mt" / "multi30k"


def cached_files(cache: Path) -> list[str]:
    """Every file under the cache, temporaries included."""
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_the_mirror_of_the_local_copy_holds_the_pinned_bytes(mirror):
    """The pinned table is the repository's at COMMIT: the local copy's raw files are those bytes, and its tok files
    decompress to them."""
    for name, (sha256, size) in multi30k.PINNED.items():
        data = (mirror / name).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (sha256, size), name
    assert len(multi30k.PINNED) == 18


def test_the_download_reads_what_the_local_copy_reads_and_a_second_run_needs_no_network(multi30k_dir, server, cache,
                                                                                        monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de", multi30k_text="tok")
    corpus = sources.open_corpus(config)
    assert sorted(server.requests) == sorted(TOK_EN_DE)  # the config's files, each once
    assert cached_files(cache) == sorted(TOK_EN_DE)  # in the repository's layout, no temporary left
    for name in TOK_EN_DE:
        assert sources.sha256_file(cache / name) == multi30k.PINNED[name][0]
    assert corpus.inputs["multi30k"] == {"from": "download", "url": server.url, "commit": multi30k.COMMIT,
                                         "cache": str(cache)}
    assert {Path(f["path"]) for f in corpus.inputs["files"].values()} == {cache / name for name in TOK_EN_DE}
    local = sources.open_corpus(DataConfig(source="multi30k", src_lang="en", tgt_lang="de", multi30k_text="tok",
                                           multi30k_dir=str(multi30k_dir)))
    for split in ("train", "dev", "test"):
        assert corpus.splits[split].total == local.splits[split].total
        assert list(corpus.splits[split].open()) == list(local.splits[split].open())
    # nothing listens there now: the cache alone is read
    monkeypatch.setenv(multi30k.URL_ENV, closed_port_url())
    again = sources.open_corpus(config)
    assert next(iter(again.splits["dev"].open())) == next(iter(local.splits["dev"].open()))
    assert len(server.requests) == 6


def test_prepare_records_the_download_and_stays_up_to_date_when_the_cache_is_cleared(server, cache, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="fr", output_dir=str(tmp_path / "prepared"),
                        max_train_pairs=300, vocab_size=200)
    out = prepare(config, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["multi30k"] == {"from": "download", "url": server.url, "commit": multi30k.COMMIT,
                                              "cache": str(cache)}
    assert manifest["inputs"]["files"]["train.tgt"]["path"] == str(cache / "data/task1/raw/train.fr.gz")
    assert check_prepared(config) is None
    shutil.rmtree(cache)  # a download gives the same bytes back: nothing to prepare again, nothing fetched
    requests = len(server.requests)
    assert check_prepared(config) is None and len(server.requests) == requests
    cache.mkdir(parents=True)
    (cache / "data" / "task1" / "raw").mkdir(parents=True)
    (cache / "data/task1/raw/train.fr.gz").write_bytes(gzip.compress(b"another text\n"))
    assert check_prepared(config).startswith("stale: input ")  # a file that is there is compared by its checksum


def test_a_corrupted_download_is_one_line_naming_the_file_and_nothing_is_cached(server, cache, tmp_path, monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    server.corrupt.add("data/task1/raw/train.de.gz")
    message = one_line_error(["prepare", "--set", "data.source=multi30k", "--set",
                              f"data.output_dir={tmp_path / 'prepared'}"])
    assert f"{server.url}data/task1/raw/train.de.gz does not match the SHA-256 pinned for" in message
    assert "not cached" in message
    assert not any(name.endswith("train.de.gz") or name.endswith(".part") for name in cached_files(cache))
    assert not (tmp_path / "prepared").exists()


def test_an_interrupted_download_leaves_no_file_and_the_next_run_completes_it(server, cache, monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    server.cut.add("data/task1/raw/val.de.gz")
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de")
    with pytest.raises(UserError, match=rf"the download of {server.url}data/task1/raw/val\.de\.gz stopped after "
                                        r"12,340 of 24,681 bytes .*nothing of it was kept: run again"):
        sources.open_corpus(config)
    assert not any("val.de" in name for name in cached_files(cache))
    server.cut.clear()
    sources.open_corpus(config)
    assert sources.sha256_file(cache / "data/task1/raw/val.de.gz") == multi30k.PINNED["data/task1/raw/val.de.gz"][0]
    assert server.requests.count("data/task1/raw/val.de.gz") == 2
    assert server.requests.count("data/task1/raw/train.en.gz") == 1  # what was cached before the cut stays cached


def test_a_cached_file_that_changed_is_downloaded_again(server, cache, monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de")
    path = multi30k.multi30k_file(config, "test", "en")
    path.write_bytes(b"not the file")
    assert multi30k.multi30k_file(config, "test", "en") == path
    assert sources.sha256_file(path) == multi30k.PINNED["data/task1/raw/test_2016_flickr.en.gz"][0]
    assert server.requests.count("data/task1/raw/test_2016_flickr.en.gz") == 2


def test_without_a_network_the_one_line_names_the_url_the_layouts_and_both_local_ways(cache, tmp_path, monkeypatch):
    url = closed_port_url()
    monkeypatch.setenv(multi30k.URL_ENV, url)
    message = one_line_error(["prepare", "--set", "data.source=multi30k", "--set", "data.multi30k_text=tok",
                              "--set", f"data.output_dir={tmp_path / 'prepared'}"])
    assert message.startswith(f"error: cannot download Multi30k from {url}data/task1/tok/train.lc.norm.tok.en (")
    assert "data.multi30k_dir or RPR_MT_MULTI30K_DIR" in message
    assert "{train,val,test_2016_flickr}.{en,de,fr}.gz with tok/" in message
    assert "data/task1/raw/{split}.{lang}.gz and data/task1/tok/{split}.lc.norm.tok.{lang}" in message
    assert cached_files(cache) == []


def test_an_http_error_names_the_status(server, cache, monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, server.url + "elsewhere/")
    with pytest.raises(UserError, match=r"cannot download Multi30k: .*elsewhere/data/task1/raw/train\.en\.gz "
                                        r"answered HTTP 404 .*RPR_MT_MULTI30K_DIR"):
        sources.open_corpus(DataConfig(source="multi30k"))


def test_the_environment_copy_comes_before_the_download_and_the_config_before_both(multi30k_dir, mirror, cache,
                                                                                   monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, closed_port_url())  # a download would fail
    monkeypatch.setenv(multi30k.DIR_ENV, str(multi30k_dir))
    config = DataConfig(source="multi30k", src_lang="de", tgt_lang="fr", multi30k_text="tok")
    corpus = sources.open_corpus(config)
    assert corpus.inputs["multi30k"] == {"from": multi30k.DIR_ENV, "dir": str(multi30k_dir.resolve()),
                                         "layout": "flat"}
    assert Path(corpus.inputs["files"]["dev.src"]["path"]) == (multi30k_dir / "tok" / "val.de.gz").resolve()
    # the config's copy wins, here in the repository's layout (the mirror is one)
    config.multi30k_dir = str(mirror)
    upstream = sources.open_corpus(config)
    assert upstream.inputs["multi30k"] == {"from": "data.multi30k_dir", "dir": str(mirror.resolve()),
                                           "layout": "upstream"}
    assert Path(upstream.inputs["files"]["dev.src"]["path"]) == mirror / "data/task1/tok/val.lc.norm.tok.de"
    assert list(upstream.splits["dev"].open()) == list(corpus.splits["dev"].open())
    assert cached_files(cache) == []
    monkeypatch.setenv(multi30k.DIR_ENV, str(mirror / "absent"))
    with pytest.raises(UserError, match=f"^{multi30k.DIR_ENV} not found: .*absent$"):
        sources.open_corpus(DataConfig(source="multi30k"))


def test_one_file_by_split_language_and_text_in_every_layout(multi30k_dir, mirror, server, cache, monkeypatch):
    """What a reader of other files than the config's text asks for (the raw target beside tok training text)."""
    monkeypatch.setenv(multi30k.URL_ENV, server.url)
    tok = DataConfig(source="multi30k", src_lang="en", tgt_lang="de", multi30k_text="tok")
    assert multi30k.multi30k_file(tok, "train", "de", "raw") == cache / "data/task1/raw/train.de.gz"
    assert server.requests == ["data/task1/raw/train.de.gz"]
    assert multi30k.multi30k_file(tok, "val", "de") == cache / "data/task1/tok/val.lc.norm.tok.de"
    not_fetched = multi30k.multi30k_file(tok, "test", "fr", fetch=False)
    assert not_fetched == cache / "data/task1/tok/test_2016_flickr.lc.norm.tok.fr" and not not_fetched.exists()
    assert len(server.requests) == 2
    tok.multi30k_dir = str(multi30k_dir)
    assert multi30k.multi30k_file(tok, "train", "de", "raw") == multi30k_dir / "train.de.gz"
    assert multi30k.multi30k_file(tok, "train", "de") == multi30k_dir / "tok" / "train.de.gz"
    tok.multi30k_dir = str(mirror)
    assert multi30k.multi30k_file(tok, "dev", "en", "raw") == mirror / "data/task1/raw/val.en.gz"
    with pytest.raises(UserError, match="Multi30k has no split 'valid'"):
        multi30k.multi30k_file(tok, "valid", "en")
    with pytest.raises(UserError, match="'cs' is not a Multi30k language"):
        multi30k.multi30k_file(tok, "train", "cs")


def test_a_local_copy_missing_a_file_names_it_and_the_layouts(tmp_path, cache):
    (tmp_path / "copy" / "data" / "task1" / "raw").mkdir(parents=True)
    config = DataConfig(source="multi30k", multi30k_dir=str(tmp_path / "copy"))
    with pytest.raises(UserError, match=r"Multi30k file not found: .*copy/data/task1/raw/train\.en\.gz "
                                        r"\(data\.multi30k_dir .* is read as the dataset layout: "):
        sources.open_corpus(config)


def test_the_cache_follows_xdg_cache_home_else_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert multi30k.cache_dir() == tmp_path / "rpr-mt" / "multi30k"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG specification says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert multi30k.cache_dir() == tmp_path / "home" / ".cache" / "rpr-mt" / "multi30k"
    monkeypatch.delenv(multi30k.URL_ENV, raising=False)
    assert multi30k.base_url() == f"https://raw.githubusercontent.com/multi30k/dataset/{multi30k.COMMIT}/"
    monkeypatch.setenv(multi30k.URL_ENV, "http://mirror.example/m30k")
    assert multi30k.base_url() == "http://mirror.example/m30k/"


@pytest.mark.parametrize("text", ["raw", "tok"])
def test_data_prepared_from_a_local_copy_and_a_config_that_names_none(multi30k_dir, cache, tmp_path, monkeypatch,
                                                                     text):
    """The raw files of the local copy are the pinned bytes: its data stays up to date for a config that would
    download them. Its tok files are gzipped, the repository's are not: the data was prepared from other files,
    which a resume must hear of (the trainer then refuses; RPR_MT_MULTI30K_DIR restores them)."""
    monkeypatch.setenv(multi30k.URL_ENV, closed_port_url())
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de", multi30k_text=text,
                        multi30k_dir=str(multi30k_dir), output_dir=str(tmp_path / "prepared"), max_train_pairs=300,
                        vocab_size=200)
    prepare(config, progress=False)
    config.multi30k_dir = None
    if text == "raw":
        assert check_prepared(config) is None
    else:
        assert check_prepared(config) == (
            f"stale: the train.src input is now {cache / 'data/task1/tok/train.lc.norm.tok.en'}, which is missing "
            f"(it was {(multi30k_dir / 'tok' / 'train.en.gz').resolve()})")
    monkeypatch.setenv(multi30k.DIR_ENV, str(multi30k_dir))
    assert check_prepared(config) is None
    assert cached_files(cache) == []


def test_a_mirror_on_disk_serving_a_shorter_file_is_a_checksum_mismatch_not_a_cut(mirror, cache, tmp_path,
                                                                                  monkeypatch):
    """A file:// mirror works as an http one; a file that arrives whole but shorter than the pinned one is another
    file, not an interrupted download (which a run again would not mend)."""
    copy = tmp_path / "copy"
    for name in TOK_EN_DE:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mirror / name, copy / name)
    short = copy / "data/task1/tok/val.lc.norm.tok.de"
    short.write_bytes(short.read_bytes()[:-100])
    monkeypatch.setenv(multi30k.URL_ENV, copy.as_uri())
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de", multi30k_text="tok")
    with pytest.raises(UserError, match=r"val\.lc\.norm\.tok\.de does not match the SHA-256 pinned for .*77,173 "
                                        r"bytes\): not cached"):
        sources.open_corpus(config)
    short.write_bytes((mirror / "data/task1/tok/val.lc.norm.tok.de").read_bytes())
    assert sources.open_corpus(config).splits["dev"].total == 1014
    assert cached_files(cache) == sorted(TOK_EN_DE)
