"""The casing model: learned from cased tokenized text, saved and loaded, applied to lowercased tokenized text."""

from __future__ import annotations

import os

import pytest

from rpr_mt.text import casing
from rpr_mt.text.casing import Casing, CasingError

TRAIN = [
    "Ein Mann mit einem Hut steht am Fluss .",
    "Zwei Hunde spielen im Park von Berlin .",
    "Ein Hund läuft über die Wiese .",
    "Der Mann trägt einen roten Hut .",
    # "Park" sentence-initially is not counted; "Der" at the start neither, "der" inside is
    "Park ist leer und der Hund schläft im park .",
]


def test_learns_the_most_frequent_form_away_from_sentence_starts():
    model = casing.learn(TRAIN, "de")
    assert model.words["mann"] == "Mann" and model.words["hut"] == "Hut" and model.words["berlin"] == "Berlin"
    assert model.words["park"] == "Park"  # twice as "Park" inside a sentence, once as "park"
    # only at a sentence start (Ein, Zwei, Der): their lowercase form is kept, so they are not in the model
    assert "ein" not in model.words and "zwei" not in model.words
    assert "der" not in model.words  # "der" inside a sentence, "Der" only at its start
    assert all(key == key.lower() and value != key for key, value in model.words.items())


def test_recase_cases_known_words_and_capitalises_each_sentence():
    model = casing.learn(TRAIN, "de")
    assert model.recase("ein mann mit einem hut steht im park von berlin .") == \
        "Ein Mann mit einem Hut steht im Park von Berlin ."
    # two sentences on a line, an unknown word kept, a sentence opening with a quote and a number
    assert model.recase("der hund schläft . &quot; zwei hunde &quot; ! 3 hunde spielen ?") == \
        "Der Hund schläft . &quot; Zwei Hunde &quot; ! 3 Hunde spielen ?"
    assert model.recase("") == ""
    assert model.recase("  ein   hund ") == "Ein Hund"  # the model's output: tokens apart, one space between


def test_a_token_with_a_capital_is_kept():
    assert Casing("de", {"park": "Park"}).recase("im PARK und iPhone") == "Im PARK und iPhone"


def test_capitalise_skips_escapes_and_leaves_letters_without_a_single_upper_case():
    assert casing.capitalise("l&apos;homme") == "L&apos;homme"
    assert casing.capitalise("&quot;ein") == "&quot;Ein"
    assert casing.capitalise("&apos;s") == "&apos;S"
    assert casing.capitalise("12,5") is None and casing.capitalise("&quot;") is None
    assert casing.capitalise("ßa") == "ßa" and casing.capitalise("élan") == "Élan"


def test_tokenize_cased_is_multi30k_tokenization_without_lowercasing():
    from rpr_mt.text.multi30k import lowercase_normalize_tokenize

    lines = ['Ein "Mann" mit 2 Hüten, l\'homme.', "Zwei Hunde (klein) spielen - im Park & am See.",
             "L'homme porte un « chapeau » rouge.", "A man 's hat [red] | blue."]
    for lang in ("de", "fr", "en"):
        tokenized = casing.tokenize_cased(lines, lang)
        assert [line.lower() for line in tokenized] == lowercase_normalize_tokenize(lines, lang)
    assert casing.tokenize_cased(['Ein "Mann" mit Hüten.'], "de") == ["Ein &quot; Mann &quot; mit Hüten ."]


def test_save_and_load_round_trip_and_are_deterministic(tmp_path):
    model = casing.learn(TRAIN, "de")
    path = tmp_path / casing.FILE_NAME
    casing.save(model, path)
    assert casing.load(path) == model
    first = path.read_bytes()
    casing.save(casing.learn(TRAIN, "de"), path)  # learned again: the same bytes
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == [casing.FILE_NAME]  # no temporary file left
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("text, message", [
    ("not json", "invalid JSON"),
    ('{"format": "something else", "lang": "de", "words": {}}', "format 'something else'"),
    ('{"format": "rpr-mt casing 1", "lang": "de", "words": {"Mann": "Mann"}}', "lowercase tokens"),
    ('{"format": "rpr-mt casing 1", "words": {}}', "'lang' string"),
])
def test_a_file_that_is_not_a_casing_model_is_one_error_naming_it(tmp_path, text, message):
    path = tmp_path / "casing.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CasingError, match=message) as info:
        casing.load(path)
    assert str(info.value).startswith(f"{path}: ")
    with pytest.raises(CasingError, match="cannot read"):
        casing.load(tmp_path / "missing.json")
