"""Multi30k (task 1): where its files are, and their download from the dataset's repository at a pinned commit.

The files (splits train, val and test_2016_flickr; languages en, de and fr; raw text and the dataset's own tokenized
text) are read from the first of:

1. ``data.multi30k_dir``, then 2. ``$RPR_MT_MULTI30K_DIR``: a local copy, in either layout::

       flat       DIR/{split}.{lang}.gz                DIR/tok/{split}.{lang}.gz
       upstream   DIR/data/task1/raw/{split}.{lang}.gz  DIR/data/task1/tok/{split}.lc.norm.tok.{lang}

   (upstream is the dataset's repository as cloned; a directory holding ``data/task1/`` is read as upstream);
3. the download cache, ``$XDG_CACHE_HOME/rpr-mt/multi30k`` (else ``~/.cache/rpr-mt/multi30k``), in the upstream
   layout: the files a config needs and the cache lacks are fetched from ``URL`` (``$RPR_MT_MULTI30K_URL`` names a
   mirror with the same layout), as sacreBLEU keeps its test sets.

A downloaded file takes its name in the cache only once its bytes match the SHA-256 pinned below (the repository at
``COMMIT``): it is written to a temporary name beside it, checked, then renamed. So an interrupted or corrupted
download leaves no file that a later run reads, and a cached file is checked again each time it is used.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from tqdm import tqdm

from rpr_mt.config import DataConfig
from rpr_mt.errors import UserError
from rpr_mt.host import give_new_file_mode

log = logging.getLogger(__name__)

COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"  # github.com/multi30k/dataset
URL = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/"
DIR_ENV = "RPR_MT_MULTI30K_DIR"  # a local copy, when data.multi30k_dir is not set
URL_ENV = "RPR_MT_MULTI30K_URL"  # a mirror of the repository's layout, instead of URL
PREFIXES = {"train": "train", "dev": "val", "test": "test_2016_flickr"}  # our split -> the dataset's file prefix
LANGS = ("en", "de", "fr")
TEXTS = ("raw", "tok")  # data.multi30k_text: cased untokenized text, or lowercased, normalized, Moses-tokenized
TIMEOUT_S = 60.0  # per connection attempt and per read: a stalled server is an error, not a hang

# SHA-256 and size in bytes of each file of the repository at COMMIT (the tok files are not gzipped there).
PINNED: dict[str, tuple[str, int]] = {
    "data/task1/raw/train.en.gz": ("d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f", 568929),
    "data/task1/raw/train.de.gz": ("726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6", 637044),
    "data/task1/raw/train.fr.gz": ("622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c", 604242),
    "data/task1/raw/val.en.gz": ("14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28", 21650),
    "data/task1/raw/val.de.gz": ("f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a", 24681),
    "data/task1/raw/val.fr.gz": ("ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9", 23001),
    "data/task1/raw/test_2016_flickr.en.gz": ("611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
                                              21077),
    "data/task1/raw/test_2016_flickr.de.gz": ("9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
                                              22890),
    "data/task1/raw/test_2016_flickr.fr.gz": ("6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
                                              22310),
    "data/task1/tok/train.lc.norm.tok.en": ("08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
                                            1837696),
    "data/task1/tok/train.lc.norm.tok.de": ("cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
                                            2150008),
    "data/task1/tok/train.lc.norm.tok.fr": ("8fa41bb718412bcb7c5dfa58603842810a01543eae86a51279f9886b901266e1",
                                            2235588),
    "data/task1/tok/val.lc.norm.tok.en": ("46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec", 64608),
    "data/task1/tok/val.lc.norm.tok.de": ("97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00", 77273),
    "data/task1/tok/val.lc.norm.tok.fr": ("b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a", 78242),
    "data/task1/tok/test_2016_flickr.lc.norm.tok.en": (
        "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2", 63307),
    "data/task1/tok/test_2016_flickr.lc.norm.tok.de": (
        "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4", 71917),
    "data/task1/tok/test_2016_flickr.lc.norm.tok.fr": (
        "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836", 76394),
}

LAYOUTS = ("{train,val,test_2016_flickr}.{en,de,fr}.gz with tok/ holding the same names (tokenized text), or the "
           "dataset's own data/task1/raw/{split}.{lang}.gz and data/task1/tok/{split}.lc.norm.tok.{lang}")
LOCAL_COPY = f"give a local copy with data.multi30k_dir or {DIR_ENV}, laid out as {LAYOUTS}"


@dataclass(frozen=True)
class Location:
    """Where a config's Multi30k files are: a local copy, or the download cache with the URL that fills it."""

    root: Path
    given_by: str  # "data.multi30k_dir", DIR_ENV or "download"
    url: Optional[str] = None  # the base URL the cache is filled from (the download alone)

    @property
    def upstream(self) -> bool:
        """Whether the files are laid out as in the dataset's repository (the cache always is)."""
        return self.url is not None or (self.root / "data" / "task1").is_dir()


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rpr-mt/multi30k``, else ``~/.cache/rpr-mt/multi30k`` (a relative XDG_CACHE_HOME is
    ignored, as the XDG specification says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "rpr-mt" / "multi30k"


def base_url() -> str:
    """``$RPR_MT_MULTI30K_URL`` (a mirror), else the repository at the pinned commit; with a final ``/``."""
    url = os.environ.get(URL_ENV) or URL
    return url if url.endswith("/") else url + "/"


def locate(config: DataConfig) -> Location:
    """data.multi30k_dir, else $RPR_MT_MULTI30K_DIR, else the download cache; nothing is read or fetched."""
    if config.multi30k_dir is not None:
        return Location(Path(config.multi30k_dir), "data.multi30k_dir")
    if os.environ.get(DIR_ENV):
        return Location(Path(os.path.expanduser(os.environ[DIR_ENV])), DIR_ENV)
    return Location(cache_dir(), "download", base_url())


def upstream_name(prefix: str, lang: str, text: str) -> str:
    """A file's path in the dataset's repository (and the cache)."""
    if text == "raw":
        return f"data/task1/raw/{prefix}.{lang}.gz"
    return f"data/task1/tok/{prefix}.lc.norm.tok.{lang}"


def flat_name(prefix: str, lang: str, text: str) -> str:
    return f"{prefix}.{lang}.gz" if text == "raw" else f"tok/{prefix}.{lang}.gz"


def multi30k_file(config: DataConfig, split: str, lang: str, text: Optional[str] = None, *, fetch: bool = True,
                  progress: bool = False) -> Path:
    """The path of one Multi30k file of ``config``'s copy (``split``: train, dev or test, or the dataset's prefix
    val or test_2016_flickr; ``text``: raw or tok, default data.multi30k_text), in whichever layout it has.

    ``fetch``: make sure it is there, downloaded and verified into the cache when no local copy is given (a local copy
    lacking it is a UserError naming the layouts); without it nothing is read or fetched, and the path is where
    the file is or would be."""
    prefix = PREFIXES.get(split, split)
    if prefix not in PREFIXES.values():
        raise UserError(f"Multi30k has no split '{split}' (splits: {', '.join(PREFIXES)})")
    if lang not in LANGS:
        raise UserError(f"'{lang}' is not a Multi30k language; available: {', '.join(LANGS)}")
    text = config.multi30k_text if text is None else text
    if text not in TEXTS:
        raise UserError(f"Multi30k has no text '{text}' (texts: {', '.join(TEXTS)})")
    where = locate(config)
    if where.url is not None:
        name = upstream_name(prefix, lang, text)
        return _fetch(where, name, progress) if fetch else where.root / name
    if fetch:
        _check_local_copy(where, text)
    name = upstream_name(prefix, lang, text) if where.upstream else flat_name(prefix, lang, text)
    path = where.root / name
    other = path.with_name(path.name[:-3]) if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    if other.is_file() and not path.is_file():  # the same text, decompressed or compressed
        return other
    if fetch and not path.is_file():
        raise UserError(f"Multi30k file not found: {path} ({where.given_by} {where.root} is read as "
                        f"{'the dataset' if where.upstream else 'the flat'} layout: {LAYOUTS})")
    return path


def input_files(config: DataConfig, *, fetch: bool = False, progress: bool = False) -> dict[str, Path]:
    """The files of ``config``'s language pair and text, keyed ``{split}.src``/``{split}.tgt`` as the other local
    inputs (``sources.local_inputs``); ``fetch`` as ``multi30k_file``'s."""
    for key in ("src_lang", "tgt_lang"):
        lang = getattr(config, key)
        if lang not in LANGS:
            raise UserError(f"data.{key} '{lang}' is not a Multi30k language; available: {', '.join(LANGS)}")
    where = locate(config)
    if fetch and where.url is not None:
        missing = [name for name in _names(config) if not (where.root / name).is_file()]
        if missing:
            size = sum(PINNED[name][1] for name in missing)
            log.info("downloading %d Multi30k file%s (%.1f MB) from %s into %s", len(missing),
                     "s" * (len(missing) > 1), size / 1e6, where.url, where.root)
    return {f"{split}.{role}": multi30k_file(config, split, lang, fetch=fetch, progress=progress)
            for split in PREFIXES for role, lang in (("src", config.src_lang), ("tgt", config.tgt_lang))}


def provenance(config: DataConfig) -> dict[str, Any]:
    """Where the files came from, for the prepared data's manifest: the URL and commit of the download, or the local
    copy's directory and layout."""
    where = locate(config)
    if where.url is not None:
        return {"from": "download", "url": where.url, "commit": COMMIT, "cache": str(where.root)}
    return {"from": where.given_by, "dir": str(where.root.resolve()),
            "layout": "upstream" if where.upstream else "flat"}


def downloadable(path: Path, sha256: Optional[str]) -> bool:
    """Whether ``path`` is a file of the download cache that a download gives back with exactly these bytes: data
    prepared from it is still up to date after the cache was cleared."""
    try:
        name = Path(os.path.abspath(path)).relative_to(os.path.abspath(cache_dir())).as_posix()
    except ValueError:
        return False
    return name in PINNED and PINNED[name][0] == sha256


def _names(config: DataConfig) -> list[str]:
    return [upstream_name(prefix, lang, config.multi30k_text) for prefix in PREFIXES.values()
            for lang in (config.src_lang, config.tgt_lang)]


def _check_local_copy(where: Location, text: str) -> None:
    root = where.root
    if not root.is_dir():
        relative = "" if root.is_absolute() else f" (that is {root.resolve()}: read from the current directory)"
        raise UserError(f"{where.given_by} not found: {root}{relative}")
    if text == "tok" and not where.upstream and not (root / "tok").is_dir():
        raise UserError(f"data.multi30k_text is tok, but {root} has no tok/ directory (the dataset's tokenized "
                        "files tok/{train,val,test_2016_flickr}.{lang}.gz, or data/task1/tok/ in its own layout)")


# ------------------------------------------------------------------------------------------------------------------
# The download
# ------------------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch(where: Location, name: str, progress: bool) -> Path:
    """``where.root / name``, downloaded from ``where.url`` unless the cache holds it with its pinned bytes."""
    target = where.root / name
    sha256, size = PINNED[name]
    if target.is_file():
        if _sha256(target) == sha256:
            return target
        log.warning("%s does not match its pinned SHA-256; downloading it again", target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    except OSError as exc:
        raise UserError(f"cannot write the Multi30k cache {where.root}: {exc.strerror or exc} (set XDG_CACHE_HOME "
                        f"to a writable directory, or {LOCAL_COPY})") from None
    url = where.url + name  # type: ignore[operator]
    try:
        with os.fdopen(fd, "wb") as out:
            give_new_file_mode(out.fileno())
            got, digest, announced = _download(url, out, size, progress)
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name says they are the file
        if got < (announced or size):  # less than the server said it sends (a shorter file is another file)
            raise UserError(f"the download of {url} stopped after {got:,} of {announced or size:,} bytes (the "
                            "connection closed early); nothing of it was kept: run again")
        if digest != sha256:
            raise UserError(f"{url} does not match the SHA-256 pinned for {name} at Multi30k commit {COMMIT[:12]} "
                            f"(got {digest[:16]}..., {got:,} bytes): not cached; a mirror ({URL_ENV}) must serve "
                            "that commit's files")
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _download(url: str, out: BinaryIO, size: int, progress: bool) -> tuple[int, str, Optional[int]]:
    """Stream ``url`` into ``out``: (bytes received, their SHA-256, the size the server announced, if it did). A
    failure to connect says where a local copy goes; one mid-body says the download was cut."""
    try:
        response = urllib.request.urlopen(url, timeout=TIMEOUT_S)  # noqa: S310 - http(s) or a file:// mirror
    except urllib.error.HTTPError as exc:
        raise UserError(f"cannot download Multi30k: {url} answered HTTP {exc.code} {exc.reason}; {LOCAL_COPY}") \
            from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise UserError(f"cannot download Multi30k from {url} ({reason}); {LOCAL_COPY}") from None
    digest, got = hashlib.sha256(), 0
    length = response.headers.get("Content-Length")
    announced = int(length) if length and length.isdigit() else None
    with response, tqdm(total=size, desc=f"downloading {url.rsplit('/', 1)[-1]}", unit="B", unit_scale=True,
                        leave=False, disable=not progress) as bar:
        while True:
            try:
                chunk = response.read(1 << 16)
            except (OSError, http.client.HTTPException) as exc:  # reset, timed out, cut mid-chunk
                raise UserError(f"the download of {url} stopped after {got:,} of {size:,} bytes "
                                f"({type(exc).__name__}: {exc}); nothing of it was kept: run again") from None
            if not chunk:
                return got, digest.hexdigest(), announced
            digest.update(chunk)
            out.write(chunk)
            got += len(chunk)
            bar.update(len(chunk))
