"""Where raw parallel text comes from: local files (two aligned files or one TSV), Multi30k, any Hugging Face dataset
(WMT14 is one), the demo generator.

Everything here streams: ``open_corpus`` returns, per split, a function that yields (source, target) pairs one at a
time, so no corpus is ever held in memory whole. Local files are read line by line by rpr_mt.lines, whose rule
(``\\n`` alone ends a line; invalid UTF-8 named with its 1-based line) every reader of text shares.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import os
import re
import socket
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional
from urllib.parse import urlparse

from tqdm import tqdm

from rpr_mt.config import HUB_LOCAL_BUILDERS, DataConfig, HubSettings
from rpr_mt.data import demo, multi30k
from rpr_mt.errors import UserError
from rpr_mt.lines import iter_lines, refuse_unnamed_gzip  # noqa: F401 (refuse_unnamed_gzip: also this module's)

Pair = tuple[str, str]

WMT14_HUB = "wmt/wmt14"  # the canonical id of the former "wmt14" dataset
WMT14_PAIRS = ("cs-en", "de-en", "fr-en", "hi-en", "ru-en")  # hub configs; either direction works
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}  # wmt14: validation = newstest2013, test = 2014


@dataclass
class SplitReader:
    """One split: a fresh stream of raw pairs on every call, plus what progress bars and messages need."""

    name: str
    open: Callable[[], Iterator[Pair]]
    origin: str  # human-readable description of the input, for messages
    total: Optional[int] = None  # number of pairs when known in advance


@dataclass
class RawCorpus:
    splits: dict[str, SplitReader]  # train first
    inputs: dict[str, Any] = field(default_factory=dict)  # provenance, recorded in the manifest
    # opens every split without reading it (prepare calls it first): a missing split or column is said up front
    check: Optional[Callable[[], None]] = None


@dataclass(frozen=True)
class FileInfo:
    path: str  # absolute
    sha256: str
    size: int
    mtime_ns: int
    lines: int

    def as_dict(self) -> dict[str, Any]:
        return dict(path=self.path, sha256=self.sha256, size=self.size, mtime_ns=self.mtime_ns, lines=self.lines)


# ------------------------------------------------------------------------------------------------------------------
# Local files
# ------------------------------------------------------------------------------------------------------------------


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise UserError(f"input file not found: {path}")
    if not path.is_file():
        raise UserError(f"input is not a file: {path}")
    if path.stat().st_size == 0:
        raise UserError(f"input file is empty: {path}")


def _open_binary(path: Path, *, decompress: bool = True) -> BinaryIO:
    try:
        if decompress and path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if decompress:
            refuse_unnamed_gzip(path)
        return open(path, "rb")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


class _HashingReader:
    """File wrapper that hashes the bytes read through it (so a .gz is hashed and decompressed in one pass)."""

    def __init__(self, raw: BinaryIO, on_read: Callable[[int], Any]) -> None:
        self.raw, self.hash, self.on_read = raw, hashlib.sha256(), on_read

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        self.on_read(len(data))
        return data

    def readable(self) -> bool:
        return True


def file_digest(path: Path, progress: bool = False) -> FileInfo:
    """sha256 of the file's bytes and its number of (decompressed) lines, in one streaming pass."""
    path = Path(path)
    _check_readable(path)
    refuse_unnamed_gzip(path)
    stat = path.stat()
    lines, last = 0, b""
    with _open_binary(path, decompress=False) as raw, \
            tqdm(total=stat.st_size, desc=f"checking {path.name}", unit="B", unit_scale=True, leave=False,
                 disable=not progress or stat.st_size < (64 << 20)) as bar:
        reader = _HashingReader(raw, bar.update)
        stream: Any = gzip.GzipFile(fileobj=reader, mode="rb") if path.suffix == ".gz" else reader  # type: ignore
        try:
            while chunk := stream.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        except (OSError, EOFError, zlib.error) as exc:
            raise _read_error(path, exc) from None
        while reader.read(1 << 20):  # hash any trailing bytes gzip did not need
            pass
    if last == b"":
        raise UserError(f"input file is empty: {path}")
    if last != b"\n":
        lines += 1  # last line without a final newline
    return FileInfo(str(path.resolve()), reader.hash.hexdigest(), stat.st_size, stat.st_mtime_ns, lines)


def _read_error(path: Path, exc: BaseException, where: str = "") -> UserError:
    if path.suffix == ".gz" and not isinstance(exc, PermissionError):
        return UserError(f"{path}: not a valid gzip file{where} ({exc})")
    return UserError(f"{path}: cannot read{where} ({exc})")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a local input file, under rpr_mt.lines' rule (``\\n`` ends a line, a byte-order mark opening a
    line is dropped, invalid UTF-8 is named with its file and line), after the checks that an input is there and not
    empty (``_check_readable``)."""
    path = Path(path)
    _check_readable(path)
    return iter_lines(path)


def read_parallel(src: Path, tgt: Path, src_lines: int, tgt_lines: int) -> Iterator[Pair]:
    """Pairs from two aligned files whose line counts were checked up front (see ``check_aligned``)."""
    check_aligned(src, tgt, src_lines, tgt_lines)
    missing = object()
    src_it, tgt_it = read_lines(src), read_lines(tgt)
    while True:
        s, t = next(src_it, missing), next(tgt_it, missing)
        if s is missing and t is missing:
            return
        if s is missing or t is missing:  # a file changed while we read it
            raise UserError(f"{src} and {tgt} have different numbers of lines (one changed while reading)")
        yield s, t  # type: ignore[misc]


def check_aligned(src: Path, tgt: Path, src_lines: int, tgt_lines: int) -> None:
    if src_lines != tgt_lines:
        raise UserError(f"{src} has {src_lines} lines but {tgt} has {tgt_lines}; parallel files must have the same "
                        "number of lines")


def read_tsv(path: Path) -> Iterator[Pair]:
    """Pairs from a ``source<TAB>target`` file; a line without exactly one tab is an error, except a blank one."""
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():  # an empty pair, as an empty line of two aligned files (training drops it, dev keeps it)
            yield "", ""
            continue
        tabs = line.count("\t")
        if tabs != 1:
            raise UserError(f"{path}:{lineno}: expected exactly one tab (source<TAB>target), found {tabs}")
        src, tgt = line.split("\t")
        yield src, tgt


def local_inputs(config: DataConfig) -> dict[str, Path]:
    """The local input files, keyed ``{split}.src``/``{split}.tgt``/``{split}.tsv``; empty for demo and hub data.
    Multi30k's are where they are or would be (``multi30k.input_files``): nothing is downloaded here."""
    if config.source == "files":
        files: dict[str, Path] = {}
        for name, split in config.splits.items():
            if split.tsv is not None:
                files[f"{name}.tsv"] = Path(split.tsv)
            else:
                files[f"{name}.src"] = Path(split.src)  # type: ignore[arg-type]
                files[f"{name}.tgt"] = Path(split.tgt)  # type: ignore[arg-type]
        return files
    if config.source == "multi30k":
        return multi30k.input_files(config)
    return {}


def _file_splits(config: DataConfig, progress: bool) -> RawCorpus:
    paths = local_inputs(config)
    infos = {role: file_digest(path, progress) for role, path in paths.items()}
    names = sorted({role.rsplit(".", 1)[0] for role in infos}, key=_split_order)
    splits: dict[str, SplitReader] = {}
    for name in names:
        if f"{name}.tsv" in infos:
            tsv = paths[f"{name}.tsv"]
            splits[name] = SplitReader(name, lambda tsv=tsv: read_tsv(tsv), str(tsv), infos[f"{name}.tsv"].lines)
        else:
            s, t = infos[f"{name}.src"], infos[f"{name}.tgt"]
            src, tgt = paths[f"{name}.src"], paths[f"{name}.tgt"]
            if os.path.samefile(src, tgt):  # a copy-paste slip: it prepared a corpus that translates text into itself
                raise UserError(f"data.splits.{name}: src and tgt are the same file ({src}); give the target-language "
                                "file as tgt")
            check_aligned(src, tgt, s.lines, t.lines)
            splits[name] = SplitReader(
                name, lambda src=src, tgt=tgt, s=s, t=t: read_parallel(src, tgt, s.lines, t.lines),
                f"{src} / {tgt}", s.lines,
            )
    return RawCorpus(splits, {"kind": "files", "files": {role: info.as_dict() for role, info in infos.items()}})


def _split_order(name: str) -> tuple[int, str]:
    return ({"train": 0, "dev": 1, "test": 2}.get(name, 3), name)


# ------------------------------------------------------------------------------------------------------------------
# Hugging Face hub
# ------------------------------------------------------------------------------------------------------------------

_LOCAL_HINT = "use local files instead (data.source: files with data.splits, or data.multi30k_dir for Multi30k)"


def hub_unreachable(dataset: str, detail: str = "") -> UserError:
    detail = f" ({detail})" if detail else ""
    return UserError(f"the Hugging Face hub is unreachable, cannot load dataset '{dataset}'{detail}; {_LOCAL_HINT}")


def _hub_reachable(timeout: float = 5.0) -> bool:
    """Quick TCP check of the hub endpoint; avoids datasets' long retry loop when there is no network at all."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return True  # offline mode: let datasets use its cache (and fail clearly if the data is not cached)
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return True  # a direct connection test says nothing behind a proxy
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


_UNREACHABLE_NAMES = {"ConnectError", "ConnectTimeout", "ReadTimeout", "Timeout", "TimeoutException",
                      "OfflineModeIsEnabled", "LocalEntryNotFoundError", "ProxyError", "SSLError"}


def _is_unreachable(exc: BaseException) -> bool:
    seen: set[int] = set()
    node: Optional[BaseException] = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, (ConnectionError, TimeoutError, socket.gaierror)):
            return True
        if type(node).__name__ in _UNREACHABLE_NAMES or "Couldn't reach" in str(node):
            return True
        node = node.__cause__ or node.__context__
    return False


def _hub_revision(dataset: str) -> Optional[str]:
    """The commit of the hub dataset (pinned for all splits and recorded in the manifest), when it can be had. A
    dataset the hub does not have is said here, before anything is read."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return None  # offline mode: whatever revision is cached
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(dataset).sha
    except Exception as exc:  # noqa: BLE001 - the revision is informative only, unless the hub is down
        if _is_unreachable(exc):
            raise hub_unreachable(dataset, type(exc).__name__) from None
        if type(exc).__name__ == "GatedRepoError":
            raise UserError(f"dataset '{dataset}' on the Hugging Face hub is gated: accept its conditions on its "
                            "page and log in (hf auth login, or set HF_TOKEN)") from None
        if type(exc).__name__ == "RepositoryNotFoundError":
            raise UserError(f"dataset '{dataset}' was not found on the Hugging Face hub (data.hub.path; a private "
                            "one needs a login: hf auth login, or HF_TOKEN)") from None
        return None


_ARROW_BATCH = 4096  # rows converted from Arrow to Python at a time: ~7x faster than a dict per row


@dataclass(frozen=True)
class HubSource:
    """One dataset read through ``datasets.load_dataset(..., streaming=True)``: a hub id or a local builder."""

    path: str
    name: Optional[str]
    splits: dict[str, str]  # ours -> the dataset's
    src_lang: str
    tgt_lang: str
    revision: Optional[str] = None
    data_files: Any = None  # as load_dataset takes it; local builders: absolute paths, globs resolved
    src_column: Optional[str] = None  # None: the translation column of {lang: text}
    tgt_column: Optional[str] = None

    @property
    def local(self) -> bool:
        return self.path in HUB_LOCAL_BUILDERS

    def describe(self, split: Optional[str] = None) -> str:
        """The dataset (and one of its splits) as messages name it."""
        what = f"{self.path} files" if self.local else f"dataset '{self.path}'"
        return what + (f" ({self.name})" if self.name else "") + (f", split '{split}'" if split else "")

    def load(self, split: str) -> Any:
        """The dataset's split as a stream (datasets.IterableDataset): nothing is read until it is iterated."""
        from datasets import load_dataset

        kwargs: dict[str, Any] = dict(split=split, streaming=True, revision=self.revision)
        if self.data_files is not None:
            kwargs["data_files"] = self.data_files
        return load_dataset(self.path, self.name, **kwargs)

    def columns(self) -> str:
        return (f"columns '{self.src_column}' and '{self.tgt_column}'" if self.src_column
                else f"the translation column's '{self.src_lang}' and '{self.tgt_lang}'")


def _missing(source: HubSource, split: str, what: str, have: Any, hint: str) -> UserError:
    have_text = ", ".join(map(str, have)) or "none"
    return UserError(f"{source.describe(split)}: {what} (it has: {have_text}); {hint}")


def _check_features(source: HubSource, split: str, features: Any) -> None:
    """The pair's columns against the features a stream declares before it is read (parquet, json, hub metadata)."""
    if not features:
        return
    columns = list(features)
    if source.src_column is not None:
        for key, column in (("src_column", source.src_column), ("tgt_column", source.tgt_column)):
            if column not in columns:
                raise _missing(source, split, f"no column '{column}' (data.hub.{key})", columns,
                               f"set data.hub.{key} to one of its columns")
        return
    if "translation" not in columns:
        raise _missing(source, split, "no column 'translation'", columns,
                       "name the two text columns in data.hub.src_column and data.hub.tgt_column")
    feature = features["translation"]
    langs = list(feature) if isinstance(feature, dict) else list(getattr(feature, "languages", None) or [])
    _check_langs(source, split, langs)


def _check_langs(source: HubSource, split: str, langs: list[str]) -> None:
    for key in ("src_lang", "tgt_lang"):
        lang = getattr(source, key)
        if langs and lang not in langs:
            raise _missing(source, split, f"the translation column has no '{lang}' (data.{key})", langs,
                           "set data.src_lang and data.tgt_lang to two of its languages")


def _text(values: list[Any], source: HubSource, split: str, column: str) -> list[str]:
    """Null cells are empty text (dev and test keep their line; training drops the pair as empty)."""
    if all(isinstance(v, str) for v in values):
        return values
    for v in values:
        if v is not None and not isinstance(v, str):
            raise UserError(f"{source.describe(split)}: {column} holds {type(v).__name__} values ({v!r}), not text")
    return ["" if v is None else v for v in values]


def _table_pairs(table: Any, source: HubSource, split: str) -> Iterator[Pair]:
    """The pairs of one Arrow record batch (a pyarrow.Table)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    if source.src_column is not None:
        cols = []
        for key, column in (("src_column", source.src_column), ("tgt_column", source.tgt_column)):
            if column not in names:
                raise _missing(source, split, f"no column '{column}' (data.hub.{key})", names,
                               f"set data.hub.{key} to one of its columns")
            cols.append(_text(table.column(column).to_pylist(), source, split, f"column '{column}'"))
        return zip(*cols)
    if "translation" not in names:
        raise _missing(source, split, "no column 'translation'", names,
                       "name the two text columns in data.hub.src_column and data.hub.tgt_column")
    column = table.column("translation")
    if not pa.types.is_struct(column.type):
        raise UserError(f"{source.describe(split)}: the translation column holds {column.type}, not "
                        "{language: text}; name two text columns in data.hub.src_column and data.hub.tgt_column")
    _check_langs(source, split, [column.type.field(i).name for i in range(column.type.num_fields)])
    return zip(*(_text(pc.struct_field(column, lang).to_pylist(), source, split, f"translation '{lang}'")
                 for lang in (source.src_lang, source.tgt_lang)))


def _record_pair(record: dict[str, Any], source: HubSource, split: str) -> Pair:
    """The pair of one record, for a stream that is not a datasets.IterableDataset (no Arrow batches)."""
    if source.src_column is not None:
        keys = (source.src_column, source.tgt_column)
        for key, column in zip(("src_column", "tgt_column"), keys):
            if column not in record:
                raise _missing(source, split, f"no column '{column}' (data.hub.{key})", list(record),
                               f"set data.hub.{key} to one of its columns")
        return tuple(_text([record[k] for k in keys], source, split, "a column"))  # type: ignore[return-value]
    if "translation" not in record:
        raise _missing(source, split, "no column 'translation'", list(record),
                       "name the two text columns in data.hub.src_column and data.hub.tgt_column")
    _check_langs(source, split, list(record["translation"]))
    return record["translation"][source.src_lang], record["translation"][source.tgt_lang]


def _hub_pairs(source: HubSource, split: str) -> Iterator[Pair]:
    """Stream one split; ``streaming=True`` keeps memory bounded whatever the corpus size."""
    try:
        stream = source.load(split)
        if hasattr(stream, "with_format"):  # a datasets.IterableDataset: Arrow batches, not a dict per row
            for table in stream.with_format("arrow").iter(batch_size=_ARROW_BATCH):
                yield from _table_pairs(table, source, split)
        else:
            for record in stream:
                yield _record_pair(record, source, split)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a clear message where recognised
        raise _hub_error(exc, source, split) from None


def _check_splits(source: HubSource) -> None:
    """Open every split's stream (reading nothing) so that a split the dataset lacks, or a column or language its
    features lack, is said before hours of reading the training split."""
    for ours, theirs in source.splits.items():
        try:
            stream = source.load(theirs)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _hub_error(exc, source, theirs, ours) from None
        _check_features(source, theirs, getattr(stream, "features", None))


_BAD_SPLIT = re.compile(r"Bad split: (.*?)\. Available splits: \[(.*)\]")


def _hub_error(exc: Exception, source: "HubSource | str", split: Optional[str] = None,
               ours: Optional[str] = None) -> Exception:
    """Map hub failures to one-line UserErrors; anything unrecognised is returned unchanged (a bug to see)."""
    dataset = source.path if isinstance(source, HubSource) else source
    what = source.describe() if isinstance(source, HubSource) else f"dataset '{dataset}'"
    if _is_unreachable(exc):
        return hub_unreachable(dataset, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    bad_split = _BAD_SPLIT.search(str(exc))
    if bad_split:
        have = ", ".join(s.strip().strip("'\"") for s in bad_split.group(2).split(",") if s.strip())
        key = f"data.hub.splits.{ours}" if ours else "data.hub.splits"
        return UserError(f"{what} has no split '{bad_split.group(1)}' ({key}); its splits: {have or 'none'}")
    if type(exc).__name__ == "RevisionNotFoundError":
        return UserError(f"{what}: revision not found (data.hub.revision): {str(exc).splitlines()[0]}")
    if type(exc).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError", "FileNotFoundError"):
        if isinstance(source, HubSource) and source.local:
            return UserError(f"{what}: {str(exc).splitlines()[0]} (data.hub.data_files)")
        return UserError(f"dataset '{dataset}' was not found on the Hugging Face hub; {_LOCAL_HINT}")
    if type(exc).__name__ == "ValueError" and "config" in str(exc).lower():
        return UserError(f"{what}: {str(exc).splitlines()[0]}")
    if type(exc).__name__ in ("ArrowInvalid", "JSONDecodeError", "ParserError", "DatasetGenerationError"):
        return UserError(f"{what}{f', split {split!r}' if split else ''}: cannot read it "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return exc


def _local_files(patterns: Any) -> dict[str, list[Path]]:
    """A local builder's data_files, {its split: files}: every glob resolved against the current directory (a
    string or list is the split "train", as load_dataset reads it), each match a file."""
    by_split = patterns if isinstance(patterns, dict) else {"train": patterns}
    resolved: dict[str, list[Path]] = {}
    for split, value in by_split.items():
        files: list[Path] = []
        for pattern in [value] if isinstance(value, str) else value:
            full = os.path.abspath(os.path.expanduser(pattern))
            matches = sorted(glob.glob(full, recursive=True)) if glob.has_magic(full) else [full]
            for match in matches:
                path = Path(match)
                if path.is_dir():
                    raise UserError(f"data.hub.data_files: {path} is a directory; give its files (e.g. "
                                    f"{path}/*.parquet)")
                if not path.is_file():
                    where = "" if os.path.isabs(os.path.expanduser(pattern)) else \
                        f" (read from the current directory {os.getcwd()})"
                    raise UserError(f"data.hub.data_files: no such file: {pattern}{where}")
                files.append(path)
            if not matches:
                raise UserError(f"data.hub.data_files: no file matches {pattern} ({full})")
        resolved[str(split)] = files
    return resolved


def _file_stat(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return dict(path=str(path.resolve()), sha256=sha256_file(path), size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def hub_source(settings: HubSettings, src_lang: str, tgt_lang: str) -> HubSource:
    """The dataset ``settings`` names, its local files resolved (UserError when one is missing)."""
    assert settings.path is not None  # validate_hub
    data_files = settings.data_files
    if settings.path in HUB_LOCAL_BUILDERS:
        data_files = {split: [str(p) for p in paths] for split, paths in _local_files(data_files).items()}
    elif os.path.exists(os.path.expanduser(settings.path)):
        raise UserError(f"data.hub.path {settings.path} is a local path: set data.hub.path to its files' format "
                        f"({', '.join(HUB_LOCAL_BUILDERS)}) and data.hub.data_files to the files")
    return HubSource(settings.path, settings.name, dict(settings.splits), src_lang, tgt_lang, settings.revision,
                     data_files, settings.src_column, settings.tgt_column)


def local_hub_files(settings: HubSettings) -> dict[str, list[Path]]:
    """A local builder's files for each of our splits (empty for a hub dataset)."""
    if settings.path not in HUB_LOCAL_BUILDERS:
        return {}
    files = _local_files(settings.data_files)
    return {ours: files.get(theirs, []) for ours, theirs in settings.splits.items()}


def open_hub(settings: HubSettings, src_lang: str, tgt_lang: str) -> RawCorpus:
    """Any dataset ``datasets.load_dataset`` streams: a hub id (its revision pinned and recorded) or local files
    (their sha256 recorded); the pair is the translation column's two languages, or two named text columns."""
    source = hub_source(settings, src_lang, tgt_lang)
    inputs: dict[str, Any] = {"kind": "hub", "dataset": source.path, "config": source.name}
    if source.local:
        inputs["data_files"] = {ours: [_file_stat(p) for p in paths]
                                for ours, paths in local_hub_files(settings).items()}
    else:
        if not _hub_reachable():
            raise hub_unreachable(source.path, "no connection to the hub endpoint")
        if source.revision is None:
            source = dataclasses.replace(source, revision=_hub_revision(source.path))
        if source.data_files is not None:
            inputs["data_files"] = source.data_files
    inputs["revision"] = source.revision
    inputs["splits"] = dict(source.splits)
    if source.src_column is not None:
        inputs["columns"] = {"src": source.src_column, "tgt": source.tgt_column}
    splits = {
        ours: SplitReader(ours, lambda theirs=theirs: _hub_pairs(source, theirs),
                          f"{source.path}{'/' + source.name if source.name else ''} [{theirs}]")
        for ours, theirs in sorted(source.splits.items(), key=lambda kv: _split_order(kv[0]))
    }
    return RawCorpus(splits, inputs, check=lambda: _check_splits(source))


def wmt14_settings(src_lang: str, tgt_lang: str) -> HubSettings:
    """WMT14 is one hub dataset: its language pair's config, the translation column, validation = newstest2013 and
    test = newstest2014."""
    return HubSettings(path=WMT14_HUB, name=wmt14_config_name(src_lang, tgt_lang), splits=dict(HUB_SPLITS))


def wmt14_config_name(src_lang: str, tgt_lang: str) -> str:
    langs = {src_lang, tgt_lang}
    for pair in WMT14_PAIRS:
        if set(pair.split("-")) == langs:
            return pair
    available = ", ".join(WMT14_PAIRS)
    raise UserError(f"data.source 'wmt14' has no {src_lang}-{tgt_lang} language pair (data.src_lang/data.tgt_lang); "
                    f"available: {available} (either direction)")


# ------------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------------


def open_corpus(config: DataConfig, progress: bool = False) -> RawCorpus:
    """Check the inputs of ``config.source`` (local files: existence, size, UTF-8 is checked while streaming, line
    counts and sha256 now) and return a streaming reader per split."""
    src, tgt = config.src_lang, config.tgt_lang
    if config.source == "demo":
        if "train" not in config.demo_sizes:
            raise UserError("data.demo_sizes must have a 'train' entry")
        sizes = dict(config.demo_sizes)
        splits = {
            name: SplitReader(name, lambda n=n, name=name: demo.iter_demo(n, config.demo_seed, name),
                              f"demo generator v{demo.GENERATOR_VERSION} (seed {config.demo_seed}, {name})", n)
            for name, n in sorted(sizes.items(), key=lambda kv: _split_order(kv[0]))
        }
        inputs = {"kind": "demo", "generator_version": demo.GENERATOR_VERSION, "seed": config.demo_seed,
                  "sizes": sizes}
        return RawCorpus(splits, inputs)
    if config.source == "files":
        if "train" not in config.splits:
            raise UserError("data.splits must name a 'train' split when data.source is 'files'")
        return _file_splits(config, progress)
    if config.source == "multi30k":
        # a local copy (data.multi30k_dir, $RPR_MT_MULTI30K_DIR) is checked, else the files are downloaded (verified)
        multi30k.input_files(config, fetch=True, progress=progress)
        corpus = _file_splits(config, progress)
        corpus.inputs["multi30k"] = multi30k.provenance(config)
        return corpus
    if config.source == "wmt14":
        return open_hub(wmt14_settings(src, tgt), src, tgt)
    if config.source == "hub":
        return open_hub(config.hub, src, tgt)
    raise UserError(f"data.source must be one of demo, files, multi30k, wmt14, hub (got {config.source!r})")
