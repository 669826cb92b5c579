"""rpr_mt/train/run_dir.py: the run directory's lock where file locks fail or are held."""

from __future__ import annotations

import errno

import pytest

from rpr_mt.train import run_dir
from rpr_mt.train.run_dir import RunDirLock


@pytest.mark.skipif(run_dir.fcntl is None, reason="no fcntl: the lock is not taken")
def test_a_file_system_without_locks_trains_unlocked_with_a_warning(tmp_path, monkeypatch):
    """ENOLCK (NFS without lockd) is not 'another training holds it': refusing there would refuse every run."""
    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_dir.fcntl, "flock", no_locks)
    warnings = []
    with RunDirLock(tmp_path / "run", warn=warnings.append) as lock:
        assert lock.acquired
    assert len(warnings) == 1 and "No locks available" in warnings[0]


@pytest.mark.skipif(run_dir.fcntl is None, reason="no fcntl: the lock is not taken")
def test_a_held_lock_is_not_acquired_and_leaves_the_directory(tmp_path):
    (tmp_path / "run").mkdir()
    with RunDirLock(tmp_path / "run") as first, RunDirLock(tmp_path / "run") as second:
        assert first.acquired and not second.acquired
    assert (tmp_path / "run").is_dir()  # it existed before: kept, lock file and all


def test_config_differences_spell_values_as_yaml():
    """The refusal to resume quotes the settings as the user's YAML has them: null and a bare path, not
    None -> '/path'."""
    from rpr_mt.config import Config, config_to_dict

    old, new = config_to_dict(Config()), config_to_dict(Config())
    new["train"]["init_from"] = "/runs/base"
    new["data"]["dedup"] = True
    assert run_dir.config_differences(old, new) == ["data.dedup: false -> true", "train.init_from: null -> /runs/base"]


def test_paths_spelled_apart_are_the_same_setting(tmp_path, monkeypatch):
    """A trailing slash, ./ or the absolute path of the same directory refused the resume ("holds a run with a
    different config (data.output_dir: data1 -> data1/)") and advised --overwrite, which deletes the run."""
    from rpr_mt.config import config_to_dict, config_from_dict

    monkeypatch.chdir(tmp_path)

    def config(output_dir: str, train_file: str) -> dict:
        return config_to_dict(config_from_dict({"data": {
            "source": "files", "output_dir": output_dir,
            "splits": {"train": {"src": train_file, "tgt": "c/train.de"}}}}))

    old = config("data1", "c/train.en")
    for output_dir, train_file in (("data1/", "c/train.en"), ("./data1", "c/./train.en"),
                                   (str(tmp_path / "data1"), str(tmp_path / "c" / "train.en"))):
        assert run_dir.config_differences(old, config(output_dir, train_file)) == []
    assert run_dir.config_differences(old, config("data2", "c/train.en")) == ["data.output_dir: data1 -> data2"]
    assert len(run_dir.config_differences(old, config("data1", "c/other.en"))) == 1


def test_a_run_directory_in_the_data_directory_is_refused_naming_both(tmp_path):
    """train.run_dir equal to (or inside) data.output_dir ended in "data.output_dir ... exists and does not hold
    prepared data": the directory train had just created, and not the cause."""
    from rpr_mt.errors import UserError

    data = tmp_path / "data"
    for run in (data, data / "run", tmp_path / "data" / ".." / "data"):
        with pytest.raises(UserError, match="train.run_dir .* data.output_dir .*: give the run and the prepared data "
                                            "directories of their own"):
            run_dir.check_run_dir(run, data_dir=data)
    run_dir.check_run_dir(tmp_path / "run", data_dir=data)
    run_dir.check_run_dir(tmp_path / "run", data_dir=tmp_path / "run" / "data")  # data kept inside the run: fine


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    """mkdir failing where check_run_dir could not foresee it (/proc, a read-only mount) was a FileNotFoundError
    traceback."""
    from pathlib import Path

    from rpr_mt.errors import UserError

    def refuse(self, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(UserError, match=r"^train.run_dir: cannot create .*run \(No such file or directory\)$"):
        with RunDirLock(tmp_path / "run"):
            pass


def test_where_multi30k_is_read_from_does_not_make_another_run():
    """A run trained from a named copy (the committed configs named ../shared/data/multi30k) resumes with a config
    that names none (the download, or $RPR_MT_MULTI30K_DIR): prepare compares the files themselves by checksum."""
    from rpr_mt.config import config_from_dict, config_to_dict

    def config(**data) -> dict:
        return config_to_dict(config_from_dict({"data": {"source": "multi30k", "multi30k_text": "tok", **data}}))

    assert run_dir.config_differences(config(multi30k_dir="../shared/data/multi30k"), config()) == []
    assert run_dir.config_differences(config(), config(multi30k_dir="/elsewhere")) == []
    assert run_dir.config_differences(config(), config(multi30k_text="raw")) == ["data.multi30k_text: tok -> raw"]
