"""Reading raw parallel text: local files, TSV, gzip, bad input, the hub (offline), streaming memory."""

from __future__ import annotations

import gzip
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from rpr_mt.config import DataConfig, validate_data
from rpr_mt.data import sources
from rpr_mt.errors import UserError
from tests.data import write_lines


def test_read_lines_plain_gzip_and_crlf(tmp_path):
    plain = write_lines(tmp_path / "a.txt", ["eins", "zwei  ", "drei"])
    packed = write_lines(tmp_path / "a.txt.gz", ["eins", "zwei  ", "drei"])
    assert list(sources.read_lines(plain)) == list(sources.read_lines(packed)) == ["eins", "zwei  ", "drei"]
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"one\r\ntwo\r\nlast without newline")
    assert [line.strip() for line in sources.read_lines(crlf)] == ["one", "two", "last without newline"]


def test_only_newline_ends_a_line(tmp_path):
    # \u2028 and \x0c would split lines under str.splitlines(); they must not break the alignment.
    path = tmp_path / "odd.txt"
    path.write_bytes("a\u2028b\nc\x0cd\n".encode())
    assert list(sources.read_lines(path)) == ["a\u2028b", "c\x0cd"]


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, gz):
    data = b"good line\nanother\nbad \xff\xfe byte\n"
    path = tmp_path / ("bad.txt.gz" if gz else "bad.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(UserError, match=r"bad\.txt(\.gz)?: line 3: invalid UTF-8"):
        list(sources.read_lines(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="input file not found: .*nope.txt"):
        list(sources.read_lines(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(UserError, match="input file is empty: .*empty.txt"):
        sources.file_digest(tmp_path / "empty.txt")
    (tmp_path / "empty.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(UserError, match="input file is empty: .*empty.gz"):
        sources.file_digest(tmp_path / "empty.gz")


def test_corrupt_gzip_is_a_user_error(tmp_path):
    path = tmp_path / "broken.gz"
    path.write_bytes(b"this is not gzip data\n")
    with pytest.raises(UserError, match="broken.gz: not a valid gzip file"):
        sources.file_digest(path)


def test_file_digest_counts_lines_and_hashes_the_file(tmp_path):
    import hashlib

    plain = write_lines(tmp_path / "x.txt", ["a", "b", "c"])
    packed = write_lines(tmp_path / "x.txt.gz", ["a", "b", "c"])
    no_final_newline = tmp_path / "y.txt"
    no_final_newline.write_bytes(b"a\nb")
    assert sources.file_digest(plain).lines == 3
    assert sources.file_digest(packed).lines == 3
    assert sources.file_digest(no_final_newline).lines == 2
    assert sources.file_digest(packed).sha256 == hashlib.sha256(packed.read_bytes()).hexdigest()


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    src = write_lines(tmp_path / "s.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "t.de", ["a", "b"])
    config = DataConfig(source="files", splits={"train": dict_split(src, tgt)})
    with pytest.raises(UserError, match=r"s\.en has 3 lines but .*t\.de has 2"):
        sources.open_corpus(config)


def dict_split(src: Path, tgt: Path):
    from rpr_mt.config import SplitFiles

    return SplitFiles(src=str(src), tgt=str(tgt))


def test_tsv_reading_and_tab_errors(tmp_path):
    good = write_lines(tmp_path / "good.tsv", ["hello\thallo", "cat\tKatze"])
    assert list(sources.read_tsv(good)) == [("hello", "hallo"), ("cat", "Katze")]
    no_tab = write_lines(tmp_path / "no_tab.tsv", ["hello\thallo", "no tab here"])
    with pytest.raises(UserError, match=r"no_tab\.tsv:2: expected exactly one tab .*found 0"):
        list(sources.read_tsv(no_tab))
    # a blank line (a trailing one, say) is an empty pair, as in two aligned files; it stopped prepare before
    blank = write_lines(tmp_path / "blank.tsv", ["hello\thallo", "", " \r"])
    assert list(sources.read_tsv(blank)) == [("hello", "hallo"), ("", ""), ("", "")]
    two_tabs = write_lines(tmp_path / "two.tsv", ["a\tb\tc"])
    with pytest.raises(UserError, match=r"two\.tsv:1: expected exactly one tab .*found 2"):
        list(sources.read_tsv(two_tabs))


def test_multi30k_local_reader(multi30k_dir):
    config = DataConfig(source="multi30k", multi30k_dir=str(multi30k_dir), src_lang="en", tgt_lang="fr")
    corpus = sources.open_corpus(config)
    assert list(corpus.splits) == ["train", "dev", "test"]
    assert [corpus.splits[s].total for s in corpus.splits] == [29000, 1014, 1000]
    first = next(iter(corpus.splits["dev"].open()))
    assert all(isinstance(x, str) and x for x in first)
    assert corpus.inputs["kind"] == "files" and set(corpus.inputs["files"]) == {
        "train.src", "train.tgt", "dev.src", "dev.tgt", "test.src", "test.tgt"}


def test_multi30k_tokenized_text(multi30k_dir):
    """data.multi30k_text: tok reads the dataset's own tok/ files (the literature's text), line-aligned as the raw."""
    config = DataConfig(source="multi30k", multi30k_dir=str(multi30k_dir), src_lang="en", tgt_lang="de",
                        multi30k_text="tok")
    corpus = sources.open_corpus(config)
    assert [corpus.splits[s].total for s in corpus.splits] == [29000, 1014, 1000]
    assert all(Path(f["path"]).parent.name == "tok" for f in corpus.inputs["files"].values())
    with gzip.open(multi30k_dir / "tok" / "val.de.gz", "rt", encoding="utf-8") as f:
        first_tok = f.readline().rstrip("\n")
    src, tgt = next(iter(corpus.splits["dev"].open()))
    assert tgt == first_tok and tgt == tgt.lower() and src == src.lower()
    raw = DataConfig(source="multi30k", multi30k_dir=str(multi30k_dir), src_lang="en", tgt_lang="de")
    assert next(iter(sources.open_corpus(raw).splits["dev"].open()))[1] != tgt


def test_multi30k_tokenized_text_needs_the_local_files(tmp_path):
    (tmp_path / "train.en.gz").touch()
    config = DataConfig(source="multi30k", multi30k_dir=str(tmp_path), multi30k_text="tok")
    with pytest.raises(UserError, match="has no tok/ directory"):
        sources.open_corpus(config)
    validate_data(DataConfig(source="multi30k", multi30k_text="tok"))  # no directory: the download has tok/ too
    with pytest.raises(UserError, match=r"data.multi30k_text: tok .* needs data.source: multi30k \(it is demo\)"):
        validate_data(DataConfig(source="demo", multi30k_text="tok"))


def test_multi30k_rejects_unknown_language(multi30k_dir):
    config = DataConfig(source="multi30k", multi30k_dir=str(multi30k_dir), src_lang="en", tgt_lang="cs")
    with pytest.raises(UserError, match="data.tgt_lang 'cs' is not a Multi30k language"):
        sources.open_corpus(config)


def test_wmt14_language_pairs():
    assert sources.wmt14_config_name("en", "de") == "de-en"
    assert sources.wmt14_config_name("fr", "en") == "fr-en"
    with pytest.raises(UserError, match="no en-ja language pair.*de-en, fr-en"):
        sources.wmt14_config_name("en", "ja")
    with pytest.raises(UserError, match="no de-fr language pair"):
        sources.open_corpus(DataConfig(source="wmt14", src_lang="de", tgt_lang="fr"))


def test_unreachable_hub_without_network(monkeypatch):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: False)
    with pytest.raises(UserError, match=r"hub is unreachable.*'wmt/wmt14'.*data\.source: files"):
        sources.open_corpus(DataConfig(source="wmt14", src_lang="en", tgt_lang="de"))


def test_unreachable_hub_error_from_datasets_is_clear(monkeypatch):
    """datasets' own ConnectionError (raised after its retries) becomes the one-line UserError."""
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(sources, "_hub_revision", lambda dataset: None)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    corpus = sources.open_corpus(DataConfig(source="wmt14", src_lang="en", tgt_lang="fr"))
    with pytest.raises(UserError) as info:
        next(iter(corpus.splits["train"].open()))
    message = str(info.value)
    assert "Hugging Face hub is unreachable" in message and "data.source: files" in message
    assert "\n" not in message


def test_unrecognised_hub_failures_are_not_hidden(monkeypatch):
    import datasets

    def broken(*args, **kwargs):
        raise KeyError("translation")

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(sources, "_hub_revision", lambda dataset: None)
    monkeypatch.setattr(datasets, "load_dataset", broken)
    corpus = sources.open_corpus(DataConfig(source="wmt14", src_lang="en", tgt_lang="de"))
    with pytest.raises(KeyError):
        next(iter(corpus.splits["dev"].open()))


def test_wmt14_stream_is_read_lazily(monkeypatch):
    """The WMT14 path, with datasets.load_dataset replaced by a fake stream: records are pulled one at a time."""
    import datasets
    calls, pulled = [], []

    def fake_load_dataset(path, name=None, split=None, streaming=False, revision=None):
        calls.append((path, name, split, streaming, revision))

        def records():
            for i in range(10**9):  # effectively endless: only works if consumed lazily
                pulled.append(i)
                yield {"translation": {"en": f"sentence {i}", "fr": f"phrase {i}"}}

        return records()

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(sources, "_hub_revision", lambda dataset: "abc123")
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    corpus = sources.open_corpus(DataConfig(source="wmt14", src_lang="fr", tgt_lang="en"))
    stream = corpus.splits["test"].open()
    assert [next(stream) for _ in range(3)] == [(f"phrase {i}", f"sentence {i}") for i in range(3)]
    stream.close()
    assert calls == [("wmt/wmt14", "fr-en", "test", True, "abc123")]
    assert len(pulled) <= 4
    assert corpus.inputs == {"kind": "hub", "dataset": "wmt/wmt14", "config": "fr-en", "revision": "abc123",
                             "splits": {"train": "train", "dev": "validation", "test": "test"}}


_STREAM_CHILD = r"""
import resource, sys
from rpr_mt.config import DataConfig, SplitFiles
from rpr_mt.data import sources
from rpr_mt.data.clean import TrainFilter, write_clean_split
src, tgt, out = sys.argv[1:4]
config = DataConfig(source="files", splits={"train": SplitFiles(src=src, tgt=tgt)})
corpus = sources.open_corpus(config)  # hashes and counts lines (streaming too)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
stats = write_clean_split(corpus.splits["train"].open(), out + ".en", out + ".de",
                          keep=TrainFilter(250, 3.0, dedup=False), progress=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(stats.kept, (after - before) * 1024)
"""


def test_streaming_memory_is_bounded(tmp_path):
    """Reading + cleaning 200k line pairs (~24 MB) grows the peak RSS by far less than the files' size."""
    rng = random.Random(0)
    words = [f"w{i:03d}" for i in range(500)]
    src_path, tgt_path = tmp_path / "big.en", tmp_path / "big.de"
    with open(src_path, "w") as fs, open(tgt_path, "w") as ft:
        for _ in range(200_000):
            line = " ".join(rng.choices(words, k=12))
            fs.write(line + "\n")
            ft.write(line.upper() + "\n")
    total_bytes = src_path.stat().st_size + tgt_path.stat().st_size
    result = subprocess.run([sys.executable, "-c", _STREAM_CHILD, str(src_path), str(tgt_path), str(tmp_path / "o")],
                            capture_output=True, text=True, check=True)
    kept, growth = map(int, result.stdout.split())
    assert kept == 200_000 and total_bytes > 20_000_000
    assert growth < total_bytes / 8, f"peak RSS grew by {growth} bytes while streaming {total_bytes} bytes"


def test_binarize_memory_does_not_scale_with_the_input(tmp_path, monkeypatch):
    from rpr_mt.data import binarize
    from rpr_mt.data.vocab import Vocab, train_sentencepiece

    rng = random.Random(1)
    words = [f"w{i:03d}" for i in range(300)]
    text = tmp_path / "train.en"
    with open(text, "w") as f:
        for _ in range(40_000):
            f.write(" ".join(rng.choices(words, k=12)) + "\n")
    small = tmp_path / "small.en"
    small.write_text("".join(text.read_text().splitlines(keepends=True)[:10_000]))
    vocab = Vocab.load(train_sentencepiece(small.read_text().splitlines()[:2000], tmp_path, vocab_size=400,
                                           model_type="bpe", character_coverage=1.0))
    monkeypatch.setattr(binarize, "_BATCH_LINES", 256)
    peaks = {}
    for path, n in ((small, 10_000), (text, 40_000)):
        tracemalloc.start()
        try:
            binarize.binarize_text(path, vocab, tmp_path, path.stem, "src", n, progress=False)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    ids_bytes = binarize.ids_file(tmp_path, "train", "src").stat().st_size
    assert peaks[40_000] < 1.25 * peaks[10_000] + 65536, peaks  # 4x the input, about the same peak
    assert peaks[40_000] < ids_bytes / 4, (peaks, ids_bytes)


def test_live_multi30k_download_or_skip(tmp_path, monkeypatch):
    """One small file from the dataset's repository at the pinned commit (the real URL, not a mirror) matches its
    pinned SHA-256; skipped with the reason when GitHub is unreachable."""
    from rpr_mt.data import multi30k

    for name in (multi30k.DIR_ENV, multi30k.URL_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = DataConfig(source="multi30k", src_lang="en", tgt_lang="de")
    try:
        path = multi30k.multi30k_file(config, "dev", "en")
    except UserError as exc:
        if "cannot download Multi30k" in str(exc):
            pytest.skip(f"GitHub unreachable from this machine: {exc}")
        raise
    assert path == tmp_path / "rpr-mt" / "multi30k" / "data" / "task1" / "raw" / "val.en.gz"
    assert multi30k.PINNED["data/task1/raw/val.en.gz"][0] == sources.sha256_file(path)


def test_an_opening_byte_order_mark_is_not_text_in_plain_or_tsv_files(tmp_path):
    plain, tsv = tmp_path / "a.en", tmp_path / "a.tsv"
    plain.write_bytes("\ufeffa dog\nthe \ufeff cat\n".encode("utf-8"))
    tsv.write_bytes("\ufeffa dog\tein hund\n".encode("utf-8"))
    assert list(sources.read_lines(plain)) == ["a dog", "the \ufeff cat"]  # only the file's first character
    assert list(sources.read_tsv(tsv)) == [("a dog", "ein hund")]


def test_compressed_inputs_are_named_and_text_that_begins_like_bzip2_is_text(tmp_path):
    import bz2
    import lzma

    from rpr_mt.data.sources import refuse_unnamed_gzip

    for name, data, kind in (("a.xz", lzma.compress(b"a\n"), "xz"), ("a.bz2", bz2.compress(b"a\n"), "bzip2"),
                             ("empty.bz2", bz2.compress(b""), "bzip2"), ("a.en", gzip.compress(b"a\n"), "gzip")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UserError, match=f"{name} is {kind}-compressed"):
            refuse_unnamed_gzip(tmp_path / name)
    (tmp_path / "en-de.txt.zip").write_bytes(_zip_of("en-de.en", b"a\n"))
    with pytest.raises(UserError, match="en-de.txt.zip is a zip archive: rpr-mt reads plain text or gzip"):
        refuse_unnamed_gzip(tmp_path / "en-de.txt.zip")
    # "BZh" is ASCII: a text line may begin with it (and with its block-size digit)
    (tmp_path / "names.en").write_text("BZh9 is not a name\nBZhang\n", encoding="utf-8")
    refuse_unnamed_gzip(tmp_path / "names.en")


def _zip_of(name: str, data: bytes) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, data)
    return buffer.getvalue()
