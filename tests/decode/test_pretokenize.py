"""Translate's output lines for a model trained on Multi30k's tokenized text: the translations of the lines tokenized
for it detokenized back (the text rules themselves: tests/text/test_multi30k.py)."""

from __future__ import annotations

from rpr_mt.decode.pretokenize import detokenize_outputs


def test_outputs_of_tokenized_lines_only_are_detokenized_with_nbest_numbering():
    outputs = ["l&apos; homme .", "l&apos; homme ."]
    assert list(detokenize_outputs(outputs, {1}, 1, "fr")) == ["l&apos; homme .", "l'homme."]
    entries = ["0\t-0.1000\tl&apos; homme .", "0\t-0.2000\tun homme .", "1\t-0.3000\tl&apos; eau ."]
    assert list(detokenize_outputs(entries, {0}, 2, "fr")) == [
        "0\t-0.1000\tl'homme.", "0\t-0.2000\tun homme.", "1\t-0.3000\tl&apos; eau ."]
