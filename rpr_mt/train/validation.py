"""Validation during training: dev loss and perplexity, dev BLEU, their record and report line, and the early-stopping
state shared by the ranks (the trainer's ``Trainer.validate`` puts them together)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from rpr_mt.config import Config, is_pretokenized
from rpr_mt.data.vocab import Vocab
from rpr_mt.model.transformer import Seq2Seq
from rpr_mt.train.batching import collate, make_batches, usable_examples
from rpr_mt.train.context import RunData
from rpr_mt.train.device import autocast
from rpr_mt.train.distributed import Distributed
from rpr_mt.train.loss import TranslationLoss
from rpr_mt.train.state import TrainState


def evaluate_loss(model: Seq2Seq, data, indices: np.ndarray, cfg: Config, device: torch.device) -> tuple[float, int]:
    """Mean per-token NLL (no smoothing) of ``data`` rows ``indices``; returns (nll, tokens)."""
    loss_module = TranslationLoss(model, 0.0)
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode(), autocast(device, cfg.train.precision):
        for rows in make_batches(data, indices, cfg.train.max_tokens, seed=0, epoch=0, shuffle=False):
            batch = collate(data, rows, model.pad_id, model.bos_id, model.eos_id).to(device)
            _, nll = loss_module(batch.src, batch.tgt_in, batch.tgt_out)
            total += float(nll)
            tokens += batch.global_tgt_tokens
    model.train(was_training)
    return total / max(tokens, 1), tokens


def dev_bleu(
    model: Seq2Seq, vocab: Vocab, data_dir: Path, cfg: Config, device: torch.device
) -> tuple[float, float | None, int] | None:
    """sacreBLEU of the first ``valid_max_sentences`` dev lines, decoded with ``valid_beam_size``, the 1st
    percentile of their output/source length ratio in pieces (``length_ratio_floor``: translate warns when many
    outputs fall below it), and how many lines were scored (fewer than the cap on a small dev set). On Multi30k's
    tokenized text (``data.multi30k_text: tok``) the BLEU is the literature's, on the text as it is (sacreBLEU's
    tokenizer would split it again and warn at every validation)."""
    from sacrebleu.metrics import BLEU

    from rpr_mt.decode.translate import translate_lines
    from rpr_mt.lines import read_lines

    src_path = data_dir / f"dev.{cfg.data.src_lang}"
    ref_path = data_dir / f"dev.{cfg.data.tgt_lang}"
    if not src_path.is_file() or not ref_path.is_file():
        return None
    n = cfg.train.valid_max_sentences
    sources, references = read_lines(src_path)[:n], read_lines(ref_path)[:n]
    decode = dataclasses.replace(cfg.decode, beam_size=cfg.train.valid_beam_size, nbest=1)
    hypotheses = translate_lines(model, vocab, sources, decode=decode, device=device, progress=False,
                                 src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang, min_length_ratio=0.0)
    metric = BLEU(tokenize="none", smooth_method="none", force=True) if is_pretokenized(cfg.data) else BLEU()
    bleu = float(metric.corpus_score(hypotheses, [references]).score)
    return bleu, length_ratio_floor(sources, hypotheses, vocab.encode), len(sources)


def length_ratio_floor(sources: list[str], hypotheses: list[str], encode: Callable[[str], list[int]]) -> float | None:
    """The 1st percentile of output pieces / source pieces over the non-empty sources (None if there are none)."""
    ratios = [len(encode(h)) / len(encode(s)) for s, h in zip(sources, hypotheses) if s.strip() and encode(s)]
    return float(np.percentile(ratios, 1)) if ratios else None


def dev_scores(model: Seq2Seq, data: RunData, cfg: Config, device: torch.device, step: int) -> dict[str, Any]:
    """The validation of the weights at update ``step`` (what ``TrainState.add_validation`` takes): dev NLL, dev
    BLEU when train.valid_bleu (None otherwise), the sentences scored, the beam, and the 1st percentile of the
    output/source length ratio (``length_ratio_p01``, read back by ``load_for_inference`` for translate's
    short-output warning) when BLEU was measured."""
    t = cfg.train
    nll, _ = evaluate_loss(model, data.dev, usable_examples(data.dev, cfg.model.max_positions), cfg, device)
    bleu = floor = None
    sentences = t.valid_max_sentences
    if t.valid_bleu:
        scores = dev_bleu(model, data.vocab, data.directory, cfg, device)
        if scores is not None:
            bleu, floor, sentences = scores
    dev = {"step": step, "nll": nll, "bleu": bleu, "sentences": sentences, "beam_size": t.valid_beam_size}
    if floor is not None:
        dev["length_ratio_p01"] = floor
    return dev


def validation_record(dev: dict[str, Any], best_bleu: float | None) -> dict[str, Any]:
    """The metrics.jsonl record of validation ``dev`` (``dev_scores``), with the run's best dev BLEU after it."""
    record = {"step": dev["step"], "dev_nll": dev["nll"], "dev_ppl": math.exp(min(dev["nll"], 50.0))}
    if dev["bleu"] is not None:
        record["dev_bleu"] = dev["bleu"]
    record["best_dev_bleu"] = best_bleu
    return record


def validation_line(record: dict[str, Any]) -> str:
    """The report's line of a validation record (``validation_record``)."""
    bleu = (f" | dev BLEU {record['dev_bleu']:.2f} (best {record['best_dev_bleu']:.2f})" if "dev_bleu" in record
            else "")
    return (f"validation at update {record['step']}: dev nll {record['dev_nll']:.3f} | ppl {record['dev_ppl']:.2f}"
            + bleu)


def share_early_stopping(dd: Distributed, state: TrainState) -> None:
    """Rank 0's best scores and patience count on every rank, so that every rank stops at the same update."""
    if dd.world > 1:
        shared = [state.best_bleu, state.best_loss, state.bad_validations]
        dist.broadcast_object_list(shared, src=0)
        state.best_bleu, state.best_loss, state.bad_validations = shared
