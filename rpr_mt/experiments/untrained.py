"""Position parameters that training never changed.

A learned position table has a row per absolute position (``absolute_kind: learned``), per clipped distance (Shaw)
or per distance bucket (T5). A row receives a gradient only if some training input reached it, so a model trained on
inputs of at most n pieces keeps every row past them at its initial value (under Adam without weight decay, as
the study trains, a row without gradient does not move at all; weight decay would shrink it, and then this module
finds nothing), and on a longer input it meets those rows untrained. Shaw's clipping at
k <= n is what rules this out: every distance beyond k shares the row of k.

``untrained_positions`` rebuilds a run's initial model (``initial_model``: same config, same seed) and lists, per
table, the positions or distances whose row is bit-identical in the trained checkpoint. Parameter-free schemes
(sinusoidal, ALiBi, RoPE; Transformer-XL's R is sinusoids through a learned projection) have no such rows: they
evaluate their functions at unseen positions instead, which this cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["UntrainedRows", "untrained_positions", "untrained_rows", "render_untrained", "spans"]


@dataclass(frozen=True)
class UntrainedRows:
    """One position table of a model and the keys (positions, or key - query distances) met only in unchanged rows."""

    parameter: str  # state-dict name
    stack: str  # "encoder", "decoder" or "both" (absolute positions: one table for both embeddings)
    key: str  # "position" or "distance"
    untrained: tuple[int, ...]  # sorted; the decoder's distances stop at 0 (its causal mask hides the others)


def _tables(model: nn.Module) -> list[tuple[str, str, str, Tensor, Tensor, int]]:
    """(parameter name, stack, key kind, keys, row of each key, row axis) for each learned position table of
    ``model``; the keys are every position, or every distance between two positions, below model.max_positions."""
    from rpr_mt.model.positions.absolute import AbsoluteEncoding
    from rpr_mt.model.positions.shaw import ShawTables
    from rpr_mt.model.positions.t5 import T5Bias, T5Positions, t5_relative_bucket

    length = model.max_positions
    both = torch.arange(-(length - 1), length)  # key - query, every pair of positions < max_positions
    look_back = torch.arange(-(length - 1), 1)
    tables = []
    for name, module in model.named_modules():
        stack = "encoder" if name.startswith("encoder") else "decoder"
        distances = both if stack == "encoder" else look_back
        if isinstance(module, AbsoluteEncoding) and module.learned is not None:
            positions = torch.arange(length)
            tables.append((f"{name}.learned.weight", "both", "position", positions, positions, 0))
        elif isinstance(module, ShawTables):
            for leaf in ("rel_k", "rel_v"):
                table = getattr(module, leaf)
                if table is not None:
                    rows = distances.clamp(-module.clip, module.clip) + module.clip
                    tables.append((f"{name}.{leaf}", stack, "distance", distances, rows, table.dim() - 2))
        elif isinstance(module, T5Bias) and module.table is not None:  # per-layer tables
            rows = t5_relative_bucket(distances, module.bidirectional, module.num_buckets, module.max_distance)
            tables.append((f"{name}.table.weight", stack, "distance", distances, rows, 0))
        elif isinstance(module, T5Positions):  # one table per stack
            for stack_name, table in (("encoder", module.encoder_table), ("decoder", module.decoder_table)):
                if table is not None:
                    s = module.settings
                    keys = both if stack_name == "encoder" else look_back
                    rows = t5_relative_bucket(keys, stack_name == "encoder", s.num_buckets, s.max_distance)
                    tables.append((f"{name}.{stack_name}_table.weight", stack_name, "distance", keys, rows, 0))
    return tables


def untrained_rows(trained: nn.Module, initial: nn.Module) -> list[UntrainedRows]:
    """Each learned position table of ``trained`` with the keys whose row equals the one in ``initial`` bit for bit
    (in every head)."""
    before = dict(initial.named_parameters())
    after = dict(trained.named_parameters())
    found = []
    for name, stack, key, keys, rows, axis in _tables(trained):
        if name not in after or name not in before:
            raise KeyError(f"{name} is not a parameter of both models")
        same = after[name].detach().cpu() == before[name].detach().cpu()
        same = same.movedim(axis, 0).flatten(1).all(dim=1)  # [rows]: unchanged in every head and component
        untrained = tuple(keys[same[rows]].tolist())
        found.append(UntrainedRows(name, stack, key, untrained))
    return found


def untrained_positions(run_dir: str | Path, which: str = "last") -> list[UntrainedRows]:
    """The learned position tables of the run in ``run_dir`` (its ``which`` checkpoint: the last by default, since
    an average of equal values need not round back to them) against its initial model."""
    from rpr_mt.train.checkpoint import load_for_inference
    from rpr_mt.train.trainer import initial_model

    model, config, vocab, _ = load_for_inference(run_dir, which)
    return untrained_rows(model, initial_model(config, vocab))


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
            groups.setdefault((t.stack, t.key, t.untrained), []).append(t.parameter)
        if not groups:
            lines.append(f"| {run} | no learned position table | - |")
        for (stack, key, untrained), names in groups.items():
            leaves = sorted({n.rsplit(".", 1)[-1] if "rel_" in n else n.split(".")[-2] for n in names})
            lines.append(f"| {run} | {stack}: {', '.join(leaves)} ({len(names)} table{'s' * (len(names) > 1)}) "
                         f"| {key}s {spans(untrained)} |")
    return "\n".join(lines) + "\n"
