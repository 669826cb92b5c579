"""Greedy and beam search against the narrow ``Seq2Seq`` decoding protocol.

The model is only used through::

    model.pad_id, model.bos_id, model.eos_id, model.max_positions
    model.encode(src) -> enc                     enc.reorder(index) -> enc   (index_select along the batch)
    model.init_decoder_state(enc) -> state       state.reorder(index, cross)  (in place; may shrink the batch;
                                                 cross=False keeps the cross-attention caches as they are)
    model.decode_step(tokens[B, n], enc, state) -> logits[B, n, V]   (appends to the cache in ``state``)
    model.forward(src, tgt_in) -> logits[B, T, V]                    (only with ``full_prefix=True``)

so both searches can be unit-tested with stub models whose probabilities are scripted.

Conventions shared by both searches
-----------------------------------
* Output length limit per sentence: ``floor(a * |x| + b)`` tokens *before* eos, where ``|x|`` is the number of
  non-pad source tokens (the source's eos included, as in fairseq), capped by ``model.max_positions - 1`` (the
  decoder input ``bos + tokens`` must fit the model) and by ``max_len`` when given. At the limit eos is forced (its
  real log-probability is kept).
* Minimum length ``min_len``: eos may not be generated before ``min_len`` tokens (the length limit wins where it is
  shorter). As in CTranslate2, eos's logit is removed before the softmax, so those steps' log-probabilities are the
  model's distribution given that the output goes on. ``min_len=1`` (``decode.min_length``'s default, and fairseq's
  and CTranslate2's) rules out the empty translation that beam search otherwise finds for some sources: a short
  output's small loss can beat every real translation even after length normalisation (Stahlberg & Byrne 2019).
* pad and bos are never generated.
* Scores use the GNMT / tensor2tensor length penalty: ``score = logprob / ((5 + |Y|) / 6) ** alpha`` with
  ``|Y|`` counting eos (``gnmt_length_penalty`` below); ``logprob`` is the sum of the token log-probabilities,
  eos included.
* Sentences of a batch are independent: a batch gives the same result as each sentence alone. Sentences that
  finish are dropped from the batch (their cache rows with them), so a batch costs what its open rows cost.
* ``full_prefix=True`` recomputes the whole prefix with ``model.forward`` at every step instead of using the
  incremental cache: the reference for equivalence tests and the baseline for the decoding benchmark.

Beam search stopping rule
-------------------------
At each step the ``2k`` best extensions (by cumulative log-probability) of the ``k`` open hypotheses are ranked.
Extensions ending in eos that rank within the top ``k`` become finished hypotheses (fairseq's rule: only what was
really in the beam finishes); the ``k`` best non-eos extensions stay open, so the beam never shrinks. A sentence is
done when

1. it has ``k`` finished hypotheses (fairseq's ``early_stopping``), or
2. its best open hypothesis can no longer beat its ``nbest``-th best finished one, even in the best case that it
   ends now or at the length limit without losing more probability (tensor2tensor's bound, generalised from the
   1-best to the n-best), or
3. its length limit is reached (eos forced on every open hypothesis).

Rule 2 never changes the result of rule 1 (nothing it cuts off could enter the top ``nbest``); it only stops
sooner. Beam size 1 is exactly greedy search: the argmax extension either finishes (one finished = ``k``) or
continues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor


@dataclass
class Hypothesis:
    """One translation of one source sentence."""

    tokens: list[int]  # output ids, without bos and eos
    score: float  # logprob / gnmt_length_penalty(len(tokens) + 1, alpha)
    logprob: float  # sum of the token log-probabilities, eos included


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14); ``length`` counts eos."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(
    src: Tensor,
    pad_id: int,
    *,
    max_len_a: float,
    max_len_b: int,
    max_positions: int,
    max_len: Optional[int] = None,
) -> list[int]:
    """Per-sentence limit on output tokens before eos: ``floor(a * |x| + b)``, capped (see the module docstring)."""
    src_lengths = (src != pad_id).sum(dim=1).tolist()  # [B], eos included
    cap = max_positions - 1 if max_len is None else min(max_len, max_positions - 1)
    return [max(0, min(int(max_len_a * n + max_len_b), cap)) for n in src_lengths]


class _Decoder:
    """Next-token log-probabilities for rows of partial outputs, with the incremental cache or by recomputation."""

    def __init__(self, model: Any, src: Tensor, enc: Any, full_prefix: bool) -> None:
        self.model = model
        self.full_prefix = full_prefix
        self.src = src  # [N, S]; only needed when recomputing with model.forward
        self.enc = enc
        self.state = None if full_prefix else model.init_decoder_state(enc)

    def step(self, prefix: Tensor, no_eos: Optional[Tensor] = None) -> Tensor:
        """``prefix`` [N, t] = bos + the tokens so far; returns log-probabilities of token t+1, [N, V] float32.
        Rows where ``no_eos`` [N] is True get the distribution without eos (its logit removed before the softmax)."""
        if self.full_prefix:
            logits = self.model.forward(self.src, prefix)[:, -1]  # [N, V]
        else:
            logits = self.model.decode_step(prefix[:, -1:], self.enc, self.state)[:, -1]  # [N, V]
        logits = logits.float()
        if no_eos is not None and bool(no_eos.any()):
            logits = logits.clone()  # the model's own output may be a view of its cache
            logits[no_eos, self.model.eos_id] = -math.inf
        lprobs = logits.log_softmax(dim=-1)
        # Never generate pad or bos.
        lprobs[:, self.model.pad_id] = -math.inf
        lprobs[:, self.model.bos_id] = -math.inf
        return lprobs

    def select(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep rows ``index`` (in that order): beam back-pointers, and dropping finished sentences.

        ``same_sources``: every row keeps a row of the same source (back-pointers within each sentence's beam, no
        sentence dropped). The encoder output and the cross-attention caches are equal on those rows, so only the
        target-side caches move; copying the rest every step cost ~15% of beam search's time."""
        if self.full_prefix:
            if not same_sources:
                self.src = self.src.index_select(0, index)
        else:
            if not same_sources:
                self.enc = self.enc.reorder(index)
            self.state.reorder(index, cross=not same_sources)


def _force_eos(lprobs: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """Rows where ``rows`` is True may only emit eos (keeping eos's own log-probability). In place on those rows
    only (most steps have none: a pass over [N, V] every step cost ~7% of beam search). [N, V] -> [N, V]."""
    at_limit = rows.nonzero().squeeze(1)
    if at_limit.numel():
        eos = lprobs[at_limit, eos_id]
        lprobs[at_limit] = -math.inf
        lprobs[at_limit, eos_id] = eos
    return lprobs


@torch.inference_mode()
def greedy_search(
    model: Any,
    src: Tensor,
    *,
    max_len_a: float,
    max_len_b: int,
    max_len: Optional[int] = None,
    min_len: int = 0,
    length_penalty: float = 0.6,
    full_prefix: bool = False,
) -> list[Hypothesis]:
    """Most probable next token at every step; one ``Hypothesis`` per row of ``src`` [B, S] (padded with pad_id).

    ``length_penalty`` (alpha) only affects the reported ``score``, never the output. The model should be in
    eval mode (the caller's job).
    """
    batch = src.size(0)
    if batch == 0:
        return []
    device = src.device
    limits = torch.tensor(
        max_output_lengths(src, model.pad_id, max_len_a=max_len_a, max_len_b=max_len_b,
                           max_positions=model.max_positions, max_len=max_len),
        device=device,
    )  # [B]
    decoder = _Decoder(model, src, model.encode(src), full_prefix)
    active = torch.arange(batch, device=device)  # original row of each open row
    prefix = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=device)  # [N, t]
    logprob = torch.zeros(batch, device=device)  # [N]
    results: list[Optional[Hypothesis]] = [None] * batch

    for t in range(int(limits.max()) + 1):
        lprobs = decoder.step(prefix, limits[active] > t if t < min_len else None)  # [N, V]
        lprobs = _force_eos(lprobs, limits[active] == t, model.eos_id)
        token_lprob, token = lprobs.max(dim=1)  # [N], [N]
        logprob = logprob + token_lprob
        prefix = torch.cat([prefix, token.unsqueeze(1)], dim=1)  # [N, t+1]

        done = token == model.eos_id  # [N]
        if bool(done.any()):
            for row in done.nonzero().squeeze(1).tolist():
                lp = float(logprob[row])
                score = lp / gnmt_length_penalty(t + 1, length_penalty)
                results[int(active[row])] = Hypothesis(tokens=prefix[row, 1:-1].tolist(), score=score, logprob=lp)
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            active, prefix, logprob = active[keep], prefix[keep], logprob[keep]
            decoder.select(keep)

    assert all(r is not None for r in results), "eos is forced at the length limit"
    return results  # type: ignore[return-value]


@torch.inference_mode()
def beam_search(
    model: Any,
    src: Tensor,
    *,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    nbest: int = 1,
    max_len: Optional[int] = None,
    min_len: int = 0,
    full_prefix: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search; for each row of ``src`` [B, S], its ``nbest`` best finished hypotheses, best first.

    See the module docstring for the stopping rule. Fewer than ``nbest`` come back only when the vocabulary is too
    small to fill the beam. The model should be in eval mode (the caller's job).
    """
    if beam_size < 1 or not 1 <= nbest <= beam_size:
        raise ValueError(f"need beam_size >= 1 and 1 <= nbest <= beam_size (got {beam_size}, {nbest})")
    batch, k = src.size(0), beam_size
    if batch == 0:
        return []
    device = src.device
    limits = max_output_lengths(src, model.pad_id, max_len_a=max_len_a, max_len_b=max_len_b,
                                max_positions=model.max_positions, max_len=max_len)
    limits_t = torch.tensor(limits, device=device)  # [B]

    # Flatten to B*k rows: row i*k + j is hypothesis j of sentence i.
    expand = torch.arange(batch, device=device).repeat_interleave(k)  # [B*k]
    enc = model.encode(src).reorder(expand)
    decoder = _Decoder(model, src.index_select(0, expand), enc, full_prefix)

    active = torch.arange(batch, device=device)  # original sentence of each open sentence, [n]
    prefix = torch.full((batch * k, 1), model.bos_id, dtype=torch.long, device=device)  # [n*k, t]
    # Cumulative log-probability of each open hypothesis; at the start only one of the k rows is real.
    scores = torch.full((batch, k), -math.inf, device=device)  # [n, k]
    scores[:, 0] = 0.0
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for t in range(max(limits) + 1):
        n = active.numel()
        sentences = active.tolist()  # [n]
        no_eos = (limits_t[active] > t).repeat_interleave(k) if t < min_len else None  # [n*k]
        lprobs = decoder.step(prefix, no_eos)  # [n*k, V]
        vocab = lprobs.size(1)
        at_limit = (limits_t[active] == t).repeat_interleave(k)  # [n*k]
        lprobs = _force_eos(lprobs, at_limit, model.eos_id)

        candidates = (scores.unsqueeze(2) + lprobs.view(n, k, vocab)).view(n, k * vocab)  # [n, k*V]
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)  # [n, 2k], sorted
        top_beam = torch.div(top_index, vocab, rounding_mode="floor")  # [n, 2k] back-pointers
        top_token = top_index % vocab  # [n, 2k]
        is_eos = top_token == model.eos_id  # [n, 2k]

        # eos extensions ranked within the top k finish (dead rows at -inf never do).
        finishing = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])  # [n, k]
        if bool(finishing.any()):
            for i, j in finishing.nonzero().tolist():
                row = i * k + int(top_beam[i, j])
                lp = float(top_scores[i, j])
                score = lp / gnmt_length_penalty(t + 1, length_penalty)
                finished[sentences[i]].append(Hypothesis(tokens=prefix[row, 1:].tolist(), score=score, logprob=lp))

        # The k best non-eos extensions stay open (each row has at most one eos extension, so >= k exist among 2k).
        rank = torch.arange(top_scores.size(1), device=device) + is_eos.long() * top_scores.size(1)  # [n, 2k]
        keep_pos = rank.topk(k, dim=1, largest=False).indices  # [n, k], ascending = best first
        scores = top_scores.gather(1, keep_pos)  # [n, k]
        rows = torch.arange(n, device=device).unsqueeze(1) * k + top_beam.gather(1, keep_pos)  # [n, k]
        tokens = top_token.gather(1, keep_pos)  # [n, k]

        # Which sentences go on (see the module docstring).
        still_open = []
        best_open = scores[:, 0].tolist()  # [n]
        for i, sent in enumerate(sentences):
            done = t >= limits[sent] or len(finished[sent]) >= k or best_open[i] == -math.inf
            if not done and len(finished[sent]) >= nbest:
                # Best case for an open hypothesis: no further loss, and the most favourable final length
                # (t + 2 .. limit + 1, eos included; the penalty is monotone in the length).
                best_penalty = max(gnmt_length_penalty(t + 2, length_penalty),
                                   gnmt_length_penalty(limits[sent] + 1, length_penalty))
                nth_best = sorted((h.score for h in finished[sent]), reverse=True)[nbest - 1]
                done = best_open[i] / best_penalty <= nth_best
            if not done:
                still_open.append(i)
        if not still_open:
            break
        if len(still_open) < n:
            keep = torch.tensor(still_open, device=device)  # [n']
            active, scores, rows, tokens = active[keep], scores[keep], rows[keep], tokens[keep]

        # One reorder per step: back-pointers and dropped sentences together.
        rows = rows.view(-1)  # [n'*k]
        prefix = torch.cat([prefix.index_select(0, rows), tokens.view(-1, 1)], dim=1)  # [n'*k, t+2]
        decoder.select(rows, same_sources=len(still_open) == n)

    # Stable sort: among equal scores, the hypothesis that finished first wins.
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
