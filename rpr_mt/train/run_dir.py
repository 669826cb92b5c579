"""A run directory's config: the one it was trained with, and which differences make a new config another run.

``rpr-mt train`` on a directory that holds a run resumes it when the configs agree, and refuses (without
``--overwrite``) when they do not; the train keys in ``RESUMABLE_TRAIN_KEYS``, and the model settings that the
position scheme ignores, may change between invocations.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from rpr_mt.checkpoint_files import checkpoint_dir
from rpr_mt.config import Config, config_to_dict, unused_model_settings, yaml_value
from rpr_mt.errors import UserError
from rpr_mt.locks import fcntl, try_exclusive_lock  # fcntl is None on Windows: no locks
from rpr_mt.train.checkpointing import latest_valid_checkpoint

# Train keys that may change between an interrupted run and its resumption (stopping rules, logging, threads).
RESUMABLE_TRAIN_KEYS = {
    "max_steps", "max_epochs", "max_time", "patience", "log_every", "save_every", "validate_every", "keep_last",
    "num_threads", "valid_bleu", "valid_max_sentences", "valid_beam_size", "average_last", "max_bad_updates", "device",
    "tensorboard",
}


# The entries a run writes into its directory, and whether each is a directory.
_RUN_ENTRIES = {"checkpoints": True, "config.yaml": False, "metrics.jsonl": False, "tensorboard": True,
                ".train.lock": False}


def check_run_dir(run_dir: Path, tensorboard: bool = True, data_dir: Path | None = None) -> None:
    """Before any work (preparing data can take long): ``run_dir`` is a directory that this process can write, or
    one it can create, and what it holds of the run's own entries has the right kind (``tensorboard``: the run
    writes TensorBoard events), and it is neither ``data_dir`` (data.output_dir) nor inside it (prepare refuses a
    directory holding files it did not write, and its error would name the data directory, not the cause). Nothing is
    created here: a command that fails later leaves the disk as it was."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"train.run_dir: {run_dir} is a file, not a directory")
    if data_dir is not None:
        run, data = Path(os.path.abspath(run_dir)), Path(os.path.abspath(data_dir))
        if run == data or data in run.parents:
            where = "is" if run == data else "is inside"
            raise UserError(f"train.run_dir {run_dir} {where} data.output_dir {data_dir}: give the run and the "
                            "prepared data directories of their own")
    existing = run_dir
    while not existing.exists() and existing != existing.parent:  # the directory that mkdir would create below
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"train.run_dir: {run_dir} cannot be created: {existing} is not a directory")
    # What the run writes into it, each of the kind it writes, checked now: a directory named metrics.jsonl (or a
    # file named checkpoints) would stop the run at its first log line, validation or checkpoint
    for name, want_dir in _RUN_ENTRIES.items():
        entry = run_dir / name
        if name == "tensorboard" and not tensorboard:
            continue
        if entry.exists() and entry.is_dir() != want_dir:
            kind = "a directory" if entry.is_dir() else "not a directory"
            raise UserError(f"train.run_dir: {entry} is {kind}, but the run writes its {name} "
                            f"{'directory' if want_dir else 'file'} there; move it away or choose another "
                            "train.run_dir")
    for directory in (existing, checkpoint_dir(run_dir)):
        if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
            what = "cannot be written" if directory != existing or existing == run_dir else "cannot be created"
            raise UserError(f"train.run_dir: {run_dir} {what}: {directory} is not writable")


def saved_config(config_path: Path, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The config a run directory was trained with: its config.yaml, or, when a kill left that unreadable or empty
    (or it was deleted), the config stored in its newest loadable checkpoint (config.yaml is rewritten at the start
    of every run)."""
    import yaml

    try:
        saved = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        saved = None
    if isinstance(saved, dict) and saved:
        return saved
    found = latest_valid_checkpoint(run_dir, warn=log)
    if found is None:
        return {}
    what = "unreadable or empty" if config_path.exists() else "missing"
    log(f"{config_path} is {what}; comparing with the config saved in {found[0].name}")
    return found[1]["config"]


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``section.key: old -> new`` for each setting that would make ``new`` another run than ``old``. A setting that
    ``old`` lacks was added to rpr-mt after that run began; at its default value it changes nothing. Settings whose
    values are mappings (data.splits, data.demo_sizes) compare whole: an entry they gain is a change. Model settings
    that the position scheme of both configs ignores (model.clip of an absolute model) change nothing."""
    sections = _section_paths(Config())
    defaults = _flat(config_to_dict(Config()), sections)
    old, new = _flat(old, sections), _flat(new, sections)
    ignored = set(unused_model_settings(old.get("model.positions", defaults["model.positions"])))
    ignored &= set(unused_model_settings(new.get("model.positions", defaults["model.positions"])))
    diffs = []
    for name in sorted(set(old) | set(new)):
        section, _, key = name.partition(".")
        if section not in ("data", "model", "train"):
            continue
        if section == "train" and key.split(".")[0] in RESUMABLE_TRAIN_KEYS:
            continue
        if section == "model" and key.split(".")[0] in ignored:
            continue
        if name == "train.run_dir":  # the run is this directory, however the path is spelled
            continue
        if name == "data.multi30k_dir":  # where Multi30k is read from (a copy, the download): prepare compares the
            continue  # files themselves, by checksum, and refuses a resume when they changed
        a, b = old.get(name), new.get(name)
        if name not in old and b == defaults.get(name):
            continue
        if a != b and _same_paths(name, a, b):  # "data1/", "./data1" and its absolute path are one directory
            continue
        if a != b:
            diffs.append(f"{name}: {yaml_value(a)} -> {yaml_value(b)}")
    return diffs


# Settings that name a file or directory, compared as the paths they resolve to (data.splits by its files' paths).
PATH_KEYS = ("data.output_dir", "data.multi30k_dir", "data.splits")


def _same_paths(name: str, old: Any, new: Any) -> bool:
    """Whether ``old`` and ``new`` of setting ``name`` (one of ``PATH_KEYS``) name the same files, spelled apart (a
    trailing slash, ``./``, relative against absolute from this directory): prepare takes them as one input, and a
    resume refused for it advised deleting the run."""
    if name not in PATH_KEYS:
        return False

    def resolved(value: Any) -> Any:
        if isinstance(value, str):
            return os.path.normpath(os.path.abspath(value))
        if isinstance(value, dict):
            return {key: resolved(item) for key, item in value.items()}
        return value

    return resolved(old) == resolved(new)


# What a validation's dev BLEU depends on besides the weights: changed on resume, the best checkpoint and patience
# compare scores measured two ways.
DEV_MEASURE_KEYS = ("train.valid_bleu", "train.valid_max_sentences", "train.valid_beam_size", "decode.length_penalty",
                    "decode.max_len_a", "decode.max_len_b", "decode.min_length")


def dev_measure_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each setting of ``DEV_MEASURE_KEYS`` that differs (one ``old`` lacks, at its default,
    does not)."""
    sections = _section_paths(Config())
    defaults = _flat(config_to_dict(Config()), sections)
    old, new = _flat(old, sections), _flat(new, sections)
    return [f"{name}: {yaml_value(old.get(name, defaults.get(name)))} -> {yaml_value(new.get(name))}"
            for name in DEV_MEASURE_KEYS if old.get(name, defaults.get(name)) != new.get(name)]


def _section_paths(config: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the config's sections, nested ones included: {"data", "model", "model.t5", ...}."""
    paths = set()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            paths.add(prefix + field.name)
            paths |= _section_paths(value, f"{prefix}{field.name}.")
    return paths


def _flat(tree: dict[str, Any], sections: set[str], prefix: str = "") -> dict[str, Any]:
    """{"model": {"t5": {"num_buckets": 32}}} -> {"model.t5.num_buckets": 32}: sections compare setting by setting;
    any other value, mappings included, is one setting."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and prefix + key in sections:
            flat.update(_flat(value, sections, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def remove_previous_run(run_dir: Path) -> None:
    """What --overwrite replaces: the checkpoints, metrics.jsonl, the TensorBoard events (left behind, the old events
    would show as a second curve beside the new run's) and ``rpr-mt plot``'s default curves.png of the run in
    ``run_dir``."""
    import shutil

    shutil.rmtree(checkpoint_dir(run_dir), ignore_errors=True)
    shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    (run_dir / "curves.png").unlink(missing_ok=True)


class RunDirLock:
    """Rank 0's advisory lock on a run directory while it trains, so that a second ``rpr-mt train`` into the same
    directory is refused instead of interleaving its metrics and checkpoints with the first's (the kernel drops the
    lock when a process dies, so a killed run never blocks its resumption). Entering creates the directory if
    needed and the lock file ``.train.lock``, which stays (deleting it would let two later runs lock two different
    files); leaving removes both again only if the directory was created here and holds nothing else (a command
    that fails early leaves the disk as it was). ``acquired`` is False only when another process holds the lock: a
    file system without locks (some network mounts) or no fcntl (Windows) trains unlocked, with a warning."""

    NAME = ".train.lock"

    def __init__(self, run_dir: Path, warn: Callable[[str], None] = print) -> None:
        self.run_dir = run_dir
        self.warn = warn
        self.acquired = False
        self._created: list[Path] = []  # the directories made here, deepest first
        self._handle = None

    def __enter__(self) -> "RunDirLock":
        missing = self.run_dir
        while not missing.exists() and missing != missing.parent:
            self._created.append(missing)
            missing = missing.parent
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.run_dir / self.NAME, "a")
        except OSError as exc:  # what check_run_dir could not foresee (a read-only or virtual file system): one line
            raise UserError(f"train.run_dir: cannot create {exc.filename or self.run_dir} "
                            f"({exc.strerror or exc})") from None
        self.acquired = True
        if fcntl is None:
            self.warn(f"warning: no file locks on this platform: a second training into {self.run_dir} would not "
                      "be refused")
            return self
        try:  # retried for an instant: `sweep --list` probes the lock
            self.acquired = try_exclusive_lock(self._handle)  # False: another process holds it
        except OSError as exc:  # ENOLCK, ENOSYS: the file system has no locks
            self.warn(f"warning: cannot lock {self.run_dir / self.NAME} ({exc.strerror}): a second training into "
                      f"{self.run_dir} would not be refused")
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()  # before any removal (Windows cannot delete an open file); this drops the lock
        if self._created and self.acquired and [p.name for p in self.run_dir.iterdir()] == [self.NAME]:
            (self.run_dir / self.NAME).unlink(missing_ok=True)
            for directory in self._created:
                if any(directory.iterdir()):
                    break
                directory.rmdir()
