"""Position parameters that training never changed.

A learned position table has a row per absolute position (``absolute_kind: learned``), per clipped distance (Shaw)
or per distance bucket (T5). A row receives a gradient only if some training input reached it, so a model trained on
inputs of at most n pieces keeps every row past them at its initial value (Adam does not move a parameter whose
gradient has always been zero, and AdamW's decay leaves position tables out: ``train.optimizer.decays``), and on a
longer input it meets those rows untrained. Shaw's clipping at k <= n is what rules this out: every distance beyond
k shares the row of k.

``untrained_positions`` rebuilds a run's initial model (``initial_model``: same config, same seed) and lists, per
table, the positions or distances whose row is bit-identical in the trained checkpoint. Parameter-free schemes
(sinusoidal, ALiBi, RoPE; Transformer-XL's R is sinusoids through a learned projection) have no such rows: they
evaluate their functions at unseen positions instead, which this cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rpr_mt.errors import UserError

__all__ = ["UntrainedRows", "untrained_positions", "untrained_rows", "render_untrained", "spans"]


@dataclass(frozen=True)
class UntrainedRows:
    """One position table of a model and the keys (positions, or key - query distances) met only in unchanged rows."""

    parameter: str  # state-dict name
    table: str  # its short name: rel_k, rel_v, learned, table, encoder_table, decoder_table
    stack: str  # "encoder", "decoder" or "both" (absolute positions: one table for both embeddings)
    key: str  # "position" or "distance"
    untrained: tuple[int, ...]  # sorted; the decoder's distances stop at 0 (its causal mask hides the others)


class _Table(NamedTuple):
    parameter: str
    stack: str
    key: str
    keys: Tensor  # every position, or every key - query distance, below model.max_positions
    rows: Tensor  # the row of each key
    axis: int  # the row axis of the parameter
    unreachable: Tensor  # rows no input can reach: if the rebuilt start is right, they are unchanged


def _tables(model: nn.Module) -> list[_Table]:
    """The learned position tables of ``model``."""
    from rpr_mt.model.positions.absolute import AbsoluteEncoding
    from rpr_mt.model.positions.shaw import ShawTables
    from rpr_mt.model.positions.t5 import T5Bias, T5Positions, t5_relative_bucket

    length = model.max_positions
    distances = {"encoder": torch.arange(-(length - 1), length), "decoder": torch.arange(-(length - 1), 1)}
    none = torch.zeros(0, dtype=torch.long)

    def t5(parameter: str, stack: str, num_buckets: int, max_distance: int) -> _Table:
        rows = t5_relative_bucket(distances[stack], stack == "encoder", num_buckets, max_distance)
        # two-sided buckets: the first of the right half would be distance +0, which is in the left half
        unreachable = torch.tensor([num_buckets // 2]) if stack == "encoder" else none
        return _Table(parameter, stack, "distance", distances[stack], rows, 0, unreachable)

    tables = []
    for name, module in model.named_modules():
        stack = "encoder" if name.startswith("encoder") else "decoder"
        if isinstance(module, AbsoluteEncoding) and module.learned is not None:
            positions = torch.arange(length)
            tables.append(_Table(f"{name}.learned.weight", "both", "position", positions, positions, 0, none))
        elif isinstance(module, ShawTables):
            k = module.clip
            rows = distances[stack].clamp(-k, k) + k
            # the decoder's rows of distances 1 .. k-1 are masked out everywhere (row 2k, distances >= k, is left
            # out: the fused kernel gives it the row total's rounding error)
            unreachable = torch.arange(k + 1, 2 * k) if stack == "decoder" else none
            for leaf in ("rel_k", "rel_v"):
                table = getattr(module, leaf)
                if table is not None:
                    tables.append(_Table(f"{name}.{leaf}", stack, "distance", distances[stack], rows,
                                         table.dim() - 2, unreachable))
        elif isinstance(module, T5Bias) and module.table is not None:  # per-layer tables
            tables.append(t5(f"{name}.table.weight", stack, module.num_buckets, module.max_distance))
        elif isinstance(module, T5Positions):  # one table per stack
            for stack_name, table in (("encoder", module.encoder_table), ("decoder", module.decoder_table)):
                if table is not None:
                    s = module.settings
                    tables.append(t5(f"{name}.{stack_name}_table.weight", stack_name, s.num_buckets, s.max_distance))
    return tables


def untrained_rows(trained: nn.Module, initial: nn.Module) -> list[UntrainedRows]:
    """Each learned position table of ``trained`` with the keys whose row equals the one in ``initial`` bit for bit
    (in every head).

    Rows that no input can reach (the decoder's future distances in Shaw tables, the unused bucket of two-sided T5
    tables) must be unchanged; if one is not, ``initial`` is not where ``trained`` started, and every row would
    look trained, so this raises. A model without such rows (learned absolute positions alone) cannot be checked."""
    before = dict(initial.named_parameters())
    after = dict(trained.named_parameters())
    found = []
    for t in _tables(trained):
        if t.parameter not in before:
            raise UserError(f"{t.parameter} is not a parameter of the rebuilt initial model")
        same = after[t.parameter].detach().cpu() == before[t.parameter].detach().cpu()
        same = same.movedim(t.axis, 0).flatten(1).all(dim=1)  # [rows]: unchanged in every head and component
        if not bool(same[t.unreachable].all()):
            raise UserError(f"the rebuilt initial model is not where this run started: rows of {t.parameter} that "
                            "no input reaches have changed (trained with other code, or from a checkpoint?)")
        short = t.parameter.rsplit(".", 2)[-2] if t.parameter.endswith(".weight") else t.parameter.rsplit(".", 1)[-1]
        found.append(UntrainedRows(t.parameter, short, t.stack, t.key, tuple(t.keys[same[t.rows]].tolist())))
    return found


def untrained_positions(run_dir: str | Path, which: str = "last") -> list[UntrainedRows]:
    """The learned position tables of the run in ``run_dir`` (its ``which`` checkpoint) against its initial model,
    rebuilt with ``initial_model`` (torch's global generator is left as it was)."""
    from rpr_mt.checkpoint_files import load_for_inference
    from rpr_mt.train.trainer import initial_model

    loaded = load_for_inference(run_dir, which)
    model, config, vocab, path = loaded.model, loaded.config, loaded.vocab, loaded.checkpoint
    if config.train.init_from is not None:
        raise UserError(f"{path} was trained from train.init_from={config.train.init_from}, not from a seeded "
                        "start: its initial model cannot be rebuilt")
    with torch.random.fork_rng(devices=[]):
        initial = initial_model(config, vocab)
    return untrained_rows(model, initial)


def spans(values: tuple[int, ...] | list[int]) -> str:
    """Sorted integers as ranges: (-3, -2, -1, 5, 7, 8) -> "-3..-1, 5, 7..8"; none -> "none"."""
    if not values:
        return "none"
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def render_untrained(runs: dict[str, list[UntrainedRows]]) -> str:
    """Markdown, one row per run and group of tables with the same untrained keys (e.g. rel_k and rel_v of every
    encoder layer)."""
    lines = ["| run | tables | untrained at |", "|---|---|---|"]
    for run, tables in runs.items():
        groups: dict[tuple[str, str, tuple[int, ...]], list[str]] = {}
        for t in tables:
            groups.setdefault((t.stack, t.key, t.untrained), []).append(t.table)
        if not groups:
            lines.append(f"| {run} | no learned position table | - |")
        for (stack, key, untrained), names in groups.items():
            leaves = sorted(set(names))
            lines.append(f"| {run} | {stack}: {', '.join(leaves)} ({len(names)} table{'s' * (len(names) > 1)}) "
                         f"| {key}s {spans(untrained)} |")
    return "\n".join(lines) + "\n"
