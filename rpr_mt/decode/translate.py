"""Lines of text in, translations out: encode, sort by length, batch by tokens, search, restore the order.

Output format
-------------
* ``decode.nbest == 1``: exactly one output line per input line, in input order.
* ``decode.nbest == N > 1``: N lines per input line, best first, each ``index<TAB>score<TAB>text`` where ``index``
  is the 0-based number of the input line (as in Moses n-best lists) and ``score`` is the length-normalised
  log-probability (``Hypothesis.score``, 4 decimals). Fewer than N only if the vocabulary cannot fill the beam.
* Empty (or all-whitespace) input lines give empty translations without running the model; with nbest > 1 they
  give N lines ``index<TAB>0.0000<TAB>`` so every input has the same number of lines.
"""

from __future__ import annotations

import gzip
import logging
import sys
import zlib
from pathlib import Path
from typing import Any, Iterable, Union

import torch
from tqdm import tqdm

from rpr_mt.config import DecodeConfig
from rpr_mt.decode.search import Hypothesis, beam_search, greedy_search
from rpr_mt.errors import UserError
from rpr_mt.host import keep_freed_memory

logger = logging.getLogger(__name__)


def read_lines(path: Union[str, Path]) -> list[str]:
    """Lines of a UTF-8 text file (``.gz`` allowed; ``-`` = stdin), without their line terminators.

    Invalid UTF-8 is a ``UserError`` naming the file (``-`` for stdin) and the 1-based line number.
    Lines are split on ``\\n`` only (a trailing ``\\r`` is dropped), so line numbers agree with ``wc -l``.
    """
    name = str(path)
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
        elif name.endswith(".gz"):
            with gzip.open(name, "rb") as f:
                data = f.read()
        else:
            data = Path(name).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{name}: file not found") from None
    except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a truncated or corrupt .gz
        raise UserError(f"{name}: cannot read ({exc})") from None

    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the file's final newline does not start another line
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{name}: line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
        if number == 1:
            line = line.removeprefix("\ufeff")  # byte-order mark
        lines.append(line.removesuffix("\r"))
    return lines


def translate_lines(
    model: Any,
    vocab: Any,
    lines: Iterable[str],
    *,
    decode: DecodeConfig,
    device: Union[str, torch.device],
    progress: bool = False,
    full_prefix: bool = False,
) -> list[str]:
    """Translate ``lines``; returns the output lines (see the module docstring for the format).

    ``vocab``: ``.encode(text) -> list[int]`` (pieces, no eos), ``.decode(ids) -> str``. Sources longer than
    ``model.max_positions - 1`` pieces are truncated (one warning with the count). Batches hold at most
    ``decode.max_tokens`` padded source tokens (at least one sentence). Greedy search when ``beam_size == 1``.
    The model is put in eval mode for the call and its previous mode restored. ``full_prefix=True`` recomputes
    every prefix without the decoder cache (same output, slower: for benchmarks and tests).
    """
    lines = list(lines)
    if torch.device(device).type == "cpu":
        keep_freed_memory()  # decoding reallocates the same beams every step; see rpr_mt.host
    if decode.nbest > decode.beam_size:
        raise UserError(f"decode.nbest ({decode.nbest}) must be <= decode.beam_size ({decode.beam_size})")
    limit = model.max_positions - 1  # room for the source's eos
    sources: dict[int, list[int]] = {}  # input index -> source ids (eos appended); empty lines left out
    truncated = 0
    for index, line in enumerate(lines):
        ids = vocab.encode(line.strip()) if line.strip() else []
        if not ids:
            continue
        if len(ids) > limit:
            ids = ids[:limit]
            truncated += 1
        sources[index] = ids + [model.eos_id]
    if truncated:
        logger.warning(
            "%d of %d input lines were longer than %d pieces (the model's max_positions - 1) and were truncated",
            truncated, len(lines), limit,
        )

    hypotheses: dict[int, list[Hypothesis]] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(
            total=len(lines), disable=not progress, file=sys.stderr, unit="sent", desc="translate"
        ) as bar:
            bar.update(len(lines) - len(sources))  # empty lines are done already
            for batch in _batches(sources, decode.max_tokens):
                src = _pad([sources[i] for i in batch], model.pad_id, device)  # [B, S]
                for index, hyps in zip(batch, _search(model, src, decode, full_prefix)):
                    hypotheses[index] = hyps
                bar.update(len(batch))
    finally:
        model.train(was_training)

    outputs: list[str] = []
    for index in range(len(lines)):
        hyps = hypotheses.get(index)
        if decode.nbest == 1:
            outputs.append(vocab.decode(hyps[0].tokens) if hyps else "")
        elif hyps is None:
            outputs.extend(f"{index}\t{0.0:.4f}\t" for _ in range(decode.nbest))
        else:
            outputs.extend(f"{index}\t{h.score:.4f}\t{vocab.decode(h.tokens)}" for h in hyps)
    return outputs


def _search(model: Any, src: torch.Tensor, decode: DecodeConfig, full_prefix: bool) -> list[list[Hypothesis]]:
    if decode.beam_size == 1:
        hyps = greedy_search(model, src, max_len_a=decode.max_len_a, max_len_b=decode.max_len_b,
                             min_len=decode.min_length, length_penalty=decode.length_penalty, full_prefix=full_prefix)
        return [[h] for h in hyps]
    return beam_search(model, src, beam_size=decode.beam_size, length_penalty=decode.length_penalty,
                       max_len_a=decode.max_len_a, max_len_b=decode.max_len_b, nbest=decode.nbest,
                       min_len=decode.min_length, full_prefix=full_prefix)


def _batches(sources: dict[int, list[int]], max_tokens: int) -> list[list[int]]:
    """Input indices grouped longest first, each group's padded size ``len(group) * longest <= max_tokens``.

    Sorting by length keeps padding (and wasted decoder steps) small; longest first means a batch that does not
    fit in memory fails at once rather than at the end.
    """
    order = sorted(sources, key=lambda i: -len(sources[i]))  # stable: equal lengths keep input order
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        length = len(sources[index])
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def _pad(rows: list[list[int]], pad_id: int, device: Union[str, torch.device, None]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, S]
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)
