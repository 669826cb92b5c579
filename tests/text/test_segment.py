"""split_sentences / join_sentences: what the splitter must split, what it must not break, and Multi30k intact."""

from __future__ import annotations

import gzip
import logging

import pytest

from rpr_mt.text import segment
from rpr_mt.text.segment import join_sentences, split_sentences


@pytest.mark.parametrize("lang, line, expected", [
    ("en", "A man rides a bike. A dog runs. Two kids play. It rains.",
     ["A man rides a bike.", "A dog runs.", "Two kids play.", "It rains."]),
    ("en", "Wait... what? Yes!", ["Wait... what?", "Yes!"]),  # an ellipsis inside a sentence
    ("en", "Hello!!! Why??? Ok", ["Hello!!!", "Why???", "Ok"]),
    ("de", "Ein Mann fährt Rad. Ein Hund läuft.", ["Ein Mann fährt Rad.", "Ein Hund läuft."]),
    ("zh", "我喜欢猫。你呢？我也喜欢！", ["我喜欢猫。", "你呢？", "我也喜欢！"]),
    ("ja", "今日は晴れです。明日は雨です。", ["今日は晴れです。", "明日は雨です。"]),
    ("hi", "यह एक वाक्य है। यह दूसरा है।", ["यह एक वाक्य है।", "यह दूसरा है।"]),
    ("ar", "هذه جملة. هل هذه جملة؟ نعم", ["هذه جملة.", "هل هذه جملة؟", "نعم"]),
    ("el", "Τι; Ναι.", ["Τι;", "Ναι."]),  # the Greek question mark
])
def test_sentences_are_split(lang: str, line: str, expected: list[str]) -> None:
    assert split_sentences(line, lang) == expected


@pytest.mark.parametrize("lang, line, expected", [
    ("en", "Dr. Smith went home. He slept.", ["Dr. Smith went home.", "He slept."]),  # abbreviation
    ("en", "This is e.g. a test. Another one", ["This is e.g. a test.", "Another one"]),
    ("en", "Mr. and Mrs. Brown came at 5 p.m. today. They stayed.",
     ["Mr. and Mrs. Brown came at 5 p.m. today.", "They stayed."]),
    ("de", "Das ist z. B. ein Test. Noch einer.", ["Das ist z. B. ein Test.", "Noch einer."]),
    ("de", "Dr. Müller kam um 10.30 Uhr. Er blieb.", ["Dr. Müller kam um 10.30 Uhr.", "Er blieb."]),
    ("de", "Am 3. Oktober war Feiertag. Schön.", ["Am 3. Oktober war Feiertag.", "Schön."]),  # ordinal
    ("fr", "M. Dupont est là. Il attend.", ["M. Dupont est là.", "Il attend."]),  # sentencex alone splits "M."
    ("en", "J. K. Rowling wrote it. Then more.", ["J. K. Rowling wrote it.", "Then more."]),  # initials
    ("en", "Prices rose 3.5 percent. Then fell.", ["Prices rose 3.5 percent.", "Then fell."]),  # decimal
    ("en", "It costs $3.50 (approx. 4 euros). Fine.", ["It costs $3.50 (approx. 4 euros).", "Fine."]),  # bracket
    ("en", "See https://example.com/a.b?x=1. It works.", ["See https://example.com/a.b?x=1.", "It works."]),  # URL
    ("en", "Mail a.b@c.de now. Thanks.", ["Mail a.b@c.de now.", "Thanks."]),
    ("en", 'He said "Stop. Now." and left.', ['He said "Stop. Now." and left.']),  # quotes
    ("de", "Er sagte: „Komm. Jetzt.“ Dann ging er.", ["Er sagte: „Komm. Jetzt.“", "Dann ging er."]),
    ("en", "(This is one. And two.) Then three.", ["(This is one. And two.) Then three."]),
    ("en", "A line without final punctuation", ["A line without final punctuation"]),
    ("zh", "他说：“好。”然后走了。", ["他说：“好。”", "然后走了。"]),  # a closing quote stays with its sentence
])
def test_text_that_must_not_be_broken(lang: str, line: str, expected: list[str]) -> None:
    assert split_sentences(line, lang) == expected


def test_whitespace_and_empty_lines() -> None:
    # Surrounding whitespace is the line's, not a sentence's: one sentence is the stripped line, which is what
    # translating the whole line encodes; a blank line has no sentences (translate keeps it an empty output line).
    assert split_sentences("  One sentence.  ", "en") == ["One sentence."]
    assert split_sentences("  One.  Two.  ", "en") == ["One.", "Two."]
    assert split_sentences("", "en") == [] and split_sentences(" \t ", "en") == []
    assert split_sentences("Ends with an initial M.", "fr") == ["Ends with an initial M."]


def test_unknown_language_falls_back_and_says_so_once(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr(segment, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="rpr_mt.text.segment"):
        assert split_sentences("Dr. Smith came. He left.", "xh") == ["Dr. Smith came.", "He left."]
        assert split_sentences("One. Two.", "xh") == ["One.", "Two."]
        split_sentences("One. Two.", "de")  # a known language: nothing said
        split_sentences("One. Two.", "cs")  # mapped to sentencex's Slovak rules: nothing said
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "'xh'" in messages[0]


def test_join() -> None:
    assert join_sentences(["A man.", "A dog."], "en") == "A man. A dog."
    assert join_sentences(["我喜欢猫。", "你呢？"], "zh") == "我喜欢猫。你呢？"
    assert join_sentences(["A man.", "", " A dog. "], "de") == "A man. A dog."  # an empty translation adds no space
    assert join_sentences(["d pue   "], "de") == "d pue   "  # a one-sentence line's output, untouched


# Moses-tokenized text (Multi30k's tok/ files): tokenizer.perl writes " as &quot;, ' as &apos;, & as &amp;. An escape
# is read as the character it stands for; the sentences come back as written, escapes included.
@pytest.mark.parametrize("lang, line", [
    ("en", "a kid crosscountry skis wearing the number &quot; 93 . &quot;"),  # tok/test_2016_flickr.en line 383
    ("en", "a man in a red shirt walks past a turquoise and white checkered food establishment called "
           "&quot; 32 de neude . &quot;"),  # line 694
    ("en", "a man in a blue shirt is holding a sign that says &quot; come on now ... what &apos;s gayer than tea . "
           "&quot;"),  # tok/val.en line 656
    ("fr", "un homme passe devant un grand panneau où est écrit &quot; e.s.e. electronics &quot; ."),  # test fr 361
    ("en", "he shouts &apos; stop . &apos;"),  # a single quote
    ("en", "he shouts &#39; stop . &#39;"),  # the numeric escapes
    ("en", "a sign that says &#34; open . &#34;"),
    ("el", "Ο Γιάννης &amp; η Μαρία."),  # the ; of an escape is no Greek question mark
])
def test_escaped_quotes_stay_with_their_sentence(lang: str, line: str) -> None:
    assert split_sentences(line, lang) == [line]


def test_tokenized_text_is_still_split_and_given_back_as_written() -> None:
    assert split_sentences("a sign . &quot; yes &quot; . the dog &apos;s ball .", "en") == \
        ["a sign .", "&quot; yes &quot; .", "the dog &apos;s ball ."]
    assert split_sentences("  l&apos; homme est là .  l&apos; autre aussi .  ", "fr") == \
        ["l&apos; homme est là .", "l&apos; autre aussi ."]
    assert split_sentences("One. &amp; Two &lt; three &#124; four &#91; five &#93;.", "en") == \
        ["One.", "&amp; Two &lt; three &#124; four &#91; five &#93;."]
    assert split_sentences("&quot;", "en") == ["&quot;"]
    assert split_sentences("a &amp;quot; sign . a dog .", "en") == ["a &amp;quot; sign .", "a dog ."]  # read once


@pytest.mark.parametrize("name", [f"{tok}{split}.{lang}.gz" for tok in ("", "tok/")
                                  for split in ("val", "test_2016_flickr") for lang in ("en", "de", "fr")])
def test_every_multi30k_dev_and_test_line_is_one_sentence(multi30k_dir, name: str) -> None:
    """Splitting must not change a one-sentence line's translation: each caption of the dev and test sets, raw and
    tokenized (tok/, with its &quot; and &apos;), comes back whole, as itself."""
    lang = name.split(".")[-2]
    with gzip.open(multi30k_dir / name, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == (1014 if "val" in name else 1000)
    changed = [(number, split_sentences(line, lang)) for number, line in enumerate(lines, 1)
               if split_sentences(line, lang) != [line.strip()]]
    assert changed == []
