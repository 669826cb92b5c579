"""The synthetic demo corpus: deterministic, disjoint splits, and a translation that needs word order."""

from __future__ import annotations

import random
from collections import Counter

from rpr_mt.data import demo
from rpr_mt.data.demo import Clause, NounPhrase, Sentence, render_source, render_target


def test_same_seed_same_corpus_other_seed_other_corpus():
    a = demo.generate_demo(200, seed=7)
    assert a == demo.generate_demo(200, seed=7)
    assert a != demo.generate_demo(200, seed=8)
    assert a[:50] == demo.generate_demo(50, seed=7)  # a prefix does not depend on the requested size


def test_sentence_lengths_and_vocabulary_are_modest():
    pairs = demo.generate_demo(3000, seed=1)
    lengths = [len(src.split()) for src, _ in pairs]
    assert min(lengths) >= demo.MIN_WORDS and max(lengths) <= demo.MAX_WORDS
    source_words, target_words = demo.demo_vocabulary()
    assert 150 <= len(source_words) <= 400 and len(target_words) <= 600
    used_src = {w for src, _ in pairs for w in src.split()}
    used_tgt = {w for _, tgt in pairs for w in tgt.split()}
    assert used_src <= source_words and used_tgt <= target_words
    assert len(used_src) > 0.9 * len(source_words)  # the sample covers the lexicon


def test_splits_are_disjoint_by_construction():
    train = {s for s, _ in demo.generate_demo(3000, seed=3, split="train")}
    dev = {s for s, _ in demo.generate_demo(100, seed=3, split="dev")}
    test = {s for s, _ in demo.generate_demo(100, seed=3, split="test")}
    assert not train & dev and not train & test and not dev & test


def test_swapping_subject_and_object_keeps_the_words_but_changes_the_translation():
    dog, cat = NounPhrase("dog", adjectives=("big",)), NounPhrase("cat", adjectives=("red",))
    sentence = Sentence((Clause(dog, "sees", cat),))
    swapped = demo.swap_subject_object(sentence)
    assert render_source(sentence) == "the big dog sees the red cat"
    assert render_source(swapped) == "the red cat sees the big dog"
    assert Counter(render_source(sentence).split()) == Counter(render_source(swapped).split())
    assert render_target(sentence) != render_target(swapped)


def test_reordering_and_agreement():
    # Verb-final, object marked with "ko", adjectives after the noun in mirrored order, number + determiner last.
    np_subject = NounPhrase("dog", plural=True, determiner="the", number="three", adjectives=("big", "red"))
    sentence = Sentence((Clause(np_subject, "sees", NounPhrase("cat", determiner="a"), past=True),))
    assert render_source(sentence) == "the three big red dogs saw a cat"
    words = render_target(sentence).split()
    lex = demo._LEXICON
    dog, dog_class = lex.noun["dog"]
    cat, _ = lex.noun["cat"]
    agr = demo._AGREEMENT[(dog_class, "pl")]
    assert words == [dog + "n", lex.adjective["red"] + agr, lex.adjective["big"] + agr, lex.number["three"] + agr,
                     "e" + agr, cat, "ko", lex.verb["sees"] + agr + "ta"]


def test_target_agreement_depends_on_the_noun_class():
    classes = {cls for _, cls in demo._LEXICON.noun.values()}
    assert classes == {0, 1, 2}
    by_class = {}
    for noun, (_, cls) in demo._LEXICON.noun.items():
        by_class.setdefault(cls, noun)
    targets = {render_target(Sentence((Clause(NounPhrase(n, adjectives=("old",)), "likes", NounPhrase("key")),)))
               for n in by_class.values()}
    old_forms = {t.split()[1] for t in targets}
    assert len(old_forms) == 3  # "old" agrees with three different noun classes


def test_a_bag_of_words_does_not_determine_the_translation():
    # Many sentences of the corpus have a word-order twin (subject and object swapped) with another translation.
    rng = random.Random(11)
    twins = 0
    for _ in range(50):
        sentence = demo._sample_sentence(rng)
        swapped = demo.swap_subject_object(sentence)
        if render_source(swapped) != render_source(sentence):  # (subject and object may be the same phrase)
            twins += 1
            assert render_target(swapped) != render_target(sentence)
    assert twins >= 45
