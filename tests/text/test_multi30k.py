"""Multi30k's tokenized text: raw lines made as the dataset's tok/ files are, tokenized lines left alone (tokenizing
them again would change them), a tok model's translations detokenized, and whole files told apart."""

from __future__ import annotations

import gzip

import pytest

from rpr_mt.text.multi30k import (detokenize_multi30k, looks_untokenized, lowercase_normalize_tokenize,
                                  plain_text_lines, reads_as_raw, reads_as_tokenized, tokenize_untokenized)


@pytest.mark.parametrize("line", [
    "A man in an orange hat starring at something.",  # a capital letter
    "a man rides a bike.",  # a full stop on a word
    "a sign that says \"stop\" .",  # a bare quote
    "the man's dog",  # a bare apostrophe
    "tom & jerry",  # a bare ampersand
])
def test_raw_lines_are_recognized(line):
    assert looks_untokenized(line)


@pytest.mark.parametrize("line", [
    "a man in an orange hat starring at something .",
    "a bus with the number &quot; 93 . &quot;",
    "a boy sits on a woman &apos;s shoulders .",
    "un groupe d&apos; hommes chargent du coton",  # tokenizing it again would give d &apos; hommes
    "4 people trying to fix a bike on a park",
    "",
])
def test_tokenized_lines_are_recognized(line):
    assert not looks_untokenized(line)


def test_only_the_raw_lines_change_and_empty_lines_stay():
    lines = ["Two dogs play.", "two dogs play .", "", "un groupe d&apos; hommes"]
    out, changed = tokenize_untokenized(lines, "en")
    assert out == ["two dogs play .", "two dogs play .", "", "un groupe d&apos; hommes"]
    assert changed == [0]


@pytest.mark.parametrize("lang, line, expected", [
    ("en", "A man is riding a bike down the street. Two dogs play in the snow!",
     "a man is riding a bike down the street . two dogs play in the snow !"),
    ("de", "Ein Hund rennt. Zwei Kinder spielen im Sand.", "ein hund rennt . zwei kinder spielen im sand ."),
    ("fr", "Un homme court. Il pleut.", "un homme court . il pleut ."),
])
def test_a_raw_line_of_sentences_is_tokenized_sentence_by_sentence(lang, line, expected):
    """Lowercased first, the line's inner full stop stayed on its word ("street. two": Moses separates it only
    before a capital), a token Multi30k's one-sentence lines never have: the model translating a paragraph dropped
    it from the first sentence's translation."""
    assert tokenize_untokenized([line], lang) == ([expected], [0])


@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_multi30k_raw_lines_become_the_tok_files_and_tok_lines_stay(multi30k_dir, split, lang):
    """The dataset's own tok/ files are the target: its raw val and test files must come back as them (one French
    val line differs: the dataset's Perl kept `sec.` of the last word attached), and its tok files unchanged."""
    read = lambda path: gzip.open(path, "rt", encoding="utf-8").read().splitlines()  # noqa: E731
    raw, tok = read(multi30k_dir / f"{split}.{lang}.gz"), read(multi30k_dir / "tok" / f"{split}.{lang}.gz")
    made, _ = tokenize_untokenized(raw, lang)
    differ = [i for i, (a, b) in enumerate(zip(made, tok)) if a.strip() != b.strip()]
    assert len(made) == len(tok) and len(differ) <= (1 if (split, lang) == ("val", "fr") else 0), differ[:5]
    kept, changed = tokenize_untokenized(tok, lang)
    assert kept == tok, f"{len(changed)} tokenized lines were changed"


@pytest.mark.parametrize("lang, tokenized, plain", [
    ("fr", "l&apos; équipe s&apos; arrête devant l&apos; église .", "l'équipe s'arrête devant l'église."),
    ("en", "a boy sits on a woman &apos;s shoulders .", "a boy sits on a woman's shoulders."),
    ("de", "ein mann sagt &quot; hallo &quot; und geht ( schnell ) weg .", 'ein mann sagt "hallo" und geht (schnell) weg.'),
    ("en", "rock &amp; roll , 3 @-@ 2", "rock & roll, 3-2"),
])
def test_a_tok_models_translation_is_detokenized_to_plain_text(lang, tokenized, plain):
    assert detokenize_multi30k([tokenized], lang) == [plain]


@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_detokenizing_undoes_the_datasets_tokenizer(multi30k_dir, split, lang):
    """translate detokenizes a tok/ model's translations of raw lines: on the dataset's own tokenized text, tokenizing
    the detokenized line as the dataset's script does must give the line back, every line of dev and test."""
    tok = gzip.open(multi30k_dir / "tok" / f"{split}.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
    back = lowercase_normalize_tokenize(detokenize_multi30k(tok, lang), lang)
    differ = [i for i, (a, b) in enumerate(zip(back, tok)) if a.strip() != b.strip()]
    assert not differ, [(tok[i], back[i]) for i in differ[:3]]


def test_lines_that_look_neither_way_follow_the_lines_read_with_them():
    """A lowercase line without punctuation looks neither raw nor tokenized: alone (or the input's first window) or
    beside raw lines its translation is plain text (it came back as ``l&apos; homme ...``); beside tokenized lines,
    or after a window of them, it keeps the model's form."""
    neither = "the man sits on the bench"
    assert plain_text_lines([neither], []) == ([0], False)
    raw = ["The man sits.", neither, ""]
    assert plain_text_lines(raw, tokenize_untokenized(raw, "en")[1]) == ([0, 1], False)
    tok = ["the man sits .", neither]
    assert plain_text_lines(tok, tokenize_untokenized(tok, "en")[1]) == ([], True)
    mixed = ["The man sits.", "a man &apos;s dog", neither]  # tokenized text in the window: only the raw line
    assert plain_text_lines(mixed, tokenize_untokenized(mixed, "en")[1]) == ([0], True)
    assert plain_text_lines([neither], [], tokenized_before=True) == ([], True)
    assert plain_text_lines([neither], [], tokenized_before=False) == ([0], False)


@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_the_datasets_tokenized_test_file_keeps_every_translation_in_the_models_form(multi30k_dir, lang):
    """About 5% of the tok/ test lines look neither raw nor tokenized ("two men wearing black in a city"): read with
    the others, none of their translations is detokenized, so translate's output stays the form the literature
    scores."""
    tok = gzip.open(multi30k_dir / "tok" / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
    tokenized = tokenize_untokenized(tok, lang)[1]
    assert tokenized == [] and plain_text_lines(tok, tokenized) == ([], True)


@pytest.mark.parametrize("split", ["train", "val", "test_2016_flickr"])
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_the_datasets_files_read_as_what_they_are(multi30k_dir, split, lang):
    """A few tok/ lines look raw (81 of the 29,000 German training lines, 3 of the 1,014 German dev lines: an
    abbreviation's full stop); one such line had the model's own dev reference tokenized again. Every raw file reads
    as raw, every tok/ file as tokenized."""
    def lines(*parts: str) -> list[str]:
        return gzip.open(multi30k_dir.joinpath(*parts), "rt", encoding="utf-8").read().splitlines()

    tok, raw = lines("tok", f"{split}.{lang}.gz"), lines(f"{split}.{lang}.gz")
    assert reads_as_tokenized(tok) and not reads_as_raw(tok)
    assert reads_as_raw(raw) and not reads_as_tokenized(raw)
