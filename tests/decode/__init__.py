"""Shared test doubles for the decoding tests: a stub ``Seq2Seq`` whose next-token probabilities are scripted.

The stub implements the decoding protocol (encode / init_decoder_state / decode_step / forward, ``reorder`` on the
encoder output and the decoder state) and checks how it is used: one ``[[bos]]`` first call, the cache length
advancing, encoder output and decoder state kept row-aligned by the search (each row reads *its* source from the
reordered encoder output, so a wrong reorder gives wrong outputs).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

PAD, UNK, BOS, EOS = 0, 1, 2, 3
WORDS = [chr(c) for c in range(ord("a"), ord("z") + 1)]  # ids 4.. : one letter = one token
ID = {"<pad>": PAD, "<unk>": UNK, "<s>": BOS, "</s>": EOS, **{w: 4 + i for i, w in enumerate(WORDS)}}
TOKEN = {i: w for w, i in ID.items()}
VOCAB_SIZE = len(ID)

# A script maps (source ids without pad and eos, output prefix ids) to {next id: probability}.
Script = Callable[[list[int], list[int]], dict[int, float]]


def ids(text: str) -> list[int]:
    return [ID[w] for w in text.split()]


def words(tokens: list[int]) -> str:
    return " ".join(TOKEN[t] for t in tokens)


@dataclass
class StubEncoderOutput:
    memory: Tensor  # [B, S, 1]: the source ids themselves, so decode_step can tell which sentence a row decodes
    src_mask: Tensor  # [B, S], True = real token

    def reorder(self, index: Tensor) -> "StubEncoderOutput":
        return StubEncoderOutput(self.memory.index_select(0, index), self.src_mask.index_select(0, index))


class StubState:
    def __init__(self, batch: int) -> None:
        self.prefixes: list[list[int]] = [[] for _ in range(batch)]  # tokens fed after bos, per row
        self.length = 0

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        self.prefixes = [list(self.prefixes[i]) for i in index.tolist()]


class ScriptedModel(torch.nn.Module):
    """Next-token log-probabilities come from ``script``; unlisted tokens get logit -30 (finite, negligible)."""

    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def __init__(self, script: Script, *, vocab_size: int = VOCAB_SIZE, max_positions: int = 64) -> None:
        super().__init__()
        self.script = script
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.step_widths: list[int] = []  # n of every decode_step call
        self.forward_calls = 0
        self.encoded_rows = 0

    def encode(self, src: Tensor) -> StubEncoderOutput:
        assert src.dim() == 2 and src.size(1) <= self.max_positions
        self.encoded_rows += src.size(0)
        mask = src != PAD
        assert bool((src.gather(1, mask.sum(1, keepdim=True) - 1) == EOS).all()), "sources end with eos"
        return StubEncoderOutput(src.float().unsqueeze(-1), mask)

    def init_decoder_state(self, enc: StubEncoderOutput) -> StubState:
        return StubState(enc.memory.size(0))

    def _logits(self, source: list[int], prefix: list[int]) -> Tensor:
        logits = torch.full((self.vocab_size,), -30.0)
        for token, p in self.script(source, prefix).items():
            logits[token] = math.log(p) if p > 0 else -math.inf
        return logits

    @staticmethod
    def _source(memory_row: Tensor) -> list[int]:
        return [int(x) for x in memory_row[:, 0].tolist() if int(x) not in (PAD, EOS)]

    def decode_step(self, tokens: Tensor, enc: StubEncoderOutput, state: StubState) -> Tensor:
        batch, n = tokens.shape
        assert enc.memory.size(0) == batch == len(state.prefixes), "encoder output, state and tokens row-aligned"
        assert state.length + n <= self.max_positions, "decoder input longer than max_positions"
        if state.length == 0:
            assert bool((tokens[:, 0] == BOS).all()), "the first call starts with bos"
        self.step_widths.append(n)
        out = torch.empty(batch, n, self.vocab_size)
        for b in range(batch):
            source = self._source(enc.memory[b])
            for j in range(n):
                if state.length + j > 0:
                    state.prefixes[b].append(int(tokens[b, j]))
                out[b, j] = self._logits(source, state.prefixes[b])
        state.length += n
        return out

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        self.forward_calls += 1
        assert bool((tgt_in[:, 0] == BOS).all())
        enc = self.encode(src)
        batch, length = tgt_in.shape
        out = torch.empty(batch, length, self.vocab_size)
        for b in range(batch):
            source = self._source(enc.memory[b])
            for t in range(length):
                out[b, t] = self._logits(source, tgt_in[b, 1 : t + 1].tolist())
        return out


def table_script(tables: dict[str, dict[str, dict[str, float]]], default: str = "q") -> Script:
    """``tables[source text][prefix text] = {next word: p}``; prefixes not listed continue with ``default`` (p=1),
    so unscripted paths never finish before the length limit."""
    parsed = {
        tuple(ids(src)): {tuple(ids(prefix)): {ID[w]: p for w, p in dist.items()} for prefix, dist in table.items()}
        for src, table in tables.items()
    }

    def script(source: list[int], prefix: list[int]) -> dict[int, float]:
        return parsed[tuple(source)].get(tuple(prefix), {ID[default]: 1.0})

    return script


def random_script(seed: int, tokens: list[int], eos_bias: float = 0.0) -> Script:
    """Deterministic pseudo-random distributions over ``tokens`` (+ eos) for every (source, prefix)."""

    def script(source: list[int], prefix: list[int]) -> dict[int, float]:
        rng = random.Random(f"{seed}|{source}|{prefix}")
        weights = [rng.random() ** 2 + 1e-3 for _ in tokens] + [rng.random() ** 2 + 1e-3 + eos_bias]
        total = sum(weights)
        return {t: w / total for t, w in zip(tokens + [EOS], weights)}

    return script


def copy_script(source: list[int], prefix: list[int]) -> dict[int, float]:
    """Copies the source (p=0.9 for the right token), then eos."""
    if len(prefix) < len(source):
        right = source[len(prefix)]
        other = ID["z"] if right != ID["z"] else ID["y"]
        return {right: 0.9, other: 0.05, EOS: 0.05}
    return {EOS: 0.9, ID["z"]: 0.1}


def make_src(sources: list[list[int]]) -> Tensor:
    """Pad id lists (eos appended) into [B, S]."""
    width = max(len(s) for s in sources) + 1
    src = torch.full((len(sources), width), PAD, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS])
    return src
