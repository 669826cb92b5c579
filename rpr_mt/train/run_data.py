"""The prepared data a run trains on: prepared first when it is missing or stale, loaded, and the pairs it can use
counted and said before training."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import Config
from rpr_mt.data.binarize import ids_file, load_split
from rpr_mt.data.prepare import check_prepared, prepare, training_data_fingerprint
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from rpr_mt.train.batching import usable_examples
from rpr_mt.train.context import RunData, Session
from rpr_mt.train.signals import interrupt_on_stop_signals


def load_run_data(session: Session) -> RunData:
    """The run's data, prepared first where needed (``prepared_data_dir``); refuses data with no usable training
    pair and says what is skipped or missing."""
    cfg = session.cfg
    progress = session.options.progress
    directory = prepared_data_dir(session, sys.stderr.isatty() if progress is None else progress)
    train = load_split(directory, "train")
    dev = load_split(directory, "dev") if ids_file(directory, "dev", "src").is_file() else None
    indices = usable_examples(train, cfg.model.max_positions, cfg.data.max_train_tokens)
    if len(indices) == 0:
        raise UserError(f"no training pair in {directory} is non-empty with both sides within {length_cap(cfg)}")
    data = RunData(directory, Vocab.load(directory / "spm.model"), train, dev, indices,
                   ckpt.vocab_payload(directory / "spm.model"), training_data_fingerprint(directory))
    _note_a_missing_dev_split(session, data)
    return data


def prepared_data_dir(session: Session, progress: bool) -> Path:
    """The prepared data directory; rank 0 prepares it first when it is missing or stale. Rank 0's failure to prepare
    stops every rank with its one-line error (``Distributed.on_main``)."""
    cfg = session.cfg
    reason = check_prepared(cfg.data)
    if reason is not None:
        def prepare_data() -> None:  # prepare says "preparing DIR (why)" once it has checked the inputs
            with interrupt_on_stop_signals():  # a stop signal removes the temporary directory on its way out
                prepare(cfg.data, progress=progress)

        session.dd.on_main(prepare_data, session.device, f"prepare the data in {cfg.data.output_dir}")
        reason = check_prepared(cfg.data)
        if reason is not None:
            raise UserError(f"data in {cfg.data.output_dir} is still not usable ({reason}); run `rpr-mt prepare`")
    return Path(cfg.data.output_dir)


def length_cap(cfg: Config) -> str:
    """The length limit that binds (``usable_examples``), in words: pieces a side, eos not counted."""
    if cfg.data.max_train_tokens is not None and cfg.data.max_train_tokens < cfg.model.max_positions - 1:
        return f"{cfg.data.max_train_tokens} pieces (data.max_train_tokens)"
    return f"{cfg.model.max_positions - 1} pieces (model.max_positions={cfg.model.max_positions} with eos)"


def _note_a_missing_dev_split(session: Session, data: RunData) -> None:
    """Without a dev split nothing is validated: said before the run, not after it."""
    if data.dev is not None:
        return
    t = session.t
    if t.patience is not None and session.options.more_steps is None:  # (--more-steps lifts patience)
        # not an error: max_steps, max_epochs or max_time (one is required) still end the run
        session.log(f"warning: train.patience is {t.patience} but {data.directory} has no dev split: nothing is "
                    "validated, so patience cannot stop the run")
    else:  # (a data.demo_sizes or data.splits without dev)
        session.log(f"note: {data.directory} has no dev split: nothing is validated (no dev loss or BLEU, no "
                    "checkpoint_best.pt; translate and eval-bleu then take the last checkpoint)")


def describe_data(session: Session, data: RunData) -> str:
    """The training pairs in words, with those skipped (empty, or a side over the length limit)."""
    dropped = len(data.train) - len(data.train_indices)
    return (f"{len(data.train_indices):,} training pairs"
            + (f" ({dropped:,} skipped: empty or a side over {length_cap(session.cfg)})" if dropped else ""))


def warn_of_pairs_over_max_tokens(session: Session, data: RunData) -> None:
    """Each pair with a side over train.max_tokens goes into a batch of its own, over the limit that the run's
    start line promises: said once, with the two ways out."""
    max_tokens = session.t.max_tokens
    src = np.asarray(data.train.src_lengths)[data.train_indices] + 1
    tgt = np.asarray(data.train.tgt_lengths)[data.train_indices] + 1
    too_long = int(np.count_nonzero((src > max_tokens) | (tgt > max_tokens)))
    if too_long:
        session.log(f"warning: {too_long:,} training pair(s) have a side longer than train.max_tokens "
                    f"({max_tokens:,} tokens with eos): each is a batch of its own, over that limit; raise "
                    "train.max_tokens or cap the pairs with data.max_train_tokens")
