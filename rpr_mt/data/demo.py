"""A synthetic English -> toy-language corpus that can only be translated with word-order information.

Source: English-like clauses ``SUBJ VERB OBJ [PREP NP]`` (optionally two clauses joined by "and"/"but"), noun
phrases ``[DET] [NUMBER] [ADJ [ADJ]] NOUN``, present tense (with English subject agreement) or past tense.

Target: the same meaning in a toy language with

* verb-final clauses: ``SUBJ OBJ ko [NP POSTPOSITION] VERB`` (the object is marked by the particle ``ko``),
* mirrored noun phrases: ``NOUN[+n] ADJ2 ADJ1 NUMBER DET`` (English "a" has no translation),
* agreement: every noun has a hidden class (0, 1, 2); adjectives, numbers and determiners carry a suffix for the
  class and number of their noun, and the verb carries the suffix of its subject (+ ``ta`` for the past).

"the dog sees the cat" and "the cat sees the dog" share one bag of words but translate differently (the first noun
is the subject: it comes first, the other one gets ``ko``, and the verb agrees with it), and which adjective goes
with which noun is visible only from the order, so a model without position information cannot translate it.

The lexicon is fixed (only the sampled sentences depend on the seed). Splits are disjoint by construction: a
sentence belongs to exactly one split, decided by a hash of its source text.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

GENERATOR_VERSION = 1  # bump whenever the output for a given seed changes (it is part of the prepared-data manifest)
MIN_WORDS, MAX_WORDS = 5, 25  # source sentence length in words

# ------------------------------------------------------------------------------------------------------------------
# Source lexicon
# ------------------------------------------------------------------------------------------------------------------

_NOUNS = [  # (singular, plural)
    ("dog", "dogs"), ("cat", "cats"), ("bird", "birds"), ("horse", "horses"), ("cow", "cows"), ("goat", "goats"),
    ("farmer", "farmers"), ("teacher", "teachers"), ("child", "children"), ("woman", "women"), ("man", "men"),
    ("king", "kings"), ("queen", "queens"), ("boy", "boys"), ("girl", "girls"), ("doctor", "doctors"),
    ("baker", "bakers"), ("sailor", "sailors"), ("friend", "friends"), ("house", "houses"), ("tree", "trees"),
    ("river", "rivers"), ("book", "books"), ("table", "tables"), ("door", "doors"), ("car", "cars"),
    ("boat", "boats"), ("apple", "apples"), ("box", "boxes"), ("key", "keys"),
]
_ADJECTIVES = [
    "big", "small", "old", "young", "red", "blue", "green", "black", "white", "happy", "sad", "tall", "heavy",
    "dark", "cold", "warm", "brave", "strong", "rich", "new",
]
_VERBS = [  # (3rd person singular present, plural present, past)
    ("sees", "see", "saw"), ("likes", "like", "liked"), ("finds", "find", "found"),
    ("carries", "carry", "carried"), ("follows", "follow", "followed"), ("watches", "watch", "watched"),
    ("helps", "help", "helped"), ("visits", "visit", "visited"), ("buys", "buy", "bought"),
    ("sells", "sell", "sold"), ("builds", "build", "built"), ("opens", "open", "opened"),
    ("holds", "hold", "held"), ("pushes", "push", "pushed"), ("pulls", "pull", "pulled"),
    ("wants", "want", "wanted"), ("meets", "meet", "met"), ("calls", "call", "called"),
    ("breaks", "break", "broke"), ("brings", "bring", "brought"),
]
_NUMBERS = ["two", "three", "four", "five", "six"]
_PREPOSITIONS = ["near", "behind", "under", "with", "beside", "above"]
_CONJUNCTIONS = ["and", "but"]
# Determiners: source word -> (target stem or None for "no word", allowed grammatical numbers)
_DETERMINERS = {
    "the": ("e", ("sg", "pl")), "a": (None, ("sg",)), "this": ("si", ("sg",)), "that": ("vo", ("sg",)),
    "these": ("si", ("pl",)), "those": ("vo", ("pl",)), "some": ("pa", ("pl",)),
}
_NUMBER_DETERMINERS = ("the", "these", "those")  # may precede a number word: "the three dogs"

# Agreement suffixes by (noun class, grammatical number).
_AGREEMENT = {(0, "sg"): "ka", (0, "pl"): "ki", (1, "sg"): "ro", (1, "pl"): "ri", (2, "sg"): "mu", (2, "pl"): "mi"}
_OBJECT_MARKER = "ko"
_PAST_SUFFIX = "ta"
_PLURAL_SUFFIX = "n"


def _make_stems(count: int, rng: random.Random, taken: set[str]) -> list[str]:
    """Distinct pronounceable two-or-three-syllable stems ending in a vowel."""
    consonants, vowels = "bdfghlmnprstvz", "aeiou"
    stems: list[str] = []
    while len(stems) < count:
        syllables = rng.choice((2, 2, 3))
        stem = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
        if stem not in taken:
            taken.add(stem)
            stems.append(stem)
    return stems


@dataclass(frozen=True)
class _Lexicon:
    noun: dict[str, tuple[str, int]]  # singular English -> (target stem, class)
    adjective: dict[str, str]
    verb: dict[str, str]  # 3sg English form -> target stem
    number: dict[str, str]
    preposition: dict[str, str]
    conjunction: dict[str, str]


def _build_lexicon() -> _Lexicon:
    # A fixed RNG: the toy language is the same for every corpus seed.
    rng = random.Random(20180306)
    # Reserve the function words so that no content stem collides with them.
    taken = {_OBJECT_MARKER} | {d + s for d, _ in _DETERMINERS.values() if d for s in _AGREEMENT.values()}
    classes = [i % 3 for i in range(len(_NOUNS))]
    rng.shuffle(classes)
    noun_stems = _make_stems(len(_NOUNS), rng, taken)
    return _Lexicon(
        noun={sg: (stem, cls) for (sg, _), stem, cls in zip(_NOUNS, noun_stems, classes)},
        adjective=dict(zip(_ADJECTIVES, _make_stems(len(_ADJECTIVES), rng, taken))),
        verb={forms[0]: stem for forms, stem in zip(_VERBS, _make_stems(len(_VERBS), rng, taken))},
        number=dict(zip(_NUMBERS, _make_stems(len(_NUMBERS), rng, taken))),
        preposition=dict(zip(_PREPOSITIONS, _make_stems(len(_PREPOSITIONS), rng, taken))),
        conjunction=dict(zip(_CONJUNCTIONS, _make_stems(len(_CONJUNCTIONS), rng, taken))),
    )


# ------------------------------------------------------------------------------------------------------------------
# Sentence structures (public so tests can build minimal pairs) and their two renderings
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NounPhrase:
    noun: str  # singular English noun
    plural: bool = False
    determiner: Optional[str] = "the"
    number: Optional[str] = None  # only with plural
    adjectives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Clause:
    subject: NounPhrase
    verb: str  # 3sg English form, e.g. "sees"
    obj: NounPhrase
    past: bool = False
    preposition: Optional[str] = None
    prep_object: Optional[NounPhrase] = None


@dataclass(frozen=True)
class Sentence:
    clauses: tuple[Clause, ...]
    conjunctions: tuple[str, ...] = field(default=())  # len(clauses) - 1


_PLURAL = dict(_NOUNS)
_VERB_FORMS = {forms[0]: forms for forms in _VERBS}


def _source_np(np: NounPhrase) -> list[str]:
    words = [np.determiner] if np.determiner else []
    if np.number:
        words.append(np.number)
    words.extend(np.adjectives)
    words.append(_PLURAL[np.noun] if np.plural else np.noun)
    return words


def _target_np(np: NounPhrase, lex: _Lexicon) -> list[str]:
    stem, cls = lex.noun[np.noun]
    agr = _AGREEMENT[(cls, "pl" if np.plural else "sg")]
    words = [stem + _PLURAL_SUFFIX if np.plural else stem]
    words.extend(lex.adjective[a] + agr for a in reversed(np.adjectives))  # mirrored order
    if np.number:
        words.append(lex.number[np.number] + agr)
    det_stem = _DETERMINERS[np.determiner][0] if np.determiner else None
    if det_stem:
        words.append(det_stem + agr)
    return words


def render_source(sentence: Sentence) -> str:
    words: list[str] = []
    for i, clause in enumerate(sentence.clauses):
        if i:
            words.append(sentence.conjunctions[i - 1])
        sg, pl, past = _VERB_FORMS[clause.verb]
        words += _source_np(clause.subject)
        words.append(past if clause.past else (pl if clause.subject.plural else sg))
        words += _source_np(clause.obj)
        if clause.preposition and clause.prep_object:
            words.append(clause.preposition)
            words += _source_np(clause.prep_object)
    return " ".join(words)


def render_target(sentence: Sentence, lexicon: Optional[_Lexicon] = None) -> str:
    lex = lexicon or _LEXICON
    words: list[str] = []
    for i, clause in enumerate(sentence.clauses):
        if i:
            words.append(lex.conjunction[sentence.conjunctions[i - 1]])
        words += _target_np(clause.subject, lex)
        words += _target_np(clause.obj, lex)
        words.append(_OBJECT_MARKER)
        if clause.preposition and clause.prep_object:
            words += _target_np(clause.prep_object, lex)
            words.append(lex.preposition[clause.preposition])
        _, cls = lex.noun[clause.subject.noun]
        verb = lex.verb[clause.verb] + _AGREEMENT[(cls, "pl" if clause.subject.plural else "sg")]
        words.append(verb + _PAST_SUFFIX if clause.past else verb)
    return " ".join(words)


_LEXICON = _build_lexicon()

# ------------------------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------------------------


def _sample_np(rng: random.Random) -> NounPhrase:
    noun = rng.choice(_NOUNS)[0]
    plural = rng.random() < 0.35
    n_adj = rng.choices((0, 1, 2), weights=(0.55, 0.35, 0.10))[0]
    adjectives = tuple(rng.sample(_ADJECTIVES, n_adj))
    number = None
    if plural:
        determiner = rng.choice(["the", "these", "those", "some", None])
        if determiner in _NUMBER_DETERMINERS + (None,) and rng.random() < 0.4:
            number = rng.choice(_NUMBERS)
    else:
        determiner = rng.choices(["the", "a", "this", "that"], weights=(4, 3, 1, 1))[0]
    return NounPhrase(noun, plural, determiner, number, adjectives)


def _sample_clause(rng: random.Random) -> Clause:
    subject, obj = _sample_np(rng), _sample_np(rng)
    verb = rng.choice(_VERBS)[0]
    past = rng.random() < 0.4
    if rng.random() < 0.25:
        return Clause(subject, verb, obj, past, rng.choice(_PREPOSITIONS), _sample_np(rng))
    return Clause(subject, verb, obj, past)


def _sample_sentence(rng: random.Random) -> Sentence:
    if rng.random() < 0.2:
        return Sentence((_sample_clause(rng), _sample_clause(rng)), (rng.choice(_CONJUNCTIONS),))
    return Sentence((_sample_clause(rng),))


# Splits are disjoint by construction: each source sentence hashes into exactly one bucket.
_BUCKETS = 50
_SPLIT_BUCKETS = {"dev": range(0, 1), "test": range(1, 2)}  # every other split name (train) gets buckets 2..49


def _bucket_of(source: str) -> int:
    return int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:4], "big") % _BUCKETS


def _in_split(source: str, split: str) -> bool:
    bucket = _bucket_of(source)
    if split in _SPLIT_BUCKETS:
        return bucket in _SPLIT_BUCKETS[split]
    return all(bucket not in r for r in _SPLIT_BUCKETS.values())


def iter_demo(n_pairs: int, seed: int, split: str = "train") -> Iterator[tuple[str, str]]:
    """Yield ``n_pairs`` (source, target) pairs; a pure function of (n_pairs, seed, split)."""
    rng = random.Random(f"rpr-mt-demo/{GENERATOR_VERSION}/{seed}/{split}")
    produced = 0
    while produced < n_pairs:
        sentence = _sample_sentence(rng)
        source = render_source(sentence)
        if not MIN_WORDS <= len(source.split()) <= MAX_WORDS or not _in_split(source, split):
            continue
        produced += 1
        yield source, render_target(sentence)


def generate_demo(n_pairs: int, seed: int, split: str = "train") -> list[tuple[str, str]]:
    """The demo corpus as a list (see ``iter_demo``)."""
    return list(iter_demo(n_pairs, seed, split))


def swap_subject_object(sentence: Sentence) -> Sentence:
    """Same words, subject and object exchanged in every clause (a minimal pair for word order)."""
    return replace(sentence, clauses=tuple(replace(c, subject=c.obj, obj=c.subject) for c in sentence.clauses))


def demo_vocabulary() -> tuple[set[str], set[str]]:
    """All word types the generator can emit: (source words, target words)."""
    source: set[str] = set(_DETERMINERS) | set(_NUMBERS) | set(_ADJECTIVES) | set(_PREPOSITIONS)
    source |= set(_CONJUNCTIONS) | {w for pair in _NOUNS for w in pair} | {w for forms in _VERBS for w in forms}
    lex = _LEXICON
    agrs = list(_AGREEMENT.values())
    target = {_OBJECT_MARKER} | set(lex.preposition.values()) | set(lex.conjunction.values())
    target |= {stem for stem, _ in lex.noun.values()} | {stem + _PLURAL_SUFFIX for stem, _ in lex.noun.values()}
    target |= {a + s for a in lex.adjective.values() for s in agrs}
    target |= {n + s for n in lex.number.values() for s in agrs if s in ("ki", "ri", "mi")}
    target |= {d + s for d, _ in _DETERMINERS.values() if d for s in agrs}
    target |= {v + s + t for v in lex.verb.values() for s in agrs for t in ("", _PAST_SUFFIX)}
    return source, target
