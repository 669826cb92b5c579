"""Translate with an exported CTranslate2 model (``rpr-mt export``) using rpr-mt's search settings.

``ctranslate2.Translator.translate_batch`` is called so that its beam search is rpr-mt's (``rpr_mt.decode.search``):

* beam: the ``2k`` best extensions are ranked, eos among the top ``k`` finishes, the ``k`` best others stay open, and
  a sentence stops when ``k`` hypotheses have finished. CTranslate2 does exactly this when its length penalty is not
  0; at 0 it instead waits for the best beam to finish ("early exit"), so alpha = 0 runs with a negligible penalty.
* length penalty: CTranslate2 divides the log-probability by ``|Y|^alpha``, rpr-mt by GNMT's
  ``((5 + |Y|) / 6)^alpha`` (``|Y|`` counts eos in both). All ``k`` hypotheses come back with their scores;
  CTranslate2's normalisation is undone and they are ranked by rpr-mt's, which also gives the scores rpr-mt reports.
* length limit ``floor(a * |x| + b)`` tokens before eos (``|x|`` counting the source's eos), capped at
  ``max_positions - 1``: one ``max_decoding_length`` (limit + 1, eos included) per call, so sentences are grouped by
  their limit. Sources are cut to ``max_positions - 1`` pieces; the exported config appends eos.
* ``min_decoding_length`` = ``decode.min_length`` (capped by the limit): both remove eos's logit before the softmax
  while the output is shorter; no repetition penalty, no n-gram blocking, unk allowed.
* at the length limit rpr-mt forces eos on every open hypothesis (keeping eos's log-probability); CTranslate2 cannot,
  and instead returns the best extensions of the open hypotheses by one more token, without eos. Their first
  ``limit`` tokens are scored with eos (``score_batch``), which is rpr-mt's result for greedy search; the first
  ``min_length`` tokens' log-probabilities are renormalised without eos, as the search had them, with p(eos) from
  scoring each prefix.

Differences that remain (none shows on outputs that end with eos before the limit, as a trained model's do):

* at the length limit with a beam, an open hypothesis none of whose extensions is among CTranslate2's ``k`` best
  is not seen, so rpr-mt's forced ending of it cannot be ranked.
* rpr-mt never emits pad or bos (but keeps them in the softmax); CTranslate2 can emit them. Suppressing them there
  would drop them from its softmax and shift every score, so they are left alone.
* when more than ``k`` hypotheses have finished at the step a sentence stops, CTranslate2 keeps the ``k`` best by its
  own normalisation before they are re-ranked.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from rpr_mt.config import DecodeConfig, check_decode, config_from_dict
from rpr_mt.decode.search import Hypothesis, gnmt_length_penalty
from rpr_mt.errors import UserError
from rpr_mt.layouts import EXPORT_INFO_FILE, read_export_info
from rpr_mt.text.casing import Casing, CasingError, load as load_casing

__all__ = ["ExportedTranslator"]

# CTranslate2's length penalty when rpr-mt's is 0: positive, so that its beam stops as rpr-mt's does, and small
# enough to order finished hypotheses as their log-probabilities do (it is undone before re-ranking anyway).
_NEGLIGIBLE_PENALTY = 1e-7


def _log_not(logprob: float) -> float:
    """log(1 - p) from log p, exact for p near 0 and near 1. A float32 log-probability rounds to 0 within ~6e-8 of
    p = 1, where 1 - p is taken to be that resolution rather than 0 (only a model that is all but certain to end
    there meets it)."""
    return math.log(-math.expm1(min(logprob, -6e-8)))


class ExportedTranslator:
    """A CTranslate2 model directory written by ``rpr-mt export``, its SentencePiece model and decode settings.

    Args:
        model_dir: the exported directory.
        device: ``cpu`` or ``cuda``.
        compute_type: CTranslate2's compute type (``default`` = the type the weights were saved in; ``float32``,
            ``int8``, ...).
        threads: intra-op threads (``intra_threads``); one translation at a time (``inter_threads=1``).
    """

    def __init__(
        self, model_dir: Union[str, Path], *, device: str = "cpu", compute_type: str = "default", threads: int = 1
    ) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise UserError("translating with CTranslate2 needs the ctranslate2 package: "
                            "pip install 'ctranslate2>=4.7'") from None
        from rpr_mt.data.vocab import Vocab

        self.model_dir = Path(model_dir)
        self.info: dict[str, Any] = read_export_info(self.model_dir)
        info_path = self.model_dir / EXPORT_INFO_FILE
        self.max_positions: int = int(self.info["max_positions"])
        self.decode: DecodeConfig = config_from_dict({"decode": self.info["decode"]}, origin=str(info_path)).decode
        self.vocab = Vocab.load(self.model_dir / self.info["sentencepiece_model"])
        casing_file = self.info.get("casing_model")  # exports of lowercased text that has a casing model
        try:
            self.casing: Optional[Casing] = load_casing(self.model_dir / casing_file) if casing_file else None
        except CasingError as exc:
            raise UserError(str(exc)) from None
        self._ids = {self.vocab.piece(i): i for i in range(self.vocab.size)}
        self.translator = ctranslate2.Translator(
            str(self.model_dir), device=device, compute_type=compute_type, inter_threads=1, intra_threads=threads
        )

    # -- search -----------------------------------------------------------------------------------------------------

    def piece_ids(self, pieces: Sequence[str]) -> list[int]:
        """The vocabulary ids of CTranslate2's output pieces."""
        return [self._ids[p] for p in pieces]

    def limit(self, source_ids: Sequence[int], decode: DecodeConfig) -> int:
        """rpr-mt's limit on output tokens before eos for a source of these pieces (eos not included)."""
        length = min(len(source_ids), self.max_positions - 1) + 1  # with the eos the model config appends
        return max(0, min(int(decode.max_len_a * length + decode.max_len_b), self.max_positions - 1))

    def search(self, sources: Sequence[Sequence[int]], decode: Optional[DecodeConfig] = None) -> list[list[Hypothesis]]:
        """For each source (piece ids, no eos), its ``decode.nbest`` best hypotheses, best first, scored like
        ``rpr_mt.decode.search`` (GNMT-normalised log-probability, eos included)."""
        decode = check_decode(decode or self.decode)  # the same rules as translate's (rpr_mt.config.check_decode)
        groups: dict[int, list[int]] = defaultdict(list)  # length limit -> indices of sources
        for index, ids in enumerate(sources):
            groups[self.limit(ids, decode)].append(index)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for limit, indices in groups.items():
            pieces = [[self.vocab.piece(i) for i in sources[j][: self.max_positions - 1]] for j in indices]
            outputs = self.translator.translate_batch(
                pieces, max_decoding_length=limit + 1, min_decoding_length=min(decode.min_length, limit),
                max_batch_size=decode.max_tokens, batch_type="tokens", **self._options(decode),
            )
            # Hypotheses that ran to the limit come back cut without eos, one token longer than rpr-mt allows (see
            # the module docstring): their first `limit` tokens are scored with eos, rpr-mt's forced ending.
            cut = sorted({(k, tuple(h[:limit])) for k, out in enumerate(outputs) for h in out.hypotheses
                          if len(h) > limit})
            forced: dict[tuple[int, tuple[str, ...]], float] = {}
            if cut:
                scored = self._score(pieces, cut, decode)
                forced = {key: sum(result.log_probs) for key, result in zip(cut, scored)}
                # The search removed eos from its first min_length steps' softmax; score_batch did not. Each of those
                # tokens' log-probability becomes log p - log(1 - p(eos)), p(eos) read from scoring the prefix.
                steps = min(decode.min_length, limit)
                prefixes = sorted({(k, prefix[:t]) for k, prefix in cut for t in range(steps)})
                if prefixes:
                    eos = {key: result.log_probs[-1] for key, result in zip(prefixes, self._score(pieces, prefixes,
                                                                                                   decode))}
                    for k, prefix in cut:
                        forced[(k, prefix)] -= sum(_log_not(eos[(k, prefix[:t])]) for t in range(steps))
            for k, (index, output) in enumerate(zip(indices, outputs)):
                results[index] = self._rank(output, limit, decode, {p: lp for (j, p), lp in forced.items() if j == k})
        return results

    def _score(self, pieces: list[list[str]], targets: list[tuple[int, tuple[str, ...]]], decode: DecodeConfig) -> Any:
        """CTranslate2's per-token log-probabilities (eos last) of each (source index, target pieces)."""
        return self.translator.score_batch([pieces[k] for k, _ in targets], [list(p) for _, p in targets],
                                           max_batch_size=decode.max_tokens, batch_type="tokens", max_input_length=0)

    def _options(self, decode: DecodeConfig) -> dict[str, Any]:
        beam = decode.beam_size
        penalty = 0.0 if beam == 1 else (decode.length_penalty or _NEGLIGIBLE_PENALTY)
        return dict(
            beam_size=beam, num_hypotheses=beam, length_penalty=penalty, patience=1.0, coverage_penalty=0.0,
            repetition_penalty=1.0, no_repeat_ngram_size=0, disable_unk=False, max_input_length=0,
            return_scores=True, sampling_topk=1,
        )

    def _rank(
        self, output: Any, limit: int, decode: DecodeConfig, forced: dict[tuple[str, ...], float]
    ) -> list[Hypothesis]:
        """rpr-mt's ranking of CTranslate2's hypotheses for one source; ``forced``: the log-probability with eos of
        the first ``limit`` pieces of each hypothesis cut at the limit."""
        penalty = self._options(decode)["length_penalty"]
        found: dict[tuple[str, ...], float] = {}  # pieces -> log-probability with eos
        for pieces, score in zip(output.hypotheses, output.scores):
            if len(pieces) <= limit:  # ended with eos: undo CTranslate2's normalisation (|Y| counts eos)
                found[tuple(pieces)] = score * (len(pieces) + 1) ** penalty
        for prefix, logprob in forced.items():  # several cut hypotheses may extend one beam, which may also end
            found.setdefault(prefix, logprob)
        hypotheses = [
            Hypothesis(self.piece_ids(pieces), lp / gnmt_length_penalty(len(pieces) + 1, decode.length_penalty), lp)
            for pieces, lp in found.items()
        ]
        return sorted(hypotheses, key=lambda h: -h.score)[: decode.nbest]  # stable, as rpr-mt's

    # -- text -------------------------------------------------------------------------------------------------------

    def translate_lines(
        self, lines: Sequence[str], decode: Optional[DecodeConfig] = None, tokenize: bool = True,
        detokenize: bool = True, recase: bool = True,
    ) -> list[str]:
        """``rpr-mt translate``'s output for ``lines`` (the format of ``rpr_mt.decode.translate``, sentence splitting
        included): one line per input, or with nbest N > 1, N lines ``index<TAB>score<TAB>text`` each; empty inputs
        stay empty. All sentences of all lines are searched as one job. A model trained on Multi30k's tokenized text
        gets the lines that look raw tokenized as that text is, and their translations detokenized back, as
        translate does (``tokenize=False``: as ``--no-tokenize``, the lines as they are; ``detokenize=False``: as
        ``--no-detokenize``, the translations in the model's tokenized form); those detokenized translations are
        recased with the export's casing model where it has one, as translate does (``recase=False``: as
        ``--no-recase``)."""
        from rpr_mt.decode.pretokenize import detokenize_outputs
        from rpr_mt.decode.translate import format_outputs, sentence_units
        from rpr_mt.text.multi30k import plain_text_lines, tokenize_untokenized

        decode = decode or self.decode
        plain: list[int] = []  # the lines whose translations are detokenized (all lines are one window here)
        if tokenize and self.info.get("pretokenized"):  # exports from before it was recorded: lines as they are
            given = list(lines)
            lines, tokenized = tokenize_untokenized(given, self.info["src_lang"])
            plain, _ = plain_text_lines(given, tokenized)
        # exports from before the languages were recorded split with the segmenter's default rules
        texts, owners = sentence_units(list(lines), decode.split_sentences, self.info.get("src_lang"))
        units = [u for u, text in enumerate(texts) if self.vocab.encode(text)]
        found = dict(zip(units, self.search([self.vocab.encode(texts[u]) for u in units], decode)))
        tgt_lang = self.info.get("tgt_lang")
        outputs = format_outputs(len(lines), owners, found, self.vocab.decode, decode, tgt_lang)
        if detokenize and plain:
            casing = self.casing if recase else None
            outputs = list(detokenize_outputs(outputs, set(plain), decode.nbest, tgt_lang, casing))
        return outputs
