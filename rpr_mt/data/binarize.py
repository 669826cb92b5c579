"""Token-id arrays: writing them from cleaned text, and the memory-mapped reader the trainer uses.

Per split and side (``src``/``tgt``) two numpy files::

    {split}.{side}.ids.npy      all sentences' piece ids concatenated (uint16 if the vocabulary has < 65536
                                pieces, else int32); bare pieces, no bos/eos
    {split}.{side}.offsets.npy  int64, len = sentences + 1; sentence i is ids[offsets[i]:offsets[i+1]]

Both load with ``mmap_mode="r"``, so training touches only the pages it reads.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

import numpy as np
from tqdm import tqdm

from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError

SIDES = ("src", "tgt")
_BATCH_LINES = 8192  # sentences encoded per SentencePiece call: bounds memory while keeping the C++ side busy
_COPY_CHUNK = 1 << 16  # bytes copied per step from the raw scratch file into the .npy


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.int32)


def ids_file(data_dir: Path, split: str, side: str) -> Path:
    return Path(data_dir) / f"{split}.{side}.ids.npy"


def offsets_file(data_dir: Path, split: str, side: str) -> Path:
    return Path(data_dir) / f"{split}.{side}.offsets.npy"


@dataclass
class SideStats:
    sentences: int = 0
    tokens: int = 0
    unknown: int = 0


def _read_text(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:  # split on b"\n" only, like the writer
        for raw in f:
            yield raw.rstrip(b"\n").decode("utf-8")


def binarize_text(
    text_path: Path,
    vocab: Vocab,
    data_dir: Path,
    split: str,
    side: str,
    n_lines: int,
    *,
    progress: bool = True,
    desc: str = "",
    times: Optional[dict[str, float]] = None,
) -> SideStats:
    """Encode ``text_path`` (``n_lines`` lines) into the id and offset files of (split, side).

    Memory is O(one batch of sentences), whatever the corpus size: offsets are written to their .npy and ids to a
    scratch file as they are produced, and the scratch file is copied behind the ids' .npy header in chunks. Plain
    writes, not memory maps: a written map's pages stay resident in this process until it ends, so its memory
    would grow with the corpus. ``times`` (optional) accumulates the seconds SentencePiece spends encoding
    ("encoding") and the rest ("binarizing": reading the text, the id and offset arrays)."""
    started, encoding = time.perf_counter(), 0.0
    dtype = id_dtype(vocab.size)
    stats = SideStats()
    scratch = Path(data_dir) / f"{split}.{side}.ids.tmp"
    lines = _read_text(text_path)
    with open(offsets_file(data_dir, split, side), "wb") as offsets_out, open(scratch, "wb") as out, \
            tqdm(total=n_lines, desc=desc, unit=" sent", unit_scale=True, disable=not progress, leave=False) as bar:
        _write_npy_header(offsets_out, np.dtype(np.int64), n_lines + 1)
        offsets_out.write(np.zeros(1, dtype=np.int64).tobytes())
        while batch := list(islice(lines, _BATCH_LINES)):
            if stats.sentences + len(batch) > n_lines:
                raise RuntimeError(f"{text_path} has more than the expected {n_lines} lines")
            before = time.perf_counter()
            encoded = vocab.encode_batch(batch)
            encoding += time.perf_counter() - before
            lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
            flat = np.fromiter(chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
            offsets_out.write((stats.tokens + np.cumsum(lengths)).tobytes())
            out.write(flat.astype(dtype).tobytes())
            stats.sentences += len(batch)
            stats.tokens += int(flat.size)
            stats.unknown += int(np.count_nonzero(flat == vocab.unk_id))
            bar.update(len(batch))
    if stats.sentences != n_lines:
        raise RuntimeError(f"{text_path} has {stats.sentences} lines, expected {n_lines}")
    _scratch_to_npy(scratch, ids_file(data_dir, split, side), dtype, stats.tokens)
    if times is not None:
        times["encoding"] = times.get("encoding", 0.0) + encoding
        times["binarizing"] = times.get("binarizing", 0.0) + time.perf_counter() - started - encoding
    return stats


def _write_npy_header(out: BinaryIO, dtype: np.dtype, count: int) -> None:
    """The .npy header of a 1-D array of ``count`` ``dtype`` values; the values follow it in the file."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)}
    np.lib.format.write_array_header_1_0(out, header)


def _scratch_to_npy(scratch: Path, target: Path, dtype: np.dtype, count: int) -> None:
    with open(scratch, "rb") as source, open(target, "wb") as out:
        _write_npy_header(out, dtype, count)
        shutil.copyfileobj(source, out, _COPY_CHUNK)
    scratch.unlink()


class ParallelIds:
    """Memory-mapped token ids of one split: ``len()``, ``src(i)``/``tgt(i)`` and per-sentence lengths."""

    def __init__(self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray,
                 tgt_offsets: np.ndarray) -> None:
        if len(src_offsets) != len(tgt_offsets):
            raise ValueError("source and target have different numbers of sentences")
        self._src, self._src_off = src_ids, src_offsets
        self._tgt, self._tgt_off = tgt_ids, tgt_offsets
        self.src_lengths: np.ndarray = np.diff(src_offsets)
        self.tgt_lengths: np.ndarray = np.diff(tgt_offsets)

    def __len__(self) -> int:
        return len(self._src_off) - 1

    def src(self, i: int) -> np.ndarray:
        return self._src[self._src_off[i]:self._src_off[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt[self._tgt_off[i]:self._tgt_off[i + 1]]


def file_checksum(path: Path) -> dict[str, Any]:
    """{"size": bytes, "sha256": hex digest} of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def verify_file(path: Path, expected: dict[str, Any]) -> None:
    """UserError unless ``path`` has the size and content recorded when it was written."""
    size = path.stat().st_size
    if size != expected["size"]:
        raise UserError(f"{path}: {size:,} bytes where {expected['size']:,} were written (truncated or replaced); "
                        "rebuild it with `rpr-mt prepare --force`")
    if file_checksum(path)["sha256"] != expected["sha256"]:
        raise UserError(f"{path}: content differs from the checksum recorded when it was written (corrupt); "
                        "rebuild it with `rpr-mt prepare --force`")


def load_split(
    data_dir: str | Path, split: str, *, mmap: bool = True, checksums: Optional[dict[str, dict[str, Any]]] = None
) -> ParallelIds:
    """Open the id arrays of ``split`` ("train", "dev", "test") in a prepared data directory.

    ``checksums`` (file name -> ``file_checksum``, from the manifest; None for data prepared before they were
    recorded) are verified first, so a corrupt or truncated array is a clear error instead of a crash or wrong
    batches. The offsets are checked against the ids either way."""
    data_dir = Path(data_dir)
    mode: Optional[str] = "r" if mmap else None
    arrays = []
    for side in SIDES:
        for path in (ids_file(data_dir, split, side), offsets_file(data_dir, split, side)):
            if not path.is_file():
                have = sorted({p.name.split(".")[0] for p in data_dir.glob("*.src.ids.npy")})
                raise UserError(f"no prepared '{split}' split in {data_dir} (missing {path.name}; prepared splits: "
                                f"{', '.join(have) or 'none'}); run `rpr-mt prepare`")
            if checksums is not None and path.name in checksums:
                verify_file(path, checksums[path.name])
            try:
                arrays.append(np.load(path, mmap_mode=mode))
            except (OSError, ValueError) as exc:
                raise UserError(f"{path}: not a readable id array ({exc}); rebuild it with `rpr-mt prepare --force`")
    for side, (ids, offsets) in zip(SIDES, (arrays[0:2], arrays[2:4])):
        if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids) or bool((np.diff(offsets) < 0).any()):
            raise UserError(f"{offsets_file(data_dir, split, side)}: offsets do not match "
                            f"{ids_file(data_dir, split, side).name}; rebuild with `rpr-mt prepare --force`")
    return ParallelIds(*arrays)
