"""Greedy and beam search: hand-checked scripted cases, exhaustive search on small trees, equivalences."""

from __future__ import annotations

import itertools
import math
import typing

import pytest
import torch

from rpr_mt.config import ModelConfig
from rpr_mt.decode.search import Hypothesis, beam_search, gnmt_length_penalty, greedy_search, max_output_lengths

from . import EOS, ID, PAD, ScriptedModel, ids, make_src, random_script, table_script, words

# "a c" is greedy's choice (0.6 * 0.55 = 0.33), but "b" is more probable (0.4 * 0.99 = 0.396).
BEAM_BEATS_GREEDY = {
    "s": {
        "": {"a": 0.6, "b": 0.4},
        "a": {"c": 0.55, "d": 0.45},
        "a c": {"</s>": 1.0},
        "a d": {"</s>": 1.0},
        "b": {"</s>": 0.99, "q": 0.01},
    }
}

# "x" has the higher log-probability (0.5 * 0.6 = 0.3 vs 0.45 * 0.8^3 = 0.2304), "y z w" the higher score once
# length-normalised with alpha = 1: log(0.3) / (7/6) = -1.032 < log(0.2304) / (9/6) = -0.979.
LENGTH_PENALTY_FLIPS = {
    "t": {
        "": {"x": 0.5, "y": 0.45, "q": 0.05},
        "x": {"</s>": 0.6, "q": 0.4},
        "y": {"z": 0.8, "q": 0.2},
        "y z": {"w": 0.8, "q": 0.2},
        "y z w": {"</s>": 0.8, "q": 0.2},
    }
}

LONG = dict(max_len_a=0.0, max_len_b=20)  # length limit far away

# "x" finishes first with p = 0.57, but "y z^8" (p = 0.4 * 0.99^9 = 0.366, 10 tokens with eos) wins with alpha = 1
# (-0.403 vs -0.482). Right after "x" finishes, the best open hypothesis "y z" (p = 0.396) looks hopeless unless
# the bound allows for the long final length.
LONG_WINNER = {
    "u": {
        "": {"x": 0.6, "y": 0.4},
        "x": {"</s>": 0.95, "r": 0.05},
        **{" ".join(["y"] + ["z"] * n): {"z": 0.99, "r": 0.01} for n in range(8)},
        " ".join(["y"] + ["z"] * 8): {"</s>": 0.99, "r": 0.01},
    }
}

# Greedy stops after "x" (eos 0.55 > r 0.45); continuing past it would find "x r^8" with a better alpha = 1 score,
# which beam size 1 must not do.
GREEDY_STOPS = {
    "v": {
        "": {"x": 0.9, "y": 0.1},
        "x": {"</s>": 0.55, "r": 0.45},
        **{" ".join(["x"] + ["r"] * n): {"r": 0.99, "q": 0.01} for n in range(1, 8)},
        " ".join(["x"] + ["r"] * 8): {"</s>": 0.99, "q": 0.01},
    }
}



def beam(model, src, **kwargs):
    kwargs = {"length_penalty": 0.0, "nbest": 1, **LONG, **kwargs}
    return beam_search(model, src, **kwargs)


def greedy(model, src, **kwargs):
    return greedy_search(model, src, **{**LONG, **kwargs})


def assert_same(a: list[Hypothesis], b: list[Hypothesis], tol: float = 1e-5) -> None:
    assert [h.tokens for h in a] == [h.tokens for h in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=tol) and x.score == pytest.approx(y.score, abs=tol)


# --------------------------------------------------------------------------------------------------------------------
# Hand-checked scripts
# --------------------------------------------------------------------------------------------------------------------


def test_length_penalty_formula() -> None:
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 1.0) == pytest.approx(2.0)
    assert gnmt_length_penalty(10, 0.0) == 1.0


def test_greedy_follows_argmax() -> None:
    model = ScriptedModel(table_script(BEAM_BEATS_GREEDY))
    [hyp] = greedy(model, make_src([ids("s")]), length_penalty=0.6)
    assert words(hyp.tokens) == "a c"
    assert hyp.logprob == pytest.approx(math.log(0.6 * 0.55), abs=1e-6)
    assert hyp.score == pytest.approx(hyp.logprob / gnmt_length_penalty(3, 0.6))
    assert set(model.step_widths) == {1}, "cached decoding feeds one token per step"


def test_beam_beats_greedy() -> None:
    model = ScriptedModel(table_script(BEAM_BEATS_GREEDY))
    [[hyp]] = beam(model, make_src([ids("s")]), beam_size=2)
    assert words(hyp.tokens) == "b"
    assert hyp.logprob == pytest.approx(math.log(0.396), abs=1e-6)
    assert hyp.score == hyp.logprob  # alpha = 0


def test_nbest_is_ordered_by_score() -> None:
    model = ScriptedModel(table_script(BEAM_BEATS_GREEDY))
    [hyps] = beam(model, make_src([ids("s")]), beam_size=2, nbest=2)
    assert [words(h.tokens) for h in hyps] == ["b", "a c"]
    assert hyps[0].score > hyps[1].score
    assert hyps[1].logprob == pytest.approx(math.log(0.33), abs=1e-6)


@pytest.mark.parametrize("alpha, expected", [(0.0, "x"), (1.0, "y z w")])
def test_length_penalty_changes_the_winner(alpha: float, expected: str) -> None:
    model = ScriptedModel(table_script(LENGTH_PENALTY_FLIPS))
    [[hyp]] = beam(model, make_src([ids("t")]), beam_size=2, length_penalty=alpha)
    assert words(hyp.tokens) == expected
    assert hyp.score == pytest.approx(hyp.logprob / gnmt_length_penalty(len(hyp.tokens) + 1, alpha))
    # Greedy never looks past "x", whatever alpha.
    assert words(greedy(model, make_src([ids("t")]), length_penalty=alpha)[0].tokens) == "x"


def test_bound_allows_for_longer_hypotheses() -> None:
    model = ScriptedModel(table_script(LONG_WINNER))
    [[hyp]] = beam(model, make_src([ids("u")]), beam_size=2, length_penalty=1.0)
    assert words(hyp.tokens) == "y" + " z" * 8
    assert hyp.score == pytest.approx(math.log(0.4 * 0.99**9) / gnmt_length_penalty(10, 1.0), abs=1e-6)


def test_beam_size_one_stops_where_greedy_stops() -> None:
    model = ScriptedModel(table_script(GREEDY_STOPS))
    src = make_src([ids("v")])
    [hyp] = greedy(model, src, length_penalty=1.0)
    assert words(hyp.tokens) == "x"
    assert beam(model, src, beam_size=1, length_penalty=1.0) == [[hyp]]


def test_beam_stops_early_when_the_bound_is_met() -> None:
    """With alpha = 0, "b" (0.396) is final as soon as the best open hypothesis falls below it: 2 steps, not 20."""
    model = ScriptedModel(table_script(BEAM_BEATS_GREEDY))
    beam(model, make_src([ids("s")]), beam_size=2)
    assert len(model.step_widths) == 2


def test_length_limit_forces_eos() -> None:
    # Unscripted prefixes continue with "q" forever, so only the limit ends them.
    model = ScriptedModel(table_script({"k l": {}}))
    src = make_src([ids("k l")])  # |x| = 3 with eos
    [hyp] = greedy_search(model, src, max_len_a=1.0, max_len_b=2)
    assert words(hyp.tokens) == "q q q q q"  # floor(1.0 * 3 + 2) = 5 tokens, then eos
    assert hyp.logprob < -25  # the forced eos keeps its real (tiny) probability
    [[bhyp]] = beam_search(model, src, beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=2)
    assert bhyp.tokens == hyp.tokens
    # max_len and max_positions cap the limit too.
    assert len(greedy_search(model, src, max_len_a=1.0, max_len_b=2, max_len=2)[0].tokens) == 2
    small = ScriptedModel(table_script({"k l": {}}), max_positions=4)
    assert len(greedy_search(small, src, max_len_a=1.0, max_len_b=2)[0].tokens) == 3
    assert len(beam_search(small, src, beam_size=2, length_penalty=0.6, max_len_a=1.0, max_len_b=2)[0][0].tokens) == 3


def test_zero_length_limit_gives_empty_output() -> None:
    model = ScriptedModel(table_script({"k": {}}))
    [hyp] = greedy_search(model, make_src([ids("k")]), max_len_a=0.0, max_len_b=0)
    assert hyp.tokens == []
    [[bhyp]] = beam_search(model, make_src([ids("k")]), beam_size=2, length_penalty=0.6, max_len_a=0.0, max_len_b=0)
    assert bhyp.tokens == []


# Ending at once is the single most probable step (0.5), but its score beats every real translation only because
# they pay for more steps: "a b" has p = 0.3 * 0.9 * 0.95. The empty output wins at alpha 0.6 unless eos is ruled out.
EMPTY_WINS = {"e": {"": {"</s>": 0.5, "a": 0.3, "c": 0.2}, "a": {"b": 0.9, "q": 0.1}, "a b": {"</s>": 0.95, "q": 0.05},
                    "c": {"</s>": 0.4, "q": 0.6}}}


def test_min_length_rules_out_the_empty_translation() -> None:
    model = ScriptedModel(table_script(EMPTY_WINS))
    src = make_src([ids("e")])
    assert greedy(model, src)[0].tokens == [] and beam(model, src, beam_size=3, length_penalty=0.6)[0][0].tokens == []
    [g] = greedy(model, src, min_len=1)
    [[b]] = beam(model, src, beam_size=3, length_penalty=0.6, min_len=1)
    assert words(g.tokens) == "a b" and words(b.tokens) == "a b"
    # The first step's distribution is renormalised without eos (as CTranslate2 does): 0.3 / 0.5, not 0.3.
    first = model._logits([ID["e"]], [])
    first[EOS] = -math.inf
    expected = float(first.log_softmax(-1)[ID["a"]]) + sum(
        float(model._logits([ID["e"]], prefix).log_softmax(-1)[token])
        for prefix, token in (([ID["a"]], ID["b"]), ([ID["a"], ID["b"]], EOS)))
    assert g.logprob == pytest.approx(expected, abs=1e-5) and b.logprob == pytest.approx(expected, abs=1e-5)
    assert expected == pytest.approx(math.log(0.6 * 0.9 * 0.95), abs=1e-4)
    # min_len 2 rules out "c" + eos too; every n-best hypothesis has at least 2 tokens.
    [hyps] = beam(model, src, beam_size=4, nbest=4, length_penalty=0.6, min_len=2)
    assert hyps and all(len(h.tokens) >= 2 for h in hyps)


def test_length_limit_wins_over_min_length() -> None:
    model = ScriptedModel(table_script({"k": {}}))
    src = make_src([ids("k")])
    [hyp] = greedy_search(model, src, max_len_a=0.0, max_len_b=0, min_len=3)
    [[bhyp]] = beam_search(model, src, beam_size=2, length_penalty=0.6, max_len_a=0.0, max_len_b=0, min_len=3)
    assert hyp.tokens == [] and bhyp.tokens == [] and math.isfinite(hyp.logprob)
    [hyp] = greedy_search(model, src, max_len_a=0.0, max_len_b=2, min_len=3)
    assert words(hyp.tokens) == "q q" and math.isfinite(hyp.logprob)  # eos forced at the limit, with its own logprob


def test_max_output_lengths() -> None:
    src = make_src([[4, 5, 6], [4]])  # lengths 4 and 2 with eos
    assert max_output_lengths(src, PAD, max_len_a=1.5, max_len_b=1, max_positions=100) == [7, 4]
    assert max_output_lengths(src, PAD, max_len_a=1.5, max_len_b=1, max_positions=6) == [5, 4]
    assert max_output_lengths(src, PAD, max_len_a=1.5, max_len_b=1, max_positions=100, max_len=3) == [3, 3]


def test_never_generates_pad_or_bos() -> None:
    model = ScriptedModel(table_script({"s": {"": {"<pad>": 0.5, "<s>": 0.3, "a": 0.2}, "a": {"</s>": 1.0}}}))
    assert words(greedy(model, make_src([ids("s")]))[0].tokens) == "a"
    assert words(beam(model, make_src([ids("s")]), beam_size=3)[0][0].tokens) == "a"


# --------------------------------------------------------------------------------------------------------------------
# Exhaustive search on small random trees
# --------------------------------------------------------------------------------------------------------------------

TOKENS = [4, 5, 6]  # with eos: 4 choices per step
SMALL_VOCAB = 7  # pad, unk, bos, eos + TOKENS: nothing outside the script


def exhaustive(model: ScriptedModel, source: list[int], limit: int, alpha: float, min_len: int = 0) -> list[Hypothesis]:
    """Every output of ``min(min_len, limit)`` to ``limit`` tokens, best score first; before ``min_len`` tokens the
    next token's distribution is the one without eos (its logit removed, then the softmax)."""
    hyps = []
    for length in range(min(min_len, limit), limit + 1):
        for tokens in itertools.product(TOKENS, repeat=length):
            seq, logprob = list(tokens) + [EOS], 0.0
            for t in range(len(seq)):
                logits = model._logits(source, seq[:t])
                if t < min(min_len, limit):
                    logits[EOS] = -math.inf
                logprob += float(logits.log_softmax(-1)[seq[t]])
            hyps.append(Hypothesis(list(tokens), logprob / gnmt_length_penalty(len(seq), alpha), logprob))
    return sorted(hyps, key=lambda h: -h.score)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("min_len", [0, 2, 5])
def test_wide_beam_is_exhaustive(seed: int, alpha: float, min_len: int) -> None:
    """A beam wider than the tree explores everything: its n-best are the true n-best (min_len 5 > the limit 3:
    the limit wins, so only 3-token outputs remain, eos removed before it is forced)."""
    model = ScriptedModel(random_script(seed, TOKENS), vocab_size=SMALL_VOCAB)
    source = [4, 5]
    [hyps] = beam_search(model, make_src([source]), beam_size=40, nbest=5, length_penalty=alpha,
                         max_len_a=0.0, max_len_b=3, min_len=min_len)
    assert_same(hyps, exhaustive(model, source, 3, alpha, min_len)[:5])


# --------------------------------------------------------------------------------------------------------------------
# Equivalences on the stub
# --------------------------------------------------------------------------------------------------------------------

SOURCES = [[4, 5, 6, 7, 8], [9], [10, 11, 12], [4, 4], [13, 14, 15, 16, 17, 18, 19]]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("min_len", [0, 3])
def test_beam_size_one_equals_greedy(seed: int, min_len: int) -> None:
    model = ScriptedModel(random_script(seed, list(range(4, 12)), eos_bias=0.3))
    src = make_src(SOURCES)
    greedy_hyps = greedy_search(model, src, max_len_a=1.0, max_len_b=3, length_penalty=0.6, min_len=min_len)
    beam_hyps = beam_search(model, src, beam_size=1, length_penalty=0.6, max_len_a=1.0, max_len_b=3, min_len=min_len)
    assert [[h] for h in greedy_hyps] == beam_hyps  # exactly, scores included


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("min_len", [0, 8])
def test_batch_equals_one_by_one(beam_size: int, min_len: int) -> None:
    """min_len 8 lies between the sentences' limits (9, 5, 7, 6, 11): it binds two sentences, the limit the others,
    and rows leave the batch while it still binds."""
    model = ScriptedModel(random_script(7, list(range(4, 12)), eos_bias=0.3))
    kw = dict(beam_size=beam_size, nbest=beam_size, length_penalty=0.6, max_len_a=1.0, max_len_b=3, min_len=min_len)
    batched = beam_search(model, make_src(SOURCES), **kw)
    for source, hyps in zip(SOURCES, batched):
        assert_same(hyps, beam_search(model, make_src([source]), **kw)[0])
    gkw = dict(max_len_a=1.0, max_len_b=3, min_len=min_len)
    greedy_batched = greedy_search(model, make_src(SOURCES), **gkw)
    for source, hyp in zip(SOURCES, greedy_batched):
        assert_same([hyp], greedy_search(model, make_src([source]), **gkw))


@pytest.mark.parametrize("min_len", [0, 2])
def test_full_prefix_recomputation_matches_cache_on_stub(min_len: int) -> None:
    model = ScriptedModel(random_script(3, list(range(4, 12)), eos_bias=0.3))
    src = make_src(SOURCES)
    kw = dict(beam_size=3, nbest=2, length_penalty=0.6, max_len_a=1.0, max_len_b=3, min_len=min_len)
    assert beam_search(model, src, **kw) == beam_search(model, src, full_prefix=True, **kw)
    assert greedy_search(model, src, max_len_a=1.0, max_len_b=3, min_len=min_len) == greedy_search(
        model, src, max_len_a=1.0, max_len_b=3, min_len=min_len, full_prefix=True
    )
    assert model.forward_calls > 0


def test_empty_batch() -> None:
    model = ScriptedModel(table_script({}))
    src = torch.zeros(0, 3, dtype=torch.long)
    assert greedy_search(model, src, max_len_a=1.0, max_len_b=3) == []
    assert beam_search(model, src, beam_size=2, length_penalty=0.6, max_len_a=1.0, max_len_b=3) == []


def test_invalid_beam_arguments() -> None:
    model = ScriptedModel(table_script({}))
    with pytest.raises(ValueError):
        beam_search(model, make_src([[4]]), beam_size=2, nbest=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


# --------------------------------------------------------------------------------------------------------------------
# A real (tiny, random) Transformer: cached decoding == recomputing the prefix; batch == one by one
# --------------------------------------------------------------------------------------------------------------------

# every scheme of model.positions (the config's choices, so that a new scheme is tested here without a new line)
POSITION_MODES = list(typing.get_args(typing.get_type_hints(ModelConfig)["positions"]))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models are latency-bound: with several intra-op threads on a busy 2-core machine each small op can
    wait ~10 ms for a core (60x slower here), so these tests run single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class EosBiased:
    """Protocol wrapper adding ``bias`` to the eos logit, so a random model stops at varied lengths instead of
    always running to the limit (which would leave early finishing and batch compaction untested)."""

    def __init__(self, model, bias: float) -> None:
        self.model, self.bias = model, bias
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id
        self.vocab_size, self.max_positions = model.vocab_size, model.max_positions

    def _biased(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., self.eos_id] += self.bias
        return logits

    def encode(self, src):
        return self.model.encode(src)

    def init_decoder_state(self, enc):
        return self.model.init_decoder_state(enc)

    def decode_step(self, tokens, enc, state):
        return self._biased(self.model.decode_step(tokens, enc, state))

    def forward(self, src, tgt_in):
        return self._biased(self.model.forward(src, tgt_in))


def tiny_model(positions: str, seed: int = 0, eos_bias: float = 0.0, norm: str = "post"):
    from rpr_mt.model.transformer import Seq2Seq

    torch.manual_seed(seed)
    config = ModelConfig(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, ff_dim=64, dropout=0.0,
                         positions=positions, max_positions=64, clip=3, norm=norm)
    config.t5.num_buckets, config.t5.max_distance, config.xl.clip = 8, 6, 4  # so that short inputs reach every bucket
    model = Seq2Seq(config, vocab_size=40, pad_id=0, bos_id=2, eos_id=3).eval()
    with torch.no_grad():  # position parameters that start at zero (T5 tables, XL's u and v) must matter here
        for name, param in model.named_parameters():
            if "positions." in name:
                param.normal_(0.0, 0.5)
    return EosBiased(model, eos_bias) if eos_bias else model


def random_sources(seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [7, 2, 5, 11, 1]
    return [torch.randint(4, 40, (n,), generator=gen).tolist() for n in lengths]


# eos_bias 0: outputs mostly run to the length limit; 1.0: they stop at varied lengths.
@pytest.mark.parametrize("eos_bias", [0.0, 1.0])
@pytest.mark.parametrize("positions, norm", [(p, "post") for p in POSITION_MODES]
                         + [("relative", "pre"), ("absolute", "pre")])
def test_real_model_cached_equals_full_prefix(positions: str, norm: str, eos_bias: float) -> None:
    model = tiny_model(positions, eos_bias=eos_bias, norm=norm)
    src = make_src(random_sources())
    kw = dict(max_len_a=1.0, max_len_b=4)
    assert_same(greedy_search(model, src, **kw), greedy_search(model, src, full_prefix=True, **kw), tol=1e-4)
    bkw = dict(beam_size=4, nbest=2, length_penalty=0.6, **kw)
    for cached, full in zip(beam_search(model, src, **bkw), beam_search(model, src, full_prefix=True, **bkw)):
        assert_same(cached, full, tol=1e-4)


@pytest.mark.parametrize("eos_bias", [0.0, 1.0])
@pytest.mark.parametrize("positions", POSITION_MODES)
def test_real_model_batch_equals_one_by_one(positions: str, eos_bias: float) -> None:
    model = tiny_model(positions, seed=1, eos_bias=eos_bias)
    sources = random_sources(1)
    kw = dict(beam_size=4, nbest=2, length_penalty=0.6, max_len_a=1.0, max_len_b=4)
    for source, hyps in zip(sources, beam_search(model, make_src(sources), **kw)):
        assert_same(hyps, beam_search(model, make_src([source]), **kw)[0], tol=1e-4)
    for source, hyp in zip(sources, greedy_search(model, make_src(sources), max_len_a=1.0, max_len_b=4)):
        assert_same([hyp], greedy_search(model, make_src([source]), max_len_a=1.0, max_len_b=4), tol=1e-4)


@pytest.mark.parametrize("eos_bias", [0.0, 1.0])
@pytest.mark.parametrize("positions", ["relative", "absolute"])
def test_real_model_beam_one_equals_greedy(positions: str, eos_bias: float) -> None:
    model = tiny_model(positions, seed=2, eos_bias=eos_bias)
    src = make_src(random_sources(2))
    greedy_hyps = greedy_search(model, src, max_len_a=1.0, max_len_b=4, length_penalty=0.6)
    beam_hyps = beam_search(model, src, beam_size=1, length_penalty=0.6, max_len_a=1.0, max_len_b=4)
    assert_same(greedy_hyps, [b[0] for b in beam_hyps], tol=1e-5)


def test_encoder_output_moves_only_when_a_sentence_is_dropped(monkeypatch) -> None:
    """Back-pointers stay within a sentence's beam, where the encoder output and cross-attention caches are equal:
    those are reordered only on the steps that drop a finished sentence (the results are checked above)."""
    from . import StubEncoderOutput, StubState

    calls = {"enc": 0, "state": 0, "cross": 0}
    enc_reorder, state_reorder = StubEncoderOutput.reorder, StubState.reorder

    def count_enc(self, index):
        calls["enc"] += 1
        return enc_reorder(self, index)

    def count_state(self, index, cross=True):
        calls["state"] += 1
        calls["cross"] += cross
        return state_reorder(self, index, cross)

    monkeypatch.setattr(StubEncoderOutput, "reorder", count_enc)
    monkeypatch.setattr(StubState, "reorder", count_state)
    model = ScriptedModel(random_script(7, list(range(4, 12)), eos_bias=0.3))
    hyps = beam_search(model, make_src(SOURCES), beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)
    assert len(hyps) == len(SOURCES)
    # one reorder to expand the batch to beams, then one per sentence-dropping step (fewer than the sentences)
    assert calls["state"] > calls["cross"] and 1 <= calls["enc"] - 1 == calls["cross"] < len(SOURCES)


def test_the_source_mask_is_decided_and_prepared_once_per_encode(monkeypatch) -> None:
    """bool(src_mask.all()) waits for the GPU: the encoder decided it, and then the cross-attention mask asked again
    in every forward pass of training and at every step of decoding; and every layer prepared the same mask again
    (three small kernels each on a GPU). Now encode decides and prepares once and EncoderOutput carries the mask
    (kept by reorder), with the same outputs."""
    model = tiny_model("relative")
    src = make_src(random_sources())  # padded: the lengths differ
    expected = beam_search(model, src, beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4)
    asked = []
    original = torch.Tensor.all

    def counting_all(self, *args, **kwargs):
        if self.dtype == torch.bool and self.dim() == 2 and not args and not kwargs:
            asked.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "all", counting_all)
    import rpr_mt.model.kernels.dispatch as dispatch
    import rpr_mt.model.masks as masks

    revived = []
    for module in (dispatch, masks):  # prepare_mask (masks) and a boolean mask's own preparation (dispatch)
        monkeypatch.setattr(module, "revive_dead_rows", lambda m, f=masks.revive_dead_rows: revived.append(1) or f(m))
    again = beam_search(model, src, beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4)
    for got, want in zip(again, expected):
        assert_same(got, want, tol=0.0)
    assert asked == [tuple(src.shape)] and len(revived) == 1  # the key-padding mask, prepared once for every layer
    asked.clear()
    revived.clear()
    model(src, src[:, :3])  # a training forward pass: encoder and cross-attention masks from one question
    assert asked == [tuple(src.shape)] and len(revived) == 1  # the causal mask is live by construction
    enc = model.encode(src)
    assert enc.padded and enc.reorder(torch.tensor([1])).padded
    assert not model.encode(src[:1, :1]).padded  # one token, nothing padded: no mask, attention's fast path
