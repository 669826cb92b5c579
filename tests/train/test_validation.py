"""Validation's dev BLEU: sacreBLEU on raw text, the literature's BLEU on Multi30k's tokenized text."""

from __future__ import annotations

import logging

import pytest
import sacrebleu

from rpr_mt.config import Config, DataConfig
from rpr_mt.decode import translate
from rpr_mt.train.validation import dev_bleu

SOURCES = ["a man &apos;s dog runs .", "two kids play ."]
REFERENCES = ["der hund eines mannes läuft .", "zwei kinder spielen im park ."]
# no 4-gram in common: unsmoothed BLEU (the literature's multi-bleu.perl) is 0, sacreBLEU's smoothed BLEU is not
HYPOTHESES = ["der hund rennt schnell weg .", "kinder spielen zwei mal ."]


class WordVocab:
    def encode(self, text: str) -> list[int]:
        return [1] * len(text.split())


@pytest.mark.parametrize("text", ["raw", "tok"])
def test_dev_bleu_is_the_metric_of_the_text(tmp_path, monkeypatch, caplog, text):
    (tmp_path / "dev.en").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (tmp_path / "dev.de").write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    monkeypatch.setattr(translate, "translate_lines", lambda *args, **kwargs: list(HYPOTHESES))
    cfg = Config(data=DataConfig(source="multi30k", multi30k_dir=str(tmp_path), multi30k_text=text))
    with caplog.at_level(logging.WARNING):
        bleu, _, sentences = dev_bleu(None, WordVocab(), tmp_path, cfg, "cpu")
    assert sentences == 2  # the lines scored, not the cap (train.valid_max_sentences: 500 by default)
    if text == "tok":
        expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], tokenize="none", smooth_method="none", force=True)
        assert "tokenized" not in caplog.text  # sacreBLEU's "looks tokenized" warning at every validation
    else:
        expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert bleu == pytest.approx(expected.score)
    assert (bleu == 0.0) == (text == "tok")
