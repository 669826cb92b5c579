"""ExportedTranslator's rescoring of hypotheses CTranslate2 cut at the length limit, against a scripted translator:
the renormalisation of their first min_length steps, per source, without CTranslate2 itself."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rpr_mt.config import DecodeConfig
from rpr_mt.decode.ctranslate2 import ExportedTranslator, _log_not

PIECES = ["<pad>", "<unk>", "<s>", "</s>", "a", "b"]
# p(eos) after 0, 1, 2, 3 output tokens, per source (its first piece)
P_EOS = {"a": [0.5, 0.25, 0.1, 0.2], "b": [0.9, 0.01, 0.3, 0.4]}
TOKEN_LOGPROB = -1.0


class ScriptedTranslator:
    """translate_batch: one hypothesis per source that runs one token past the limit (as CTranslate2 returns a
    hypothesis it could not end); score_batch: TOKEN_LOGPROB per target token, then log p(eos) from P_EOS."""

    def translate_batch(self, pieces, *, max_decoding_length, min_decoding_length, **options):
        self.min_decoding_length = min_decoding_length
        return [SimpleNamespace(hypotheses=[["a"] * max_decoding_length], scores=[-1.0]) for _ in pieces]

    def score_batch(self, sources, targets, **options):
        return [SimpleNamespace(log_probs=[TOKEN_LOGPROB] * len(t) + [math.log(P_EOS[s[0]][len(t)])])
                for s, t in zip(sources, targets)]


def translator(min_length: int) -> ExportedTranslator:
    exported = object.__new__(ExportedTranslator)  # no model directory: only the search's bookkeeping runs
    exported.max_positions = 64
    exported.decode = DecodeConfig(beam_size=1, nbest=1, length_penalty=0.6, max_len_a=0.0, max_len_b=3,
                                   min_length=min_length)
    exported.vocab = SimpleNamespace(piece=lambda i: PIECES[i])
    exported._ids = {p: i for i, p in enumerate(PIECES)}
    exported.translator = ScriptedTranslator()
    return exported


@pytest.mark.parametrize("min_length", [0, 1, 2, 5])
def test_cut_hypotheses_are_scored_as_the_search_had_them(min_length: int) -> None:
    exported = translator(min_length)
    results = exported.search([[4], [5]])  # sources "a" and "b"; limit floor(0 * 2 + 3) = 3 tokens
    assert exported.translator.min_decoding_length == min(min_length, 3)
    for (source, probs), [hyp] in zip(P_EOS.items(), results):
        steps = min(min_length, 3)  # the limit wins over min_length
        expected = 3 * TOKEN_LOGPROB + math.log(probs[3]) - sum(math.log(1 - probs[t]) for t in range(steps))
        assert hyp.tokens == [4, 4, 4]
        assert hyp.logprob == pytest.approx(expected, abs=1e-9), source


def test_log_not_is_exact_at_both_ends() -> None:
    assert _log_not(math.log(0.25)) == pytest.approx(math.log(0.75))
    assert _log_not(math.log(1e-12)) == pytest.approx(-1e-12, rel=1e-6)
    assert math.isfinite(_log_not(0.0))  # p(eos) = 1 within float32: no math domain error
