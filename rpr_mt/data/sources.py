"""Where raw parallel text comes from: local files (two aligned files or one TSV), Multi30k, WMT14, the demo generator.

Everything here streams: ``open_corpus`` returns, per split, a function that yields (source, target) pairs one at a
time, so no corpus is ever held in memory whole. Local files are read as bytes and decoded line by line so that
invalid UTF-8 is reported with its 1-based line number, and only ``\\n`` ends a line.
"""

from __future__ import annotations

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

from rpr_mt.config import DataConfig
from rpr_mt.data import demo, multi30k
from rpr_mt.errors import UserError

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


GZIP_MAGIC = b"\x1f\x8b"
# Other compressions' first bytes, with the tool that undoes them: only gzip is read, and their bytes read as text
# gave "invalid UTF-8" at some line, which says nothing of the cause.
# bzip2's "BZh" is ASCII, so its block size digit and first block's (or, empty, its end's) magic must follow.
OTHER_COMPRESSIONS = ((re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", re.DOTALL), "bzip2", "bunzip2"),
                      (re.compile(rb"\xfd7zXZ\x00"), "xz", "unxz"), (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd", "unzstd"),
                      (re.compile(rb"PK\x03\x04"), "a zip archive", "unzip"))  # OPUS's downloads


def refuse_unnamed_gzip(path: Path) -> None:
    """A compressed file that would be read as text (compressed bytes: a wrong line count, or invalid UTF-8 at a
    line that means nothing to the user): say what it is. A gzip file is read when its name ends in .gz; bzip2, xz
    and zstd are not read at all. Text never starts with these bytes."""
    if path.suffix == ".gz" or not path.is_file():
        return
    with open(path, "rb") as handle:
        head = handle.read(10)
    if head.startswith(GZIP_MAGIC):
        raise UserError(f"{path} is gzip-compressed but its name does not end in .gz: rename it {path.name}.gz "
                        "(or decompress it)")
    for magic, kind, tool in OTHER_COMPRESSIONS:
        if magic.match(head):
            if path.suffix in (".pt", ".pth"):  # torch.save writes a zip archive
                raise UserError(f"{path} is a PyTorch checkpoint, not text: give the text file")
            what = kind if kind.startswith("a ") else f"{kind}-compressed"
            raise UserError(f"{path} is {what}: rpr-mt reads plain text or gzip (.gz); {tool} {path.name} and give "
                            "it the text file")


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
    """Decoded lines without the line ending (or an opening byte-order mark); UserError names the file and 1-based
    line of invalid UTF-8."""
    path = Path(path)
    _check_readable(path)
    with _open_binary(path) as f:
        lineno = 0
        try:
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.rstrip(b"\n").decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UserError(f"{path}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
                # a byte-order mark opening the file is not text (left in a TSV's first source sentence before)
                yield line.removeprefix("\ufeff") if lineno == 1 else line
        except (OSError, EOFError, zlib.error) as exc:
            raise _read_error(path, exc, f" after line {lineno}") from None


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


def _hub_error(exc: Exception, dataset: str) -> Exception:
    """Map hub failures to one-line UserErrors; anything unrecognised is returned unchanged (a bug to see)."""
    if _is_unreachable(exc):
        return hub_unreachable(dataset, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if type(exc).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError", "FileNotFoundError"):
        return UserError(f"dataset '{dataset}' was not found on the Hugging Face hub; {_LOCAL_HINT}")
    if type(exc).__name__ == "ValueError" and "config" in str(exc).lower():
        return UserError(f"dataset '{dataset}': {str(exc).splitlines()[0]}")
    return exc


def _hub_revision(dataset: str) -> Optional[str]:
    """The commit of the hub dataset (pinned for all splits and recorded in the manifest), when it can be had."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return None  # offline mode: whatever revision is cached
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(dataset).sha
    except Exception as exc:  # noqa: BLE001 - the revision is informative only, unless the hub is down
        if _is_unreachable(exc):
            raise hub_unreachable(dataset, type(exc).__name__) from None
        return None


def _hub_pairs(dataset: str, name: Optional[str], split: str, revision: Optional[str],
               extract: Callable[[dict[str, Any]], Pair]) -> Iterator[Pair]:
    """Stream one split from the hub; ``streaming=True`` keeps memory bounded whatever the corpus size."""
    try:
        from datasets import load_dataset

        stream = load_dataset(dataset, name, split=split, streaming=True, revision=revision)
        for record in stream:
            yield extract(record)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a clear message where recognised
        raise _hub_error(exc, dataset) from None


def _hub_corpus(config: DataConfig, dataset: str, name: Optional[str],
                extract: Callable[[dict[str, Any]], Pair]) -> RawCorpus:
    if not _hub_reachable():
        raise hub_unreachable(dataset, "no connection to the hub endpoint")
    revision = _hub_revision(dataset)
    splits = {
        ours: SplitReader(ours, lambda hub_split=hub_split: _hub_pairs(dataset, name, hub_split, revision, extract),
                          f"{dataset}{'/' + name if name else ''} [{hub_split}]")
        for ours, hub_split in HUB_SPLITS.items()
    }
    inputs = {"kind": "hub", "dataset": dataset, "config": name, "revision": revision,
              "splits": dict(HUB_SPLITS)}
    return RawCorpus(splits, inputs)


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
        name = wmt14_config_name(src, tgt)
        return _hub_corpus(config, WMT14_HUB, name, lambda r: (r["translation"][src], r["translation"][tgt]))
    raise UserError(f"data.source must be one of demo, files, multi30k, wmt14 (got {config.source!r})")
