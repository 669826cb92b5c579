"""Lines of text in, translations out: encode, sort by length, batch by tokens, search, restore the order.

Output format
-------------
* ``decode.nbest == 1``: exactly one output line per input line, in input order.
* ``decode.nbest == N > 1``: N lines per input line, best first, each ``index<TAB>score<TAB>text`` where ``index``
  is the 0-based number of the input line (as in Moses n-best lists) and ``score`` is the length-normalised
  log-probability (``Hypothesis.score``, 4 decimals). Fewer than N only if the vocabulary cannot fill the beam.
* Empty (or all-whitespace) input lines give empty translations without running the model; with nbest > 1 they
  give N lines ``index<TAB>0.0000<TAB>`` so every input has the same number of lines.

Sentence splitting (``decode.split_sentences``, on by default): each line is split into sentences
(``rpr_mt.text.segment``), all sentences of all lines are batched together as lines are without it, and each line's
translations are joined into its one output line. A one-sentence line is translated exactly as without splitting.
With nbest N > 1, a line of several sentences gets the N best joins of one hypothesis per sentence (each sentence's
n-best list), scored as one hypothesis would be (the sentences' log-probabilities summed, GNMT-normalised by their
total length with each eos), best first (``best_joins``: exact, not the k-th bests joined).
"""

from __future__ import annotations

import collections
import heapq
import logging
import sys
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch
from tqdm import tqdm

from rpr_mt.config import DecodeConfig, check_decode
from rpr_mt.decode.arriving import take_window
from rpr_mt.decode.search import Hypothesis, beam_search, gnmt_length_penalty, greedy_search
from rpr_mt.host import keep_freed_memory
from rpr_mt.text.segment import join_sentences, split_sentences

logger = logging.getLogger(__name__)

# The short-output warning's threshold. 1% of the dev outputs fall below the model's ratio by definition, but that
# ratio is the 1st percentile of only 300 greedy validation decodes, and beam search with a length penalty makes a few
# more outputs short: of seven trained Multi30k models (En->De and En->Fr) decoding their own dev and test sets with
# beam 5, five had more than 2% of a set's lines below it (0.4-3.3%), which a 2% threshold reported as sentences left
# out. Outputs that do leave sentences out are most of their lines (the position study's four-sentence lines).
SHORT_RATE = 0.05


def translate_lines(
    model: Any,
    vocab: Any,
    lines: Iterable[str],
    *,
    decode: DecodeConfig,
    device: Union[str, torch.device],
    progress: bool = False,
    full_prefix: bool = False,
    src_lang: Optional[str] = None,
    tgt_lang: Optional[str] = None,
    min_length_ratio: Optional[float] = None,
) -> list[str]:
    """Translate ``lines``; returns the output lines (see the module docstring for the format).

    ``vocab``: ``.encode(text) -> list[int]`` (pieces, no eos), ``.decode(ids) -> str``. Sources longer than
    ``model.max_positions - 1`` pieces are truncated (one warning with the count). Batches hold at most
    ``decode.max_tokens`` padded source tokens (at least one sentence). Greedy search when ``beam_size == 1``.
    The model is put in eval mode for the call and its previous mode restored. ``full_prefix=True`` recomputes
    every prefix without the decoder cache (same output, slower: for benchmarks and tests).

    ``src_lang``/``tgt_lang`` (ISO 639-1): the rules for splitting sentences and for joining their translations
    (``None``: the segmenter's default rules). ``min_length_ratio``: one warning with the count of output lines
    shorter than that many pieces per source piece when there are more than ``SHORT_RATE`` of them (the checkpoint's
    dev statistic: ``rpr_mt.checkpoint_files.LoadedModel.length_ratio_floor``; None: no such warning).
    """
    return list(iter_translations(model, vocab, lines, decode=decode, device=device, progress=progress,
                                  full_prefix=full_prefix, src_lang=src_lang, tgt_lang=tgt_lang,
                                  min_length_ratio=min_length_ratio))


def iter_translations(
    model: Any,
    vocab: Any,
    lines: Iterable[str],
    *,
    decode: DecodeConfig,
    device: Union[str, torch.device],
    progress: bool = False,
    full_prefix: bool = False,
    src_lang: Optional[str] = None,
    tgt_lang: Optional[str] = None,
    min_length_ratio: Optional[float] = None,
    total: Optional[int] = None,
) -> Iterator[str]:
    """``translate_lines`` as a generator: the output lines in input order, window by window.

    ``lines`` is read ``decode.buffer_lines`` lines at a time, and each window is sorted by length, batched and
    decoded on its own, its translations given before the next window is taken (as fairseq-interactive's
    --buffer-size): a pipe is translated as it arrives, a long input is never held whole, a long job writes its
    translations as it goes and an interrupted one keeps what it finished. Input read on a thread
    (``rpr_mt.decode.arriving.ArrivingLines``: a terminal, a pipe) ends a window early when it pauses, so a line
    typed or written on its own is translated at once. The warnings cover the whole input and
    come after the last window. The progress bar counts lines, of ``total`` (default: ``len(lines)`` where ``lines``
    has a length; else none, as for a pipe)."""
    if torch.device(device).type == "cpu":
        keep_freed_memory()  # decoding reallocates the same beams every step; see rpr_mt.host
    check_decode(decode)
    if total is None and hasattr(lines, "__len__"):
        total = len(lines)  # type: ignore[arg-type]
    limit = model.max_positions - 1  # room for the source's eos
    units = truncated = n_sources = capped = translated = 0  # counts over all windows, for the warnings
    short: list[int] = []
    pending = iter(lines)
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=total, disable=not progress, file=sys.stderr, unit="line", desc="translate") as bar:
            first_line = 0
            while window := take_window(pending, decode.buffer_lines):  # early, when arriving input pauses
                texts, owners = sentence_units(window, decode.split_sentences, src_lang)
                sources: dict[int, list[int]] = {}  # unit index -> source ids (eos appended); empty units left out
                for index, text in enumerate(texts):
                    ids = vocab.encode(text)
                    if not ids:
                        continue
                    if len(ids) > limit:
                        ids = ids[:limit]
                        truncated += 1
                    sources[index] = ids + [model.eos_id]
                units += len(texts)
                n_sources += len(sources)
                if decode.min_length > 0:  # the output limit wins over the minimum: counted to say where
                    capped += sum(1 for ids in sources.values()
                                  if min(int(decode.max_len_a * len(ids) + decode.max_len_b), model.max_positions - 1)
                                  < decode.min_length)
                # a line is done when its last sentence is; lines with nothing to translate are done already
                left = collections.Counter(owners[i] for i in sources)
                bar.update(len(window) - len(left))
                hypotheses: dict[int, list[Hypothesis]] = {}
                with torch.inference_mode():
                    for batch in _batches(sources, decode.max_tokens):
                        src = _pad([sources[i] for i in batch], model.pad_id, device)  # [B, S]
                        for index, hyps in zip(batch, _search(model, src, decode, full_prefix)):
                            hypotheses[index] = hyps
                            left[owners[index]] -= 1
                            bar.update(left[owners[index]] == 0)
                outputs = format_outputs(len(window), owners, hypotheses, vocab.decode, decode, tgt_lang, first_line)
                if min_length_ratio and decode.nbest == 1:
                    short += [first_line + i for i in short_outputs(window, outputs, vocab.encode, min_length_ratio)]
                translated += sum(1 for line in window if line.strip())  # empty lines give empty outputs
                first_line += len(window)
                yield from outputs
    finally:
        model.train(was_training)
    what = "sentences" if decode.split_sentences else "lines"
    if truncated:
        logger.warning("%d of %d input %s were longer than %d pieces (the model's max_positions - 1) and were "
                       "truncated", truncated, units, what, limit)
    if capped:
        logger.warning("min_length %d is above the output limit (max_len_a * source pieces + max_len_b, at most "
                       "max_positions - 1) of %d of %d input %s: those stop at the limit",
                       decode.min_length, capped, n_sources, what)
    if len(short) > SHORT_RATE * translated:
        warn_short_outputs(short, translated, min_length_ratio, decode.split_sentences)


def sentence_units(lines: list[str], split: bool, src_lang: Optional[str]) -> tuple[list[str], list[int]]:
    """What is translated: each line's sentences (``split``) or the stripped line, and the line each belongs to.
    A blank line has none."""
    texts: list[str] = []
    owners: list[int] = []
    for index, line in enumerate(lines):
        if split:
            parts = split_sentences(line, src_lang)
        else:
            parts = [line.strip()] if line.strip() else []
        texts += parts
        owners += [index] * len(parts)
    return texts, owners


def format_outputs(
    n_lines: int, owners: list[int], hypotheses: dict[int, list[Hypothesis]], decode_ids: Callable[[list[int]], str],
    decode: DecodeConfig, tgt_lang: Optional[str], first_line: int = 0,
) -> list[str]:
    """The output lines (module docstring) from each unit's hypotheses; ``owners[u]``: the input line of unit u,
    counted from ``first_line``, the number n-best entries give the first of these lines."""
    per_line: list[list[list[Hypothesis]]] = [[] for _ in range(n_lines)]
    for unit, line in enumerate(owners):
        if hypotheses.get(unit):
            per_line[line].append(hypotheses[unit])
    outputs: list[str] = []
    for index, units in enumerate(per_line, start=first_line):
        if decode.nbest == 1:
            outputs.append(join_sentences([decode_ids(hyps[0].tokens) for hyps in units], tgt_lang))
        elif not units:
            outputs.extend(f"{index}\t{0.0:.4f}\t" for _ in range(decode.nbest))
        elif len(units) == 1:
            outputs.extend(f"{index}\t{h.score:.4f}\t{decode_ids(h.tokens)}" for h in units[0])
        else:
            outputs.extend(f"{index}\t{score:.4f}\t{join_sentences([decode_ids(h.tokens) for h in chosen], tgt_lang)}"
                           for score, chosen in best_joins(units, decode.nbest, decode.length_penalty))
    return outputs


def best_joins(units: list[list[Hypothesis]], n: int, alpha: float) -> list[tuple[float, list[Hypothesis]]]:
    """The ``n`` best ways to take one hypothesis of each sentence's list (``units``, in order), best first, each
    with its score as one hypothesis of the whole line: the log-probabilities summed over the GNMT length penalty of
    the total length, each sentence's eos counted (as ``Hypothesis.score``).

    That score does not add up over sentences, so the joins of the k-th bests (what this did before) can miss
    better ones; trying every join is exponential in the sentences. For a given total length, though, the score
    grows with the log-probability sum, so the ``n`` best joins of that length extend only the ``n`` best prefixes
    of their own lengths (any other prefix has ``n`` better ones to take its place). Kept per total length, with a
    back-pointer each, that makes the search exact in ``sentences x lengths x beam x n`` steps."""
    # per sentence: total length -> up to n (logprob sum, (length, rank) of the prefix extended, hypothesis index)
    stages: list[dict[int, list[tuple[float, tuple[int, int], int]]]] = []
    frontier: dict[int, list[float]] = {0: [0.0]}  # total length -> the kept prefixes' logprob sums, best first
    for hyps in units:
        grown: dict[int, list[tuple[float, tuple[int, int], int]]] = collections.defaultdict(list)
        for length, sums in frontier.items():
            for rank, logprob in enumerate(sums):
                for i, hyp in enumerate(hyps):
                    grown[length + len(hyp.tokens) + 1].append((logprob + hyp.logprob, (length, rank), i))
        kept = {length: heapq.nlargest(n, options, key=lambda o: o[0]) for length, options in grown.items()}
        stages.append(kept)
        frontier = {length: [o[0] for o in options] for length, options in kept.items()}
    ends = [(logprob / gnmt_length_penalty(length, alpha), length, rank)
            for length, sums in frontier.items() for rank, logprob in enumerate(sums)]
    joins = []
    for score, length, rank in heapq.nlargest(n, ends, key=lambda e: e[0]):
        chosen: list[Hypothesis] = []
        for hyps, kept in zip(reversed(units), reversed(stages)):  # follow the back-pointers to the first sentence
            _, (length, rank), i = kept[length][rank]
            chosen.append(hyps[i])
        joins.append((score, chosen[::-1]))
    return joins


def short_outputs(
    lines: list[str], outputs: list[str], encode: Callable[[str], list[int]], min_ratio: float
) -> list[int]:
    """0-based numbers of the non-empty input lines whose output has fewer than ``min_ratio`` pieces per source
    piece: a translation far shorter than the model's dev set makes normal, e.g. sentences left out."""
    short = []
    for index, (line, output) in enumerate(zip(lines, outputs)):
        n_src = len(encode(line.strip())) if line.strip() else 0
        if n_src and len(encode(output.strip()) if output.strip() else []) < min_ratio * n_src:
            short.append(index)
    return short


def warn_short_outputs(short: list[int], n_lines: int, min_ratio: float, split_sentences: bool = True) -> None:
    """The one warning for ``short_outputs`` (``short``: 0-based line numbers, of ``n_lines`` translated).
    ``split_sentences`` off, a line of several sentences was translated whole, which is the usual way to lose them."""
    one = len(short) == 1
    shown = ", ".join(str(i + 1) for i in short[:5]) + (", ..." if len(short) > 5 else "")
    hint = ("" if split_sentences else "; decode.split_sentences is off (--no-split), and translating sentence by "
            "sentence keeps them")
    logger.warning(
        "%d of %d %s %s short for %s source (under %.2f output pieces per source piece, which 99%% of the model's dev "
        "translations reach; %s %s): sentences may have been left out%s", len(short), n_lines,
        "translation" if n_lines == 1 else "translations", "is" if one else "are", "its" if one else "their",
        min_ratio, "line" if one else "lines", shown, hint,
    )


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
