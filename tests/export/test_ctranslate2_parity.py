"""Parity: a tiny demo model of each exportable kind is trained, exported, and translates the same sentences with
CTranslate2 in float32 (greedy and beam 4) as with `rpr-mt translate`: equal tokens, scores within 1e-3.

The sentences are the training pairs the model has learnt (its outputs end with eos early) and unseen dev sentences
(where a tiny model's search may run to the length limit). At the limit rpr-mt forces eos and CTranslate2 cannot;
ExportedTranslator recovers rpr-mt's result exactly for greedy search, but with a beam not always (documented in
rpr_mt.decode.ctranslate2), so there sentences whose rpr-mt search reached the limit are left out, and most sentences
must remain. Below the best hypothesis, an n-best list may differ where more than beam-size hypotheses finish at
the last step (also documented there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ctranslate2
import pytest
import sentencepiece as spm
import torch

from rpr_mt.data.binarize import load_split
from rpr_mt.decode.ctranslate2 import ExportedTranslator
from rpr_mt.decode.search import Hypothesis, beam_search, greedy_search
from rpr_mt.decode.translate import translate_lines
from rpr_mt.lines import read_lines
from rpr_mt.export.ctranslate2 import export_ctranslate2
from rpr_mt.checkpoint_files import load_for_inference
from rpr_mt.train.trainer import train

from .conftest import TRAIN_PAIRS, tiny_config

SCHEMES = {
    "absolute": dict(positions="absolute"),
    "absolute-learned-prenorm": dict(positions="absolute", absolute_kind="learned", norm="pre"),
    "none": dict(positions="none"),
    "relative-shared": dict(positions="relative", share_across_heads=True),
    "relative-shared-keys-only-prenorm": dict(positions="relative", share_across_heads=True, use_value=False,
                                              norm="pre"),
    "relative-shared-values-only": dict(positions="relative", share_across_heads=True, use_key=False),
    "relative-k0-per-head": dict(positions="relative", clip=0),
    "t5": dict(positions="t5"),
    "rope": dict(positions="rope"),
    "alibi": dict(positions="alibi"),
}
DEV_SENTENCES = 8
MIN_COMPARED = 10  # of TRAIN_PAIRS + DEV_SENTENCES sentences per search
TOLERANCE = 1e-3


def rpr_mt_nbest(model, sources: list[list[int]], beam: int, decode) -> list[list[Hypothesis]]:
    """rpr-mt's search as `rpr-mt translate` runs it (one padded batch), every finished hypothesis of the beam."""
    width = max(len(s) for s in sources) + 1
    src = torch.full((len(sources), width), model.pad_id, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids) + 1] = torch.tensor(ids + [model.eos_id])
    if beam == 1:
        found = greedy_search(model, src, max_len_a=decode.max_len_a, max_len_b=decode.max_len_b,
                              min_len=decode.min_length, length_penalty=decode.length_penalty)
        return [[h] for h in found]
    return beam_search(model, src, beam_size=beam, length_penalty=decode.length_penalty, nbest=beam,
                       max_len_a=decode.max_len_a, max_len_b=decode.max_len_b, min_len=decode.min_length)


def reached_limit(model, sources: list[list[int]], decode, translator: ExportedTranslator) -> list[bool]:
    """Whether rpr-mt's search for each source ran to the length limit (then it forced eos on the open beams)."""
    found = rpr_mt_nbest(model, sources, decode.beam_size, dataclasses.replace(decode, nbest=decode.beam_size))
    return [any(len(h.tokens) >= translator.limit(s, decode) for h in hyps) for s, hyps in zip(sources, found)]


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def exported(request, tmp_path_factory, export_data):
    """(model, config, vocab, exported directory) of a tiny model trained on the demo pairs."""
    root = tmp_path_factory.mktemp(request.param)
    cfg = tiny_config(export_data, root / "run", **SCHEMES[request.param])
    train(cfg, progress=False)
    export_ctranslate2(root / "run", root / "ct2", which="last")
    loaded = load_for_inference(root / "run", "last")
    model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
    return model, cfg, vocab, root / "ct2"


def test_tokens_and_scores_equal_rpr_mt(exported, export_data):
    model, cfg, vocab, directory = exported
    translator = ExportedTranslator(directory, threads=1)
    training = load_split(export_data, "train")
    sources = [training.src(i).tolist() for i in range(TRAIN_PAIRS)]
    sources += [vocab.encode(line) for line in read_lines(str(export_data / "dev.en"))[:DEV_SENTENCES]]
    for beam, min_length in ((1, 1), (4, 1), (1, 0), (4, 0), (1, 3), (4, 3)):
        decode = dataclasses.replace(cfg.decode, beam_size=beam, nbest=beam, min_length=min_length)
        ours = rpr_mt_nbest(model, sources, beam, decode)
        theirs = translator.search(sources, decode)
        compared = 0
        at_limits = reached_limit(model, sources, decode, translator) if beam > 1 else [False] * len(sources)
        for at_limit, our_hyps, their_hyps in zip(at_limits, ours, theirs):
            if at_limit:
                continue  # see the module docstring
            compared += 1
            mine, other = our_hyps[0], their_hyps[0]  # the translation (lower n-best ranks: see the docstring)
            assert other.tokens == mine.tokens
            assert abs(other.score - mine.score) < TOLERANCE and abs(other.logprob - mine.logprob) < TOLERANCE
        assert compared >= MIN_COMPARED, f"beam {beam}: only {compared} sentences ended before the length limit"


def test_translated_text_equals_rpr_mt_translate(exported, export_data):
    """ExportedTranslator.translate_lines prints what `rpr-mt translate` prints, n-best lists and empty lines too."""
    model, cfg, vocab, directory = exported
    training = load_split(export_data, "train")
    lines = [vocab.decode(training.src(i).tolist()) for i in range(TRAIN_PAIRS)] + ["", "   "]
    translator = ExportedTranslator(directory, threads=1)
    ours = translate_lines(model, vocab, lines, decode=cfg.decode, device="cpu")
    theirs = translator.translate_lines(lines)  # the exported decode settings: the run's, beam 4
    at_limit = reached_limit(model, [vocab.encode(line) for line in lines[:TRAIN_PAIRS]], cfg.decode, translator)
    assert [o for o, skip in zip(theirs, at_limit) if not skip] == [o for o, skip in zip(ours, at_limit) if not skip]
    assert at_limit.count(False) >= MIN_COMPARED and theirs[TRAIN_PAIRS:] == ours[TRAIN_PAIRS:] == ["", ""]
    nbest = dataclasses.replace(cfg.decode, nbest=2)
    ours = [line.split("\t") for line in translate_lines(model, vocab, lines, decode=nbest, device="cpu")]
    theirs = [line.split("\t") for line in translator.translate_lines(lines, nbest)]
    assert [row[0] for row in theirs] == [row[0] for row in ours] == [str(i) for i in range(len(lines)) for _ in "ab"]
    assert all(abs(float(a[1]) - float(b[1])) < TOLERANCE for a, b in zip(ours[::2], theirs[::2]))


def test_plain_ctranslate2_greedy_equals_rpr_mt(exported, export_data):
    """The README's standard use: only ctranslate2 and the directory's SentencePiece model, no rpr-mt code."""
    model, cfg, vocab, directory = exported
    lines = [vocab.decode(load_split(export_data, "train").src(i).tolist()) for i in range(TRAIN_PAIRS)]
    decode = dataclasses.replace(cfg.decode, beam_size=1)
    ours = translate_lines(model, vocab, lines, decode=decode, device="cpu")
    at_limit = reached_limit(model, [vocab.encode(line) for line in lines], decode, ExportedTranslator(directory))
    sp = spm.SentencePieceProcessor(model_file=str(Path(directory) / "spm.model"))
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    for line, mine, skip in zip(lines, ours, at_limit):
        pieces = sp.encode(line, out_type=str)
        limit = int(1.5 * (len(pieces) + 1) + 10)  # rpr-mt's length limit a * |x| + b, |x| counting eos
        result = translator.translate_batch([pieces], beam_size=1, min_decoding_length=decode.min_length,
                                            max_decoding_length=limit + 1)[0]
        assert skip or sp.decode(result.hypotheses[0]) == mine
    assert at_limit.count(False) >= MIN_COMPARED


def test_exported_translator_splits_sentences_as_translate_does(exported):
    """All sentences of all lines go to one search; each line gets one output line; --no-split's config key too."""
    model, cfg, vocab, directory = exported
    translator = ExportedTranslator(directory, threads=1)
    searched: list[int] = []
    real = translator.search
    translator.search = lambda sources, decode=None: searched.append(len(sources)) or real(sources, decode)
    lines = ["A man rides a bike. A dog runs. They stop.", "", "Two kids play."]
    greedy = dataclasses.replace(cfg.decode, beam_size=1)
    split = translator.translate_lines(lines, greedy)
    assert searched == [4] and len(split) == 3 and split[1] == ""
    whole = translator.translate_lines(lines, dataclasses.replace(greedy, split_sentences=False))
    assert searched == [4, 2] and whole[2] == split[2]  # a one-sentence line: the same translation
    assert split == translate_lines(model, vocab, lines, decode=greedy, device="cpu", src_lang=cfg.data.src_lang,
                                    tgt_lang=cfg.data.tgt_lang)
