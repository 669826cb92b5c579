"""``prepare``: every source end to end, caching, atomic replacement, and bad input."""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import unicodedata
from pathlib import Path

import pytest

from rpr_mt.config import DataConfig, SplitFiles
from rpr_mt.data import binarize, demo, sources
from rpr_mt.data.prepare import MANIFEST, check_prepared, config_hash, prepare, read_manifest, reference_files, \
    settings_changed_since_prepared
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from tests.data import CASED_DE, SENTENCES_DE, SENTENCES_EN, demo_config, files_config, multi30k_tok_corpus, \
    small_parallel, write_lines

LAYOUT = {f"{split}.{side}.{kind}.npy" for split in ("train", "dev", "test") for side in ("src", "tgt")
          for kind in ("ids", "offsets")}


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.*"))


# ------------------------------------------------------------------------------------------------------------------
# Sources end to end
# ------------------------------------------------------------------------------------------------------------------


def test_demo_end_to_end(tmp_path, capsys):
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    assert out == Path(config.output_dir).resolve()
    names = {p.name for p in out.iterdir()}
    assert LAYOUT <= names
    assert {"manifest.json", "spm.model", "spm.vocab", "dev.en", "dev.de", "test.en", "test.de"} <= names
    assert "train.en" not in names and not _leftovers(out)

    manifest = read_manifest(out)
    assert manifest["source"] == "demo" and manifest["config_hash"] == config_hash(config)
    assert manifest["inputs"] == {"kind": "demo", "generator_version": demo.GENERATOR_VERSION, "seed": 1234,
                                  "sizes": {"train": 400, "dev": 30, "test": 30}}
    assert manifest["splits"]["train"]["kept"] == 400 and manifest["splits"]["dev"]["kept"] == 30
    spm_info = manifest["sentencepiece"]
    assert (spm_info["pad_id"], spm_info["unk_id"], spm_info["bos_id"], spm_info["eos_id"]) == (0, 1, 2, 3)
    vocab = Vocab.load(out)
    assert spm_info["model_sha256"] == vocab.fingerprint and spm_info["vocab_size"] == 120
    import rpr_mt

    assert manifest["package_version"] == rpr_mt.__version__

    # dev text = the generator's dev split; ids decode back to it
    dev_pairs = demo.generate_demo(30, 1234, "dev")
    src_file, tgt_file = reference_files(out, "dev")
    assert src_file.read_text().splitlines() == [s for s, _ in dev_pairs]
    assert tgt_file.read_text().splitlines() == [t for _, t in dev_pairs]
    dev = binarize.load_split(out, "dev")
    assert [vocab.decode(dev.tgt(i)) for i in range(len(dev))] == [t for _, t in dev_pairs]

    summary = capsys.readouterr().out
    assert "split" in summary and "train" in summary and "unk" in summary and "400" in summary


def test_files_source_plain_and_gzip_with_relative_paths(tmp_path, monkeypatch):
    data = tmp_path / "corpus"
    data.mkdir()
    small_parallel(data, gz=True)
    monkeypatch.chdir(tmp_path)  # relative paths are relative to the working directory
    splits = {"train": SplitFiles(src="corpus/train.en.gz", tgt="corpus/train.de.gz"),
              "test": SplitFiles(src="corpus/dev.en.gz", tgt="corpus/dev.de.gz")}
    config = DataConfig(source="files", splits=splits, output_dir="out", vocab_size=60)
    out = prepare(config, progress=False)
    assert out == tmp_path / "out"
    manifest = read_manifest(out)
    assert set(manifest["splits"]) == {"train", "test"}
    assert manifest["splits"]["train"]["kept"] == 120
    train_info = manifest["inputs"]["files"]["train.src"]
    assert train_info["sha256"] == sources.sha256_file(data / "train.en.gz") and train_info["lines"] == 120
    assert (out / "test.en").read_text().splitlines() == SENTENCES_EN[:4]
    assert len(binarize.load_split(out, "train")) == 120


def test_a_dev_split_that_is_the_training_text_is_warned_of(tmp_path, caplog):
    """The same files (or a copy) as dev: its BLEU and best checkpoint would measure recall, and nothing said so."""
    data = tmp_path / "corpus"
    data.mkdir()
    small_parallel(data, gz=True)
    copy = tmp_path / "copy.de.gz"
    copy.write_bytes((data / "train.de.gz").read_bytes())
    splits = {"train": SplitFiles(src=str(data / "train.en.gz"), tgt=str(data / "train.de.gz")),
              "dev": SplitFiles(src=str(data / "train.en.gz"), tgt=str(copy)),
              "test": SplitFiles(src=str(data / "dev.en.gz"), tgt=str(data / "dev.de.gz"))}
    with caplog.at_level("WARNING"):
        prepare(files_config(tmp_path, splits), progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning: ")]
    assert warnings == [f"warning: split 'dev' has the same text as the training pairs ({data / 'train.en.gz'}, {copy}): "
                        "its scores would measure recall of training sentences, not translation"]


def test_tsv_source_keeps_empty_eval_lines(tmp_path):
    train = write_lines(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in zip(SENTENCES_EN, SENTENCES_DE)] * 5)
    dev = write_lines(tmp_path / "dev.tsv", ["  the cat sits  \t die katze sitzt", "\t", "a dog\tein hund"])
    config = files_config(tmp_path, {"train": SplitFiles(tsv=str(train)), "dev": SplitFiles(tsv=str(dev))})
    out = prepare(config, progress=False)
    assert (out / "dev.en").read_text() == "the cat sits\n\na dog\n"
    assert (out / "dev.de").read_text() == "die katze sitzt\n\nein hund\n"
    dev_ids = binarize.load_split(out, "dev")
    assert len(dev_ids) == 3 and dev_ids.src_lengths[1] == 0 and dev_ids.tgt_lengths[1] == 0


def test_train_cleaning_counts_in_manifest(tmp_path):
    src = write_lines(tmp_path / "s.txt", SENTENCES_EN * 3 + ["", "one two three four five six", "x"] + SENTENCES_EN)
    tgt = write_lines(tmp_path / "t.txt", SENTENCES_DE * 3 + ["leer", "eins", "y"] + SENTENCES_DE)
    config = files_config(tmp_path, {"train": SplitFiles(src=str(src), tgt=str(tgt))}, dedup=True)
    out = prepare(config, progress=False)
    train = read_manifest(out)["splits"]["train"]
    assert train["read"] == 51 and train["kept"] == 13
    assert train["dropped"] == {"empty": 1, "too_long": 0, "length_ratio": 1, "duplicate": 36}


def test_max_train_pairs(tmp_path):
    out = prepare(demo_config(tmp_path, max_train_pairs=150), progress=False)
    train = read_manifest(out)["splits"]["train"]
    assert train["kept"] == 150 and train["truncated_at"] == 150
    assert len(binarize.load_split(out, "train")) == 150


def test_multi30k_local_en_fr(tmp_path, multi30k_dir):
    config = DataConfig(source="multi30k", multi30k_dir=str(multi30k_dir), src_lang="en", tgt_lang="fr",
                        output_dir=str(tmp_path / "m30k"), max_train_pairs=3000, vocab_size=2000)
    out = prepare(config, progress=False)
    manifest = read_manifest(out)
    assert {k: v["kept"] for k, v in manifest["splits"].items()} == {"train": 3000, "dev": 1014, "test": 1000}
    with gzip.open(multi30k_dir / "val.fr.gz", "rt", encoding="utf-8") as f:
        official = [line.strip() for line in f]
    assert (out / "dev.fr").read_text(encoding="utf-8").splitlines() == official  # every line, only stripped

    # encode -> decode gives back the cleaned text (where no piece is unknown and NFKC changes nothing)
    vocab = Vocab.load(out)
    dev = binarize.load_split(out, "dev")
    checked = 0
    for i, line in enumerate(official):
        ids = dev.tgt(i)
        if vocab.unk_id in ids or unicodedata.normalize("NFKC", line) != line or "  " in line:
            continue
        assert vocab.decode(ids) == line
        checked += 1
    assert checked > 900


def test_wmt14_through_a_fake_hub(tmp_path, monkeypatch):
    """The WMT14 code path end to end, with datasets.load_dataset replaced by an offline stream."""
    import datasets
    sizes = {"train": 200, "validation": 20, "test": 25}

    def fake_load_dataset(path, name=None, split=None, streaming=False, revision=None):
        assert (path, name, streaming) == ("wmt/wmt14", "de-en", True)
        return ({"translation": {"de": SENTENCES_DE[i % 12], "en": SENTENCES_EN[i % 12]}} for i in range(sizes[split]))

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(sources, "_hub_revision", lambda dataset: "0123abcd")
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    config = DataConfig(source="wmt14", src_lang="en", tgt_lang="de", output_dir=str(tmp_path / "wmt"),
                        vocab_size=60)
    out = prepare(config, progress=False)
    manifest = read_manifest(out)
    assert manifest["inputs"]["dataset"] == "wmt/wmt14" and manifest["inputs"]["revision"] == "0123abcd"
    assert {k: v["kept"] for k, v in manifest["splits"].items()} == {"train": 200, "dev": 20, "test": 25}
    # hub data is up to date without contacting the hub again
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: False)
    assert check_prepared(config) is None


def test_progress_goes_to_stderr_and_can_be_disabled(tmp_path, capsys):
    prepare(demo_config(tmp_path, output_dir=str(tmp_path / "a")), progress=False)
    assert "reading train" not in capsys.readouterr().err
    prepare(demo_config(tmp_path, output_dir=str(tmp_path / "b")), progress=True)
    captured = capsys.readouterr()
    assert "reading train" in captured.err and "encoding train" in captured.err
    assert "reading train" not in captured.out


# ------------------------------------------------------------------------------------------------------------------
# Cache: up to date, stale, force
# ------------------------------------------------------------------------------------------------------------------


def _snapshot(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir()} | {".": out.stat().st_ino}


def test_second_run_is_a_noop(tmp_path, caplog):
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    before = _snapshot(out)
    assert check_prepared(config) is None
    with caplog.at_level(logging.INFO, logger="rpr_mt.data"):
        prepare(config, progress=False)
    assert "up to date" in caplog.text
    assert _snapshot(out) == before


def test_force_rebuilds(tmp_path):
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    inode = out.stat().st_ino
    prepare(config, force=True, progress=False)
    assert out.stat().st_ino != inode and not _leftovers(out)


def test_changed_config_key_rebuilds(tmp_path):
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    config.vocab_size = 100
    assert check_prepared(config) == "stale: data.vocab_size changed (120 -> 100)"
    prepare(config, progress=False)
    assert read_manifest(out)["sentencepiece"]["vocab_size"] == 100 and check_prepared(config) is None
    config.demo_sizes = {"train": 300, "dev": 30, "test": 30}
    assert check_prepared(config).startswith("stale: data.demo_sizes changed")


def test_multi30k_text_change_names_both_values(tmp_path):
    # raw is not recorded (data prepared before the key stays up to date): the reason said null -> "tok"
    root = tmp_path / "m30k"
    (root / "tok").mkdir(parents=True)
    for prefix, n in (("train", 10), ("val", 1), ("test_2016_flickr", 1)):
        for folder in (root, root / "tok"):
            write_lines(folder / f"{prefix}.en.gz", SENTENCES_EN * n)
            write_lines(folder / f"{prefix}.de.gz", SENTENCES_DE * n)
    config = DataConfig(source="multi30k", multi30k_dir=str(root), output_dir=str(tmp_path / "prepared"),
                        vocab_size=60)
    prepare(config, progress=False)
    config.multi30k_text = "tok"
    assert check_prepared(config) == 'stale: data.multi30k_text changed (raw -> tok)'
    prepare(config, progress=False)
    config.multi30k_text = "raw"
    assert check_prepared(config) == 'stale: data.multi30k_text changed (tok -> raw)'
    assert settings_changed_since_prepared(config) == 'data.multi30k_text tok there, raw in this config'


def test_irrelevant_key_change_keeps_data(tmp_path):
    splits = small_parallel(tmp_path)
    config = files_config(tmp_path, splits)
    prepare(config, progress=False)
    config.demo_seed = 99  # not used by source=files
    assert check_prepared(config) is None


def test_changed_input_file_rebuilds(tmp_path):
    splits = small_parallel(tmp_path)
    config = files_config(tmp_path, splits)
    out = prepare(config, progress=False)
    train_src = Path(splits["train"].src)
    os.utime(train_src, ns=(1, 1))  # touched but unchanged: still up to date (same sha256)
    hashed = []
    real_sha256 = sources.sha256_file

    def counting_sha256(path):
        hashed.append(Path(path))
        return real_sha256(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sources, "sha256_file", counting_sha256)
        assert check_prepared(config) is None
        assert hashed == [train_src]  # the touched file was hashed once ...
        assert read_manifest(out)["inputs"]["files"]["train.src"]["mtime_ns"] == 1  # ... and its new stat recorded
        assert check_prepared(config) is None
        assert hashed == [train_src]  # so the next check does not hash it again
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary manifest left behind
    lines = train_src.read_text().splitlines()
    lines[0] = "the cat sat on the mat"  # same size, new content
    train_src.write_text("\n".join(lines) + "\n")
    assert check_prepared(config) == f"stale: input {train_src} changed (sha256 differs)"
    out = prepare(config, progress=False)
    assert read_manifest(out)["inputs"]["files"]["train.src"]["sha256"] == sources.sha256_file(train_src)
    # pointing the split at another file is said as that, not as an edit of the new file
    other = tmp_path / "other.src"
    other.write_text("a different corpus\n" * 3)
    config.splits["train"].src = str(other)
    assert check_prepared(config) == f"stale: the train.src input is now {other} (it was {train_src.resolve()})"


def test_new_split_or_missing_output_file_is_stale(tmp_path):
    splits = small_parallel(tmp_path)
    config = files_config(tmp_path, splits)
    out = prepare(config, progress=False)
    (out / "dev.src.ids.npy").unlink()
    assert check_prepared(config) == f"stale: {out / 'dev.src.ids.npy'} is missing"
    prepare(config, progress=False)
    config.splits["test"] = splits["dev"]
    assert check_prepared(config).startswith("stale: data.splits changed")


def test_missing_and_unreadable_manifest(tmp_path):
    config = demo_config(tmp_path)
    assert check_prepared(config) == f"missing: no prepared data in {config.output_dir}"
    out = prepare(config, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert check_prepared(config).startswith("stale: prepared with data format 0")
    (out / "manifest.json").write_text("{not json")
    assert check_prepared(config).startswith("stale:")
    prepare(config, progress=False)  # rebuilds over its own (broken) prepared directory
    assert check_prepared(config) is None


# ------------------------------------------------------------------------------------------------------------------
# Atomic replacement and leftovers
# ------------------------------------------------------------------------------------------------------------------


def test_interrupted_rebuild_keeps_the_old_data(tmp_path, monkeypatch):
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    before = _snapshot(out)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(binarize, "binarize_text", interrupted)
    config.vocab_size = 100
    with pytest.raises(KeyboardInterrupt):
        prepare(config, progress=False)
    assert _snapshot(out) == before and not _leftovers(out)


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    config = demo_config(tmp_path)
    out = Path(config.output_dir)
    tmp_left = tmp_path / ".prepared.tmp-999999"
    old_left = tmp_path / ".prepared.old-999998"
    for d in (tmp_left, old_left):
        d.mkdir()
        (d / "train.src.ids.npy").write_bytes(b"half")
    (tmp_left / ".lock").write_text("")
    unrelated = tmp_path / ".prepared.notes"
    unrelated.write_text("keep me")
    prepare(config, progress=False)
    assert not tmp_left.exists() and not old_left.exists() and unrelated.exists()
    assert _leftovers(out) == [".prepared.notes"]


def test_a_live_run_is_not_disturbed(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    config = demo_config(tmp_path)
    live = tmp_path / ".prepared.tmp-424242"
    live.mkdir()
    with open(live / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UserError, match="another `rpr-mt prepare` is writing"):
            prepare(config, progress=False)
    assert live.exists()


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    foreign = tmp_path / "prepared"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(UserError, match="exists and does not hold prepared data"):
        prepare(demo_config(tmp_path), progress=False)
    assert (foreign / "thesis.tex").read_text() == "precious"


def test_refuses_to_rebuild_over_what_it_did_not_write(tmp_path):
    # the rebuilt directory replaces the old one whole: a run directory kept inside it was deleted without a word
    config = demo_config(tmp_path)
    out = prepare(config, progress=False)
    (out / "run" / "checkpoints").mkdir(parents=True)
    (out / "run" / "checkpoints" / "checkpoint_00000002.pt").write_bytes(b"weights")
    with pytest.raises(UserError, match=r"holds run, which `rpr-mt prepare` did not write"):
        prepare(config, force=True, progress=False)
    (out / MANIFEST).write_text("{", encoding="utf-8")  # unreadable: prepare's own file names tell its files
    with pytest.raises(UserError, match=r"holds run, which"):
        prepare(config, progress=False)
    assert (out / "run" / "checkpoints" / "checkpoint_00000002.pt").read_bytes() == b"weights"
    shutil.rmtree(out / "run")
    prepare(config, progress=False)  # prepare's own files alone: rebuilt
    assert check_prepared(config) is None


# ------------------------------------------------------------------------------------------------------------------
# Bad input: one-line UserError, nothing written
# ------------------------------------------------------------------------------------------------------------------


def _files(tmp_path: Path, src_lines, tgt_lines, **overrides) -> DataConfig:
    src = write_lines(tmp_path / "train.en", src_lines)
    tgt = write_lines(tmp_path / "train.de", tgt_lines)
    return files_config(tmp_path, {"train": SplitFiles(src=str(src), tgt=str(tgt))}, **overrides)


def _bad_utf8_dev(tmp_path: Path) -> DataConfig:
    splits = small_parallel(tmp_path)
    Path(splits["dev"].tgt).write_bytes(b"gut\nschlecht \xc3\x28\nok\nok\n")
    return files_config(tmp_path, splits)


def _bad_tsv(tmp_path: Path) -> DataConfig:
    tsv = write_lines(tmp_path / "train.tsv", ["a\tb"] * 20 + ["missing tab"])
    return files_config(tmp_path, {"train": SplitFiles(tsv=str(tsv))})


def _empty_file(tmp_path: Path) -> DataConfig:
    splits = small_parallel(tmp_path)
    Path(splits["dev"].src).write_bytes(b"")
    return files_config(tmp_path, splits)


def _missing_file(tmp_path: Path) -> DataConfig:
    splits = small_parallel(tmp_path)
    splits["dev"].tgt = str(tmp_path / "no_such_file.de")
    return files_config(tmp_path, splits)


def _unreachable_hub(tmp_path: Path, monkeypatch) -> DataConfig:
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: False)
    return DataConfig(source="wmt14", src_lang="de", tgt_lang="en", output_dir=str(tmp_path / "prepared"))


BAD_INPUTS = {
    "line count mismatch": (lambda p, m: _files(p, SENTENCES_EN, SENTENCES_DE[:-1]),
                            r"train\.en has 12 lines but .*train\.de has 11"),
    "invalid utf-8 in dev": (lambda p, m: _bad_utf8_dev(p), r"dev\.de: line 2: invalid UTF-8"),
    "empty file": (lambda p, m: _empty_file(p), r"input file is empty: .*dev\.en"),
    "missing file": (lambda p, m: _missing_file(p), r"input file not found: .*no_such_file\.de"),
    "all dropped": (lambda p, m: _files(p, SENTENCES_EN, SENTENCES_DE, max_words=2),
                    r"cleaning dropped all 12 training pairs .*longer than data.max_words=2 12"),
    "tsv without tab": (lambda p, m: _bad_tsv(p), r"train\.tsv:21: expected exactly one tab"),
    "vocab too large": (lambda p, m: _files(p, SENTENCES_EN, SENTENCES_DE, vocab_size=5000),
                        r"data.vocab_size=5000 is too large"),
    "unknown wmt14 pair": (lambda p, m: DataConfig(source="wmt14", src_lang="en", tgt_lang="ja",
                                                   output_dir=str(p / "prepared")),
                           r"'wmt14' has no en-ja language pair"),
    "unreachable hub": (_unreachable_hub, r"Hugging Face hub is unreachable.*use local files"),
    "same languages": (lambda p, m: demo_config(p, src_lang="en", tgt_lang="en"),
                       r"data.src_lang and data.tgt_lang must differ"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path, monkeypatch, case):
    make_config, pattern = BAD_INPUTS[case]
    config = make_config(tmp_path, monkeypatch)
    with pytest.raises(UserError, match=pattern) as info:
        prepare(config, progress=False)
    assert "\n" not in str(info.value)
    out = Path(config.output_dir)
    assert not out.exists() and not _leftovers(out)


def test_truncated_or_corrupt_arrays_are_stale_and_rebuilt(tmp_path):
    """The manifest records each file's size and sha256: 'up to date' means the same bytes, not mere existence."""
    cfg = demo_config(tmp_path)
    out = prepare(cfg, progress=False)
    manifest = read_manifest(out)
    assert set(manifest["checksums"]) == set(manifest["files"])
    ids = out / "train.src.ids.npy"
    good = ids.read_bytes()
    ids.write_bytes(good[:-7])
    assert "truncated" in check_prepared(cfg)
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    ids.write_bytes(bytes(flipped))
    assert "content differs" in check_prepared(cfg)
    with pytest.raises(UserError, match="content differs"):
        binarize.load_split(out, "train", checksums=manifest["checksums"])
    prepare(cfg, progress=False)  # rebuilt
    assert check_prepared(cfg) is None and ids.read_bytes() == good


def test_offsets_that_do_not_match_the_ids_are_a_clear_error(tmp_path):
    out = prepare(demo_config(tmp_path), progress=False)
    import numpy as np

    offsets = np.load(out / "dev.tgt.offsets.npy")
    offsets[-1] += 5
    np.save(out / "dev.tgt.offsets.npy", offsets)
    with pytest.raises(UserError, match="dev.tgt.offsets.npy: offsets do not match"):
        binarize.load_split(out, "dev")


def test_output_dir_that_is_a_dangling_link_is_one_error_before_any_work(tmp_path):
    """A data.output_dir linked to a directory that does not exist (a moved disk, a link made before the target)
    ended in NotADirectoryError from the final rename, after the whole preparation."""
    link = tmp_path / "prepared"
    link.symlink_to(tmp_path / "elsewhere" / "prepared")
    with pytest.raises(UserError, match=r"is a link to .*elsewhere/prepared, which is not a directory"):
        prepare(demo_config(tmp_path), progress=False)  # output_dir: tmp_path / "prepared", the link
    assert not any(p.name.startswith(".prepared.tmp") for p in tmp_path.iterdir())  # nothing was built


@pytest.mark.parametrize("problem", ["missing", "mismatched", "invalid UTF-8"])
def test_a_bad_input_is_one_error_with_no_preparing_line_before_it(tmp_path, caplog, problem):
    """prepare said "preparing DIR (why)" before it found the input missing or misaligned: two lines on stderr for one
    bad input (three from train). The announcement now comes once the inputs are read."""
    (tmp_path / "a.en").write_text("a\nb\n", encoding="utf-8")
    if problem == "mismatched":
        (tmp_path / "a.de").write_text("a\n", encoding="utf-8")
    if problem == "invalid UTF-8":  # found while the text is read, after the files were checked
        (tmp_path / "a.de").write_bytes(b"a\n\xff\n")
    config = files_config(tmp_path, {"train": SplitFiles(src=str(tmp_path / "a.en"), tgt=str(tmp_path / "a.de"))})
    with caplog.at_level(logging.INFO, logger="rpr_mt"), pytest.raises(UserError):
        prepare(config, progress=False)
    assert "preparing" not in caplog.text


# ------------------------------------------------------------------------------------------------------------------
# The casing model of lowercased text
# ------------------------------------------------------------------------------------------------------------------

def test_lowercased_text_gets_a_casing_model_learned_from_the_raw_training_text(tmp_path):
    from rpr_mt.text import casing

    config = multi30k_tok_corpus(tmp_path / "m30k")
    out = prepare(config, progress=False)
    manifest = read_manifest(out)
    assert casing.FILE_NAME in manifest["files"]
    assert manifest["checksums"][casing.FILE_NAME] == binarize.file_checksum(out / casing.FILE_NAME)
    entry = manifest["casing"]
    assert entry["file"] == casing.FILE_NAME and entry["lang"] == "de"
    assert entry["learned_from"] == {"path": str((tmp_path / "m30k" / "train.de.gz").resolve()),
                                     "sha256": sources.sha256_file(tmp_path / "m30k" / "train.de.gz")}
    model = casing.load(out / casing.FILE_NAME)
    assert entry["words"] == len(model.words)
    assert model.recase("der mann spielt im park in berlin .") == "Der Mann spielt im Park in Berlin ."
    assert check_prepared(config) is None

    # raw text keeps its case: no casing model
    raw = DataConfig(source="multi30k", multi30k_dir=str(tmp_path / "m30k"), vocab_size=80,
                     output_dir=str(tmp_path / "prepared_raw"))
    raw_out = prepare(raw, progress=False)
    assert not (raw_out / casing.FILE_NAME).exists() and "casing" not in read_manifest(raw_out)


def test_data_prepared_without_a_casing_model_gets_one_without_being_prepared_again(tmp_path, caplog):
    from rpr_mt.text import casing

    config = multi30k_tok_corpus(tmp_path / "m30k")
    out = prepare(config, progress=False)
    learned = (out / casing.FILE_NAME).read_bytes()
    # as data prepared before casing models: no file, no manifest entry
    manifest = read_manifest(out)
    del manifest["casing"], manifest["checksums"][casing.FILE_NAME]
    manifest["files"].remove(casing.FILE_NAME)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (out / casing.FILE_NAME).unlink()
    assert check_prepared(config) is None  # up to date: nothing it needs is missing
    before = _snapshot(out)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rpr_mt.data.prepare"):
        prepare(config, progress=False)
    assert "added the casing model" in caplog.text and "preparing" not in caplog.text
    after = _snapshot(out)
    assert {name: after[name] for name in before if name != MANIFEST} == \
        {name: stamp for name, stamp in before.items() if name != MANIFEST}  # nothing encoded again
    assert (out / casing.FILE_NAME).read_bytes() == learned
    again = read_manifest(out)
    assert casing.FILE_NAME in again["files"] and again["casing"]["lang"] == "de"
    assert check_prepared(config) is None and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_changed_raw_training_file_gives_a_new_casing_model_without_preparing_again(tmp_path, caplog):
    """The raw training file is an input of the casing model alone: when it changes, the model is learned again and
    nothing else is encoded again; when it is gone, the model learned earlier stays."""
    from rpr_mt.text import casing

    config = multi30k_tok_corpus(tmp_path / "m30k")
    out = prepare(config, progress=False)
    assert casing.load(out / casing.FILE_NAME).recase("ein hund rennt im park .") == "Ein Hund rennt im Park ."
    before = _snapshot(out)

    raw = tmp_path / "m30k" / "train.de.gz"
    write_lines(raw, [line.replace("Park", "park") for line in CASED_DE] * 10)  # the same lines, one word recased
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rpr_mt.data.prepare"):
        prepare(config, progress=False)
    assert "learned again (from the changed train.de.gz)" in caplog.text and "preparing" not in caplog.text
    after = _snapshot(out)
    unchanged = set(before) - {MANIFEST, casing.FILE_NAME}
    assert {name: after[name] for name in unchanged} == {name: before[name] for name in unchanged}
    assert casing.load(out / casing.FILE_NAME).recase("ein hund rennt im park .") == "Ein Hund rennt im park ."
    assert read_manifest(out)["casing"]["learned_from"]["sha256"] == sources.sha256_file(raw)
    assert check_prepared(config) is None

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rpr_mt.data.prepare"):
        prepare(config, progress=False)  # unchanged since: nothing learned again
    assert "casing" not in caplog.text

    model = (out / casing.FILE_NAME).read_bytes()
    raw.unlink()
    with caplog.at_level(logging.INFO, logger="rpr_mt.data.prepare"):
        prepare(config, progress=False)
    assert (out / casing.FILE_NAME).read_bytes() == model and check_prepared(config) is None


def test_a_missing_or_misaligned_raw_training_file_leaves_no_casing_model_and_says_so(tmp_path, caplog):
    from rpr_mt.text import casing

    config = multi30k_tok_corpus(tmp_path / "m30k")
    (tmp_path / "m30k" / "train.de.gz").unlink()
    with caplog.at_level(logging.WARNING, logger="rpr_mt.data.prepare"):
        out = prepare(config, progress=False)
    assert "no casing model" in caplog.text and "train.de.gz" in caplog.text and "missing" in caplog.text
    assert not (out / casing.FILE_NAME).exists() and "casing" not in read_manifest(out)

    caplog.clear()
    write_lines(tmp_path / "m30k" / "train.de.gz", CASED_DE[:3])
    with caplog.at_level(logging.WARNING, logger="rpr_mt.data.prepare"):
        prepare(config, progress=False)  # up to date; the casing model is tried again
    assert "has 3 lines, the tokenized training text 60" in caplog.text
    assert not (out / casing.FILE_NAME).exists()


def test_a_data_directory_the_casing_model_cannot_be_added_to_stays_usable(tmp_path, monkeypatch, caplog):
    from rpr_mt.text import casing

    config = multi30k_tok_corpus(tmp_path / "m30k")
    out = prepare(config, progress=False)
    manifest = read_manifest(out)
    del manifest["casing"]  # as data prepared before casing models
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    manifest_before = (out / MANIFEST).read_text(encoding="utf-8")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(casing, "save", read_only)
    with caplog.at_level(logging.WARNING, logger="rpr_mt.data.prepare"):
        assert prepare(config, progress=False) == out
    assert f"cannot write the casing model into {out} (Permission denied)" in caplog.text
    assert (out / MANIFEST).read_text(encoding="utf-8") == manifest_before
