"""``rpr-mt prepare``: raw parallel text -> cleaned text -> joint SentencePiece model -> token-id arrays + manifest.

Layout of ``data.output_dir``::

    manifest.json                       what was built from what (see ``_manifest``); written last
    spm.model, spm.vocab                joint SentencePiece model (pad=0, unk=1, bos=2, eos=3)
    {split}.{src,tgt}.ids.npy           token ids per split (see rpr_mt.data.binarize)
    {split}.{src,tgt}.offsets.npy
    {split}.{src_lang}, {split}.{tgt_lang}   cleaned UTF-8 text of every split except train (BLEU references and
                                        translation inputs; one line per official line, empty lines kept)
    casing.json                         for lowercased text (Multi30k's tok/ files) only: the casing model of the
                                        target language, learned from the raw training text (rpr_mt.text.casing)

Memory stays bounded whatever the corpus size: O(data.spm_sample_sentences) for the SentencePiece sample, plus one
encoding batch, plus (only with data.dedup) 8 bytes per kept training pair. Everything is written to a temporary
directory beside ``output_dir`` and renamed into place, so an interrupted run never leaves half-made data. The
manifest records the seconds each stage took ("seconds": inputs, reading, cleaning, sentencepiece, encoding,
binarizing, checksums, total).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TextIO

import rpr_mt
from rpr_mt.config import HUB_LOCAL_BUILDERS, DataConfig, is_pretokenized, validate_data, yaml_value
from rpr_mt.data import binarize, multi30k, sources
from rpr_mt.data.clean import CleanStats, TrainFilter, require_some_kept, write_clean_split
from rpr_mt.data.vocab import BOS_ID, EOS_ID, MODEL_FILE, PAD_ID, UNK_ID, ReservoirSample, Vocab, \
    train_sentencepiece
from rpr_mt.errors import UserError
from rpr_mt.text import casing

try:  # advisory lock that tells a live prepare run from a killed one; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the on-disk layout or its meaning changes: older prepared data becomes stale
MANIFEST = "manifest.json"
SAMPLE_SEED = 20180306  # seeds the reservoir sample SentencePiece trains on
_LOCK = ".lock"
_IO_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM}


# ------------------------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------------------------


def prepare(config: DataConfig, *, force: bool = False, progress: bool = True) -> Path:
    """Build the prepared data for ``config`` in ``config.output_dir`` (a no-op when it is up to date)."""
    validate_data(config)  # a config loaded from YAML was checked already; a DataConfig built in code was not
    out = Path(os.path.abspath(config.output_dir))  # normalised: "data/demo/" and "./data/demo" are one place
    if out.is_symlink() and not out.is_dir():  # the final rename would end in a traceback after all the work
        raise UserError(f"data.output_dir {config.output_dir} is a link to {os.readlink(out)}, which is not a "
                        "directory: make that directory, or remove the link")
    _remove_leftovers(out)
    reason = "--force"
    if not force:
        reason = check_prepared(config)
        if reason is None:
            log.info("%s is up to date (use --force to rebuild)", config.output_dir)
            _update_casing(config, out)
            return out
    if out.exists() and not (out / MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"data.output_dir {config.output_dir} exists and does not hold prepared data (no {MANIFEST}); "
                        "refusing to replace it: remove it or choose another data.output_dir")
    foreign = _foreign_entries(out)
    if foreign:  # the swap below deletes the old directory whole: a run directory put inside it went with it
        names = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"data.output_dir {config.output_dir} holds {names}, which `rpr-mt prepare` did not write; "
                        "preparing it again replaces the whole directory: move them out first, or choose another "
                        "data.output_dir")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise UserError(f"cannot create data.output_dir {out}: {exc.strerror or exc}") from None
    try:
        with _locked(tmp):
            manifest = _build(config, tmp, progress, announce=f"preparing {config.output_dir} ({reason})")
            _swap_into_place(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in _IO_ERRORS:  # disk full, permissions, ...: the user's to fix, not a bug
            raise UserError(f"{exc.filename or tmp}: {exc.strerror} (while preparing {config.output_dir})") from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for warning in _splits_equal_to_train(manifest):
        log.warning(f"warning: {warning}")
    _print_summary(manifest, sys.stdout)
    return out


def _splits_equal_to_train(manifest: dict[str, Any]) -> list[str]:
    """A line for each split whose input text is the training pairs' own (same sha256 on both sides; a path given
    twice, or a copy): its BLEU would measure recall of training sentences, and validation would choose the best
    checkpoint by it."""
    files = manifest.get("inputs", {}).get("files", {})
    train = tuple((files.get(f"train.{side}") or {}).get("sha256") for side in ("src", "tgt"))
    if None in train:
        return []
    return [f"split '{name}' has the same text as the training pairs ({files[f'{name}.src']['path']}, "
            f"{files[f'{name}.tgt']['path']}): its scores would measure recall of training sentences, not translation"
            for name in manifest.get("splits", {}) if name != "train"
            and tuple((files.get(f"{name}.{side}") or {}).get("sha256") for side in ("src", "tgt")) == train]


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a prepared data directory (UserError when missing or unreadable)."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise UserError(f"no prepared data in {data_dir} ({MANIFEST} missing); run `rpr-mt prepare`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: unreadable manifest (not a JSON object)")
    return manifest


def is_prepared(data_dir: str | Path) -> bool:
    """Whether ``data_dir`` holds prepared data: its manifest, which ``prepare`` writes last, is there."""
    return (Path(data_dir) / MANIFEST).is_file()


def prepared_vocab_sha256(data_dir: str | Path) -> Optional[str]:
    """The sha256 of the SentencePiece model the manifest of ``data_dir`` records (None when it is missing or
    unreadable)."""
    try:
        return read_manifest(data_dir)["sentencepiece"]["model_sha256"]
    except (UserError, KeyError, TypeError):
        return None


def training_data_fingerprint(data_dir: str | Path) -> Optional[str]:
    """One sha256 over the checksums its manifest records of the prepared training pairs (``train.*``), or None when
    it records none: what a run's checkpoints keep of the data they were trained on, so that a resume can tell when
    ``prepare`` rebuilt it since from other inputs (the inputs' own check compares them with the manifest, which
    that rebuild rewrote)."""
    checksums = read_manifest(data_dir).get("checksums", {})
    train = sorted((name, entry.get("sha256")) for name, entry in checksums.items()
                   if name.startswith("train.") and isinstance(entry, dict))
    return hashlib.sha256(json.dumps(train).encode()).hexdigest() if train else None


def check_prepared(config: DataConfig) -> Optional[str]:
    """None when ``config.output_dir`` holds data prepared from this config and these inputs, else a one-line
    reason starting with "missing" or "stale". Local inputs are re-hashed only when their size or mtime changed;
    hub datasets are compared by name and config (checking for new hub revisions would need the network)."""
    out = Path(config.output_dir)
    if not (out / MANIFEST).is_file():
        return f"missing: no prepared data in {out}"
    try:
        manifest = read_manifest(out)
    except UserError as exc:
        return f"stale: {exc}"
    reason = _changed_since(config, manifest)
    if reason:
        return f"stale: {reason}"
    _record_unchanged_inputs(out, config, manifest)
    checksums = manifest.get("checksums", {})
    for name in manifest.get("files", []):
        if not (out / name).is_file():
            return f"stale: {out / name} is missing"
        if name in checksums:
            try:
                binarize.verify_file(out / name, checksums[name])
            except UserError as exc:
                return f"stale: {exc}"
    return None


def changed_since_prepared(config: DataConfig) -> Optional[str]:
    """Why preparing ``config`` again would read other inputs or settings than ``config.output_dir`` was prepared
    from (and so could give another vocabulary), or None: unchanged, or nothing readable was prepared there. Damaged
    output files do not count: preparing the same inputs again rebuilds the same data."""
    out = Path(config.output_dir)
    if not (out / MANIFEST).is_file():
        return None
    try:
        manifest = read_manifest(out)
    except UserError:
        return None
    # SentencePiece learns from the training pairs alone: a corrected dev or test file leaves the vocabulary as it was
    return _changed_since(config, manifest, splits=("train",))


def dev_changed_since_prepared(config: DataConfig) -> Optional[str]:
    """Why the dev input differs from the one ``config.output_dir`` was prepared from, or None: what validation
    measures changes with it (the vocabulary does not; see ``changed_since_prepared``)."""
    out = Path(config.output_dir)
    try:
        manifest = read_manifest(out) if (out / MANIFEST).is_file() else None
    except UserError:
        return None
    return None if manifest is None else _inputs_changed(config, manifest.get("inputs", {}), splits=("dev",))


def settings_changed_since_prepared(config: DataConfig) -> Optional[str]:
    """Like ``changed_since_prepared``, for the data settings alone (``data.vocab_size 100 -> 120``): the directory
    was prepared since with other settings, e.g. for another config sharing its ``data.output_dir``, while the
    inputs may be the same."""
    out = Path(config.output_dir)
    try:
        manifest = read_manifest(out) if (out / MANIFEST).is_file() else None
    except UserError:
        return None
    return None if manifest is None else _settings_changed(config, manifest)


def _settings_changed(config: DataConfig, manifest: dict[str, Any]) -> Optional[str]:
    changed = _first_setting_changed(manifest.get("config", {}), relevant_config(config))
    return changed and f"data.{changed[0]} {changed[1]} there, {changed[2]} in this config"


def _changed_since(config: DataConfig, manifest: dict[str, Any],
                   splits: Optional[tuple[str, ...]] = None) -> Optional[str]:
    if manifest.get("format_version") != FORMAT_VERSION:
        return f"prepared with data format {manifest.get('format_version')}, this rpr-mt uses {FORMAT_VERSION}"
    changed = _first_setting_changed(manifest.get("config", {}), relevant_config(config))
    if changed:
        return f"data.{changed[0]} changed ({changed[1]} -> {changed[2]})"
    return _inputs_changed(config, manifest.get("inputs", {}), splits)


def _first_setting_changed(old: dict[str, Any], new: dict[str, Any]) -> Optional[tuple[str, str, str]]:
    """The first key whose recorded value differs, with both values as the user would write them."""
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before != after:
            if key == "multi30k_text":  # recorded only when not raw (relevant_config): absent is raw, not null
                before, after = before or "raw", after or "raw"
            return key, _short(before), _short(after)
    return None


def reference_files(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    """The cleaned source and target text of a non-training split (translate input, BLEU reference)."""
    manifest = read_manifest(data_dir)
    src, tgt = (Path(data_dir) / f"{split}.{manifest[k]}" for k in ("src_lang", "tgt_lang"))
    if not src.is_file() or not tgt.is_file():
        raise UserError(f"no text for split '{split}' in {data_dir} (have: {', '.join(manifest['splits'])})")
    return src, tgt


def relevant_config(config: DataConfig) -> dict[str, Any]:
    """The data config fields that affect the prepared output (paths are excluded: inputs are compared by hash)."""
    keys = ["source", "src_lang", "tgt_lang", "max_train_pairs", "max_words", "max_length_ratio", "dedup",
            "vocab_size", "spm_model_type", "spm_character_coverage", "spm_sample_sentences"]
    relevant: dict[str, Any] = {k: getattr(config, k) for k in keys}
    if config.source == "demo":
        relevant.update(demo_sizes=dict(config.demo_sizes), demo_seed=config.demo_seed)
    if config.source == "files":
        relevant["splits"] = {n: "tsv" if s.tsv is not None else "src+tgt" for n, s in config.splits.items()}
    if config.source == "hub":  # local files are compared by hash (the inputs), a hub dataset by these
        hub = config.hub
        relevant["hub"] = {"path": hub.path, "name": hub.name, "splits": dict(hub.splits), "revision": hub.revision,
                           "src_column": hub.src_column, "tgt_column": hub.tgt_column,
                           "data_files": None if hub.path in HUB_LOCAL_BUILDERS else hub.data_files}
    if config.source == "multi30k":
        # its files are read where they are (a given copy or the download cache) and compared by checksum: the one
        # value "local", which data prepared from a given directory recorded, keeps that data up to date
        relevant["multi30k_dir"] = "local"
        if config.multi30k_text != "raw":  # only when set, so that data prepared before the key stays up to date
            relevant["multi30k_text"] = config.multi30k_text
    return json.loads(json.dumps(relevant, sort_keys=True))  # normalise as it reads back from JSON


def config_hash(config: DataConfig) -> str:
    text = json.dumps({"format": FORMAT_VERSION, **relevant_config(config)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------------------------


def _build(config: DataConfig, tmp: Path, progress: bool, announce: str) -> dict[str, Any]:
    # seconds per stage, recorded in the manifest: where the time of a large corpus goes
    times: dict[str, float] = {}
    clock = time.perf_counter
    started = clock()
    corpus = sources.open_corpus(config, progress)
    if corpus.check is not None:
        corpus.check()
    times["inputs"] = clock() - started
    sample = ReservoirSample(config.spm_sample_sentences, SAMPLE_SEED)

    def add_to_sample(src: str, tgt: str) -> None:
        sample.add(src)
        sample.add(tgt)

    clean: dict[str, CleanStats] = {}
    for name, reader in corpus.splits.items():
        train = name == "train"
        with contextlib.closing(reader.open()) as pairs:  # type: ignore[arg-type]
            stats = write_clean_split(
                pairs, tmp / f"{name}.{config.src_lang}", tmp / f"{name}.{config.tgt_lang}",
                keep=TrainFilter(config.max_words, config.max_length_ratio, config.dedup) if train else None,
                limit=config.max_train_pairs if train else None, on_kept=add_to_sample if train else None,
                progress=progress, desc=f"reading {name}", total=reader.total, times=times,
            )
        if train:
            # how many were kept and dropped: the summary at the end says it
            require_some_kept(stats, reader.origin, config.max_words, config.max_length_ratio)
        elif stats.read == 0:
            raise UserError(f"the {name} split of {reader.origin} is empty")
        clean[name] = stats
    # said once every input has been read (exists, aligned, valid UTF-8, TSV with tabs, not empty): a bad input is
    # one error line, not two; the reading itself shows its own progress bar
    log.info(announce)

    log.info("training SentencePiece (%s, %d pieces) on %d sentences", config.spm_model_type, config.vocab_size,
             len(sample.items))
    before = clock()
    sample_size = len(sample.items)
    # drained as it is written to SentencePiece's input file: the sample's strings (~400 MB at 2M sentences) are
    # freed before the trainer loads its own copy, not held beside it
    model_path = train_sentencepiece(_drain(sample.items), tmp, vocab_size=config.vocab_size,
                                     model_type=config.spm_model_type,
                                     character_coverage=config.spm_character_coverage)
    del sample
    vocab = Vocab.load(model_path)
    times["sentencepiece"] = clock() - before

    tokens: dict[str, dict[str, binarize.SideStats]] = {}
    for name in corpus.splits:
        tokens[name] = {}
        for side, lang in (("src", config.src_lang), ("tgt", config.tgt_lang)):
            tokens[name][side] = binarize.binarize_text(
                tmp / f"{name}.{lang}", vocab, tmp, name, side, clean[name].kept, progress=progress,
                desc=f"encoding {name}.{lang}", times=times,
            )
        if name == "train":  # only dev/test text is kept (references); train text can be huge
            for lang in (config.src_lang, config.tgt_lang):
                (tmp / f"{name}.{lang}").unlink()

    manifest = _manifest(config, corpus.inputs, clean, tokens, vocab, sample_size)
    casing_entry = _learn_casing(config, tmp, corpus.inputs)
    if casing_entry is not None:
        manifest["casing"] = casing_entry
    manifest["files"] = sorted(p.name for p in tmp.iterdir() if p.name != _LOCK)
    # size and sha256 of every file: "up to date" means the same bytes, and loading verifies them
    before = clock()
    manifest["checksums"] = {name: binarize.file_checksum(tmp / name) for name in manifest["files"]}
    times["checksums"] = clock() - before
    times["total"] = clock() - started
    manifest["seconds"] = {stage: round(seconds, 3) for stage, seconds in times.items()}
    log.info("prepare took %.1f s (%s)", times["total"],
             ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in times.items() if stage != "total"))
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _drain(items: list[str]) -> Iterator[str]:
    """The items in order, each removed from the list as it is yielded."""
    items.reverse()
    while items:
        yield items.pop()


def _manifest(config: DataConfig, inputs: dict[str, Any], clean: dict[str, CleanStats],
              tokens: dict[str, dict[str, binarize.SideStats]], vocab: Vocab, sample_size: int) -> dict[str, Any]:
    splits = {}
    for name, stats in clean.items():
        entry: dict[str, Any] = {"read": stats.read, "kept": stats.kept}
        if name == "train":
            entry["dropped"] = stats.dropped
            entry["truncated_at"] = config.max_train_pairs
        for side, s in tokens[name].items():
            entry[f"{side}_tokens"], entry[f"{side}_unknown"] = s.tokens, s.unknown
        splits[name] = entry
    return {
        "format_version": FORMAT_VERSION,
        "package_version": rpr_mt.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": config.source,
        "src_lang": config.src_lang,
        "tgt_lang": config.tgt_lang,
        "config": relevant_config(config),
        "config_hash": config_hash(config),
        "inputs": inputs,
        "splits": splits,
        "id_dtype": str(binarize.id_dtype(vocab.size)),
        "sentencepiece": {
            "model_file": MODEL_FILE,
            "model_sha256": vocab.fingerprint,
            "model_type": config.spm_model_type,
            "vocab_size": vocab.size,
            "character_coverage": config.spm_character_coverage,
            "sample_limit": config.spm_sample_sentences,
            "sample_sentences": sample_size,
            "sample_seed": SAMPLE_SEED,
            "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID,
        },
    }


def _inputs_changed(config: DataConfig, old: dict[str, Any],
                    splits: Optional[tuple[str, ...]] = None) -> Optional[str]:
    """Why the inputs differ from those recorded in ``old`` (those of ``splits`` alone when given), or None."""
    if config.source == "demo":
        from rpr_mt.data.demo import GENERATOR_VERSION

        if old.get("kind") != "demo" or old.get("generator_version") != GENERATOR_VERSION:
            return f"the demo generator changed (version {old.get('generator_version')} -> {GENERATOR_VERSION})"
        return None
    if config.source == "hub" and config.hub.path in HUB_LOCAL_BUILDERS:
        return _hub_files_changed(config, old, splits)
    files = sources.local_inputs(config)
    if not files:  # hub
        if old.get("kind") != "hub":
            return "the inputs changed from local files to the Hugging Face hub"
        return None
    if old.get("kind") != "files":
        return "the inputs changed from the Hugging Face hub to local files"
    recorded: dict[str, Any] = old.get("files", {})
    if splits is not None:  # roles are "{split}.src", "{split}.tgt", "{split}.tsv"
        files = {role: path for role, path in files.items() if role.rsplit(".", 1)[0] in splits}
        recorded = {role: entry for role, entry in recorded.items() if role.rsplit(".", 1)[0] in splits}
    if set(recorded) != set(files):
        return f"the input files changed ({', '.join(sorted(set(recorded) ^ set(files)))})"
    for role, path in files.items():
        if not path.is_file():
            if multi30k.downloadable(path, recorded[role].get("sha256")):  # a cleared cache: the download gives it back
                continue
            if recorded[role].get("path") not in (None, str(path.resolve())):  # read from elsewhere (a Multi30k copy)
                return f"the {role} input is now {path}, which is missing (it was {recorded[role]['path']})"
            return f"input {path} is missing"
        before, stat = recorded[role], path.stat()
        same_stat = (before.get("path") == str(path.resolve()) and before.get("size") == stat.st_size
                     and before.get("mtime_ns") == stat.st_mtime_ns)
        if not same_stat and sources.sha256_file(path) != before.get("sha256"):
            if before.get("path") not in (None, str(path.resolve())):  # another file, not an edited one
                return f"the {role} input is now {path} (it was {before['path']})"
            return f"input {path} changed (sha256 differs)"
    return None


def _hub_files_changed(config: DataConfig, old: dict[str, Any], splits: Optional[tuple[str, ...]]) -> Optional[str]:
    """Why a local builder's files (data.source hub, data.hub.path parquet/json/...) differ from those recorded."""
    recorded: dict[str, Any] = old.get("data_files") or {}
    if old.get("kind") != "hub" or not isinstance(recorded, dict):
        return "the inputs changed to local files read through data.hub"
    try:
        now = sources.local_hub_files(config.hub)
    except UserError as exc:
        return str(exc)
    for split, paths in now.items():
        if splits is not None and split not in splits:
            continue
        before = {entry.get("path"): entry for entry in recorded.get(split, []) if isinstance(entry, dict)}
        current = [str(path.resolve()) for path in paths]
        if set(current) != set(before):
            changed = sorted(set(current) ^ set(before))
            return f"the data files of split {split} changed ({', '.join(changed[:3])})"
        for path, resolved in zip(paths, current):
            entry, stat = before[resolved], path.stat()
            if (entry.get("size"), entry.get("mtime_ns")) != (stat.st_size, stat.st_mtime_ns) \
                    and sources.sha256_file(path) != entry.get("sha256"):
                return f"input {path} changed (sha256 differs)"
    return None


def _record_unchanged_inputs(out: Path, config: DataConfig, manifest: dict[str, Any]) -> None:
    """Local inputs whose size or mtime moved but whose content is the same (touched, copied back, checked out
    again) were just re-hashed: record their new stat in the manifest, so the next start does not hash them again.
    Best effort: a read-only data directory keeps its manifest (and pays the hash each time)."""
    recorded: dict[str, Any] = manifest.get("inputs", {}).get("files", {})
    changed = False
    for role, path in sources.local_inputs(config).items():
        if not path.is_file():  # a cleared download cache (``_inputs_changed``)
            continue
        entry, stat = recorded.get(role), path.stat()
        now = dict(path=str(path.resolve()), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        if isinstance(entry, dict) and any(entry.get(key) != value for key, value in now.items()):
            entry.update(now)
            changed = True
    if not changed:
        return
    tmp = out / f".{MANIFEST}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, out / MANIFEST)  # atomic: a reader sees the old manifest or the new one
    except OSError:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------------------------
# Casing model (lowercased text only)
# ------------------------------------------------------------------------------------------------------------------


def casing_source(config: DataConfig) -> Optional[Path]:
    """The raw, cased target-language training file that the casing model of ``config``'s data is learned from, or
    None when its text keeps its case (only Multi30k's tok/ text is lowercased). Its lines align with those of the
    tok/ training file. It comes from the same copy as the tok/ text (downloaded into the cache when that is where
    the text comes from); when it cannot be had, the path where it was looked for."""
    if not is_pretokenized(config):
        return None
    try:
        return multi30k.multi30k_file(config, "train", config.tgt_lang, "raw")
    except UserError as exc:
        log.warning("warning: %s", exc)
        return multi30k.multi30k_file(config, "train", config.tgt_lang, "raw", fetch=False)


def _learn_casing(config: DataConfig, directory: Path, inputs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Learn the casing model of ``config``'s data into ``directory`` and return its manifest entry; None (with a
    warning where one was wanted) when the text keeps its case, or the raw training file is missing or does not
    align with the lowercased one (whose line count ``inputs``, the manifest's record of them, holds): translations
    then stay lowercase, and nothing else depends on the model."""
    path = casing_source(config)
    if path is None:
        return None
    if not path.is_file():
        log.warning("warning: no casing model: %s (the raw training text beside tok/) is missing, so translations of "
                    "raw text stay lowercase", path)
        return None
    lines = list(sources.read_lines(path))  # Multi30k's 29,000 lines: a few MB
    train_lines = inputs.get("files", {}).get("train.tgt", {}).get("lines")
    if len(lines) != train_lines:
        log.warning("warning: no casing model: %s has %d lines, the tokenized training text %d (they must align), "
                    "so translations of raw text stay lowercase", path, len(lines), train_lines)
        return None
    log.info("learning the %s casing model from %s", config.tgt_lang, path)
    model = casing.learn(casing.tokenize_cased(lines, config.tgt_lang), config.tgt_lang)
    casing.save(model, directory / casing.FILE_NAME)
    return {"file": casing.FILE_NAME, "lang": config.tgt_lang, "words": len(model.words),
            "learned_from": {"path": str(path.resolve()), "sha256": sources.sha256_file(path)}}


def _update_casing(config: DataConfig, out: Path) -> None:
    """Up-to-date data gets the casing model its raw training file gives, without being prepared again: learned when
    the data has none (prepared before casing models, or while the raw file was missing), learned again when the raw
    file is not the one it was learned from (the vocabulary and the id arrays come from the tok/ text alone, so only
    the casing model changes). The model, then the manifest that lists it, each written atomically."""
    manifest = read_manifest(out)
    source = casing_source(config)
    if source is None:
        return
    learned_from = manifest.get("casing", {}).get("learned_from", {}).get("sha256")
    if learned_from is not None and (not source.is_file() or sources.sha256_file(source) == learned_from):
        return  # unchanged, or nothing to learn it again from: the model learned earlier stays
    tmp = out / f".{MANIFEST}.tmp-{os.getpid()}"
    try:
        entry = _learn_casing(config, out, manifest.get("inputs", {}))
        if entry is None:
            return
        manifest["casing"] = entry
        manifest["files"] = sorted(set(manifest.get("files", [])) | {casing.FILE_NAME})
        manifest.setdefault("checksums", {})[casing.FILE_NAME] = binarize.file_checksum(out / casing.FILE_NAME)
        tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, out / MANIFEST)
    except OSError as exc:  # a read-only copy of the data: it stays usable as it is
        tmp.unlink(missing_ok=True)
        log.warning("warning: cannot write the casing model into %s (%s); translations of raw text keep the casing "
                    "they had", out, exc.strerror or exc)
        return
    log.info("%s the casing model %s in %s", "added" if learned_from is None else
             f"learned again (from the changed {source.name})", casing.FILE_NAME, out)


def _short(value: Any) -> str:
    text = yaml_value(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------------------------------
# Temporary directory, locking, atomic replacement
# ------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(tmp: Path) -> Iterator[None]:
    """Hold an advisory lock inside ``tmp`` while building, so a later run can tell our directory from a killed
    run's leftover (the kernel drops the lock when a process dies)."""
    lock = open(tmp / _LOCK, "w")
    try:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        lock.close()


def _remove_leftovers(out: Path) -> None:
    """Delete temporary/old directories of killed runs; refuse to run beside a live one."""
    if not out.parent.is_dir():
        return
    for path in out.parent.glob(f".{out.name}.*-*"):
        if not re.fullmatch(rf"\.{re.escape(out.name)}\.(tmp|old)-\d+", path.name) or not path.is_dir():
            continue
        if path.name.startswith(f".{out.name}.tmp-") and _is_locked(path / _LOCK):
            raise UserError(f"another `rpr-mt prepare` is writing {out} (temporary directory {path}); wait for it "
                            "to finish, or delete that directory if no such process is running")
        log.info("removing leftover %s from an interrupted run", path)
        shutil.rmtree(path, ignore_errors=True)


def _is_locked(lock_path: Path) -> bool:
    if fcntl is None or not lock_path.is_file():
        return False
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


# prepare's own file names (the layout above), for a directory whose manifest cannot say which files it wrote
_OWN_NAME = re.compile(r"casing\.json|spm\.(model|vocab)|[\w-]+\.(src|tgt)\.(ids|offsets)\.npy|[\w-]+\.[a-z]{2}")


def _foreign_entries(out: Path) -> list[str]:
    """Names in a prepared ``out`` that prepare did not write, sorted."""
    if not out.is_dir() or not (out / MANIFEST).is_file():
        return []
    own = _written_by_prepare(out)
    return sorted(p.name for p in out.iterdir() if not own(p.name))


def written_by_prepare(path: Path) -> bool:
    """Whether ``path`` is one of the files of a prepared data directory (what ``translate -o`` must not replace)."""
    return (path.parent / MANIFEST).is_file() and _written_by_prepare(path.parent)(path.name)


def _written_by_prepare(out: Path) -> Callable[[str], bool]:
    """Whether a name in the prepared ``out`` is one prepare wrote: listed in its manifest (or, when that is
    unreadable, shaped like prepare's files)."""
    try:
        listed = read_manifest(out).get("files")
    except UserError:
        listed = None

    def own(name: str) -> bool:
        if name == MANIFEST or name.startswith(f".{MANIFEST}.tmp-"):
            return True
        return name in listed if isinstance(listed, list) else bool(_OWN_NAME.fullmatch(name))

    return own


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished directory into place: old away, new in, old deleted."""
    (tmp / _LOCK).unlink()
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------------------------


def _print_summary(manifest: dict[str, Any], stream: TextIO) -> None:
    src_lang, tgt_lang = manifest["src_lang"], manifest["tgt_lang"]
    header = ("split", "pairs", f"{src_lang} tokens", f"{tgt_lang} tokens", f"{src_lang} mean", f"{tgt_lang} mean",
              f"{src_lang} unk", f"{tgt_lang} unk")
    rows = [header]
    for name, s in manifest["splits"].items():
        pairs = s["kept"]
        rows.append((
            name, f"{pairs:,}", f"{s['src_tokens']:,}", f"{s['tgt_tokens']:,}",
            f"{s['src_tokens'] / max(pairs, 1):.1f}", f"{s['tgt_tokens'] / max(pairs, 1):.1f}",
            f"{100 * s['src_unknown'] / max(s['src_tokens'], 1):.2f}%",
            f"{100 * s['tgt_unknown'] / max(s['tgt_tokens'], 1):.2f}%",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    spm_info = manifest["sentencepiece"]
    print(f"prepared {manifest['source']} {src_lang}->{tgt_lang}: {spm_info['model_type']} vocabulary of "
          f"{spm_info['vocab_size']} pieces (mean lengths in pieces)", file=stream)
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))),
              file=stream)
    train = manifest["splits"].get("train", {})
    if train.get("dropped"):
        dropped = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in train["dropped"].items())
        print(f"train: kept {train['kept']:,} of {train['read']:,} pairs read (dropped: {dropped})", file=stream)
