"""The training loop: token-budget batches, accumulation, autocast, DDP, validation, checkpoints, signals.

``train(config)`` is the importable entry point behind ``rpr-mt train``. Under ``torchrun`` it runs data-parallel
(DistributedDataParallel; NCCL on CUDA, gloo on CPU): every rank builds the same global batches and takes its share
of each, so W processes compute the same update as one process with the same global batch. Rank 0 alone writes
checkpoints, metrics and logs.

Resuming restores model, optimizer, grad scaler, RNG states and the (epoch, batch) position, so an interrupted and
resumed CPU run reaches bit-identical parameters to an uninterrupted one (same seed and thread count). The ``budget``
schedule depends on wall-clock time and is therefore not bit-reproducible.

``train`` reads top to bottom: the session (``context``: processes, device, options), the run directory claimed and
the checkpoint to resume from found (``resume``), the data (``run_data``), then a ``Trainer``, which owns the model,
optimizer, grad scaler, run state (``state.TrainState``), batches, checkpoints and report, decides what the run has
left to train (``resume.plan``) and trains it (``Trainer.fit``: one ``train_step`` per update, then ``_end``). The
other parts have their files in ``rpr_mt.train``: the stopping rules (``stopping``), the run directory's config
(``run_dir``), the report (``logger``) and its log window (``window``), signals (``signals``), the checkpoint files
(``checkpointing``), the batch order (``batching.BatchStream``), fine-tuning (``init_from``) and validation
(``validation``).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import Config, TrainConfig, config_to_dict, save_config
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from rpr_mt.model.positions import describe_positions
from rpr_mt.model.transformer import Seq2Seq, count_parameters
from rpr_mt.train.batching import Batch, BatchStream
from rpr_mt.train.checkpointing import CheckpointSaver, average_is_current, average_last, checkpoint_to_use, \
    failed_write
from rpr_mt.train.context import RunData, Session, TrainOptions, start_session
from rpr_mt.train.device import autocast, peak_memory_mb
from rpr_mt.train.distributed import Distributed
from rpr_mt.train.logger import Logger
from rpr_mt.train.loss import TranslationLoss
from rpr_mt.train.optimizer import build_optimizer
from rpr_mt.train.resume import Claim, claim_run_dir, plan, start_state
from rpr_mt.train.run_data import describe_data, load_run_data, warn_of_pairs_over_max_tokens
from rpr_mt.train.schedule import learning_rate
from rpr_mt.train.signals import StopSignal, before_first_update
from rpr_mt.train.state import TrainState
from rpr_mt.train.stopping import finished_because, stop_reason
from rpr_mt.train.throughput import ThroughputMonitor
from rpr_mt.train.validation import dev_scores, share_early_stopping, validation_line, validation_record
from rpr_mt.train.window import LogWindow


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    epoch: int
    stopped_by: str  # max_steps | max_epochs | max_time | patience | signal | dry_run
    best_bleu: float | None
    last_checkpoint: Path | None
    parameters: int
    target_tokens: int = 0  # target tokens trained on in this invocation (all ranks)
    seconds: float = 0.0  # wall-clock seconds of this invocation, start-up and validation included
    peak_memory_mb: float = 0.0
    # The whole run's totals: this invocation plus those before it, as carried by the checkpoint it resumed from. They
    # count an earlier invocation that was killed before it could report (its work up to its last checkpoint).
    # run_target_tokens is None when that checkpoint predates the count.
    run_seconds: float = 0.0
    run_target_tokens: int | None = 0
    max_steps: int | None = None  # the update it trains to (with --more-steps: the latest checkpoint's + N)
    signal: str | None = None  # stopped_by signal: the one this process received (SIGINT, SIGTERM, SIGHUP)


def train(
    cfg: Config, *, overwrite: bool = False, dry_run: bool = False, progress: bool | None = None,
    more_steps: int | None = None, extend_hint: bool = True,
) -> TrainResult:
    """Train (or resume) the run described by ``cfg``; see the module docstring.

    ``more_steps``: continue a finished run's latest checkpoint for exactly this many more updates (fairseq users
    raise ``--max-update``): train.max_steps becomes that checkpoint's update + more_steps, and max_epochs, max_time
    and patience no longer stop the run. A run that ``cfg``'s stopping rules have not finished is refused (resuming
    it is the plain command), and so is ``overwrite`` with it. A step-based schedule is evaluated with the new
    max_steps, as if the run had been planned that long (``cosine`` therefore rises again); the time-based ``budget``
    schedule cannot be extended this way (raise train.max_time instead).

    ``extend_hint``: a finished run's message says how the CLI trains it longer (a sweep, whose runs are extended
    by no option of its own, passes False).
    """
    options = TrainOptions(overwrite, dry_run, progress, more_steps, extend_hint)
    options.check(cfg.train.run_dir)  # before --overwrite deletes the run that --more-steps would continue
    started = time.monotonic()
    with contextlib.ExitStack() as held:  # what the run holds until it returns or fails: its directory's lock
        # until the loop's StopSignal: a signal stops the start-up with one line (closed by fit, or as the run unwinds)
        startup = held.enter_context(contextlib.ExitStack())
        startup.enter_context(before_first_update())
        session = start_session(cfg, options, started)
        if dry_run:
            return _dry_run(cfg, session.dd)
        session.warn_about_the_device()
        claim = claim_run_dir(session, held)  # checks before any work (preparing data can take long)
        trainer = Trainer(session, load_run_data(session), claim)
        if trainer.finished and more_steps is None:
            return trainer.report_finished()
        return trainer.fit(startup)


class Trainer:
    """One invocation of a run, from its model to its last checkpoint: it owns the model, optimizer and grad scaler,
    the session (config, ranks, device), the run state and batch order, the checkpoints and the report.

    Building it makes the model and optimizer, resumes the checkpoint that ``claim`` found (or fine-tunes, or starts
    at update 0) and decides what is left to train (``finished``: the stopping rule that already ends the resumed
    run, "" for none; ``--more-steps`` extends the session's max_steps). ``fit`` trains what is left."""

    logger: Logger  # the report, opened by fit (a finished run's report_finished writes no file)
    window: LogWindow  # the updates since the last log line, started by fit
    train_module: nn.Module  # the loss of the model, wrapped in DistributedDataParallel under torchrun

    def __init__(self, session: Session, data: RunData, claim: Claim) -> None:
        self.session, self.data, self.claim = session, data, claim
        self.model = initial_model(session.cfg, data.vocab).to(session.device)
        self.n_params = count_parameters(self.model)
        self._describe()
        self.optimizer = build_optimizer(self.model, session.t, session.device)
        self.scaler = torch.amp.GradScaler(session.device.type, enabled=(session.t.precision == "fp16"))
        self.state = start_state(session, claim, data, model=self.model, optimizer=self.optimizer,
                                 scaler=self.scaler)
        self.first_step = self.state.step  # the update this invocation starts after
        # (it reads only max_tokens and seed of train, which --more-steps leaves as they are)
        self.batches = BatchStream(data.train, data.train_indices, session.t, self.model, session.dd, self.state)
        self.session, self.finished = plan(session, claim, self.state, self.batches.epoch_done)
        self.config = config_to_dict(self.cfg)  # as config.yaml and every checkpoint of this invocation hold it
        self.checkpoints = CheckpointSaver(self.session, self.payload, claim.interrupted_at(self.finished))
        self.lr = 0.0  # the learning rate of the latest update
        self.bad_updates = 0  # non-finite losses in a row

    # -- what the trainer is made of ---------------------------------------------------------------------------------

    @property
    def cfg(self) -> Config:
        return self.session.cfg

    @property
    def t(self) -> TrainConfig:
        return self.session.t

    @property
    def dd(self) -> Distributed:
        return self.session.dd

    @property
    def device(self) -> torch.device:
        return self.session.device

    @property
    def run_dir(self) -> Path:
        return self.session.run_dir

    def payload(self, state: TrainState) -> dict[str, Any]:
        """The checkpoint of ``state`` with this run's model, optimizer, grad scaler, config and data."""
        return state.payload(model=self.model, optimizer=self.optimizer, scaler=self.scaler, device=self.device,
                             config=self.config, vocab=self.data.vocab_payload, train_data=self.data.fingerprint)

    def stop_reason(self) -> str:
        """The stopping rule that ends the run before another update ("" while none does)."""
        return stop_reason(self.session, self.state, self.batches.epoch_done)

    def _describe(self) -> None:
        """The run's first lines: the model, the data and how much of it goes into an update."""
        cfg, t, log = self.cfg, self.t, self.session.log
        log(f"model: {describe_positions(cfg.model)} positions, {self.n_params:,} parameters; vocabulary "
            f"{self.data.vocab.size:,}; " + describe_data(self.session, self.data))
        log(f"device {self.device}, precision {t.precision}, {self.dd.world} process(es), "
            f"<= {t.max_tokens * t.update_freq:,} tokens per side per update (shared by all processes)")
        warn_of_pairs_over_max_tokens(self.session, self.data)

    # -- a finished run ----------------------------------------------------------------------------------------------

    def report_finished(self) -> TrainResult:
        """The command of a finished run, again: nothing is trained, validated, saved or rewritten (that would
        change its patience count, its config's stopping rules or its dev records), except the average of its last
        checkpoints when train.average_last asks for one that is not there yet (as fairseq's
        average_checkpoints.py would make it from the checkpoints kept)."""
        t, state, path = self.t, self.state, self.claim.found[0]
        more = ("--set train.max_time=SECONDS (a larger total) trains longer" if t.lr_schedule == "budget"
                else "--more-steps N trains N more updates")  # the budget schedule refuses --more-steps
        average = t.average_last > 0 and self.dd.is_main and not average_is_current(self.run_dir, t)
        because = finished_because(self.finished, t, state, self.batches.epoch_done)
        done = "averaging its last checkpoints (train.average_last)" if average else "nothing changed"
        self.session.log(f"{self.run_dir} is already finished ({because}): nothing to train, {done}"
                         + (f"; {more}" if self.session.options.extend_hint else ""))
        if average:
            average_last(self.run_dir, t, self.session.log)
        return TrainResult(self.run_dir, state.step, state.epoch, self.finished, state.best_bleu, path, self.n_params,
                           0, time.monotonic() - self.session.started, peak_memory_mb(self.device),
                           state.elapsed_before, state.run_tokens())

    # -- the loop ----------------------------------------------------------------------------------------------------

    def fit(self, startup: contextlib.ExitStack) -> TrainResult:
        """Train one update after another until a stopping rule or a signal ends the run, then end it (``_end``).
        ``startup``: the start-up's signal handling, closed where the loop's ``StopSignal`` takes over."""
        self._open()
        self.model.train()
        stopped_by = self.stop_reason()
        startup.close()
        with StopSignal() as stop_signal:
            while not stopped_by:
                if not self.dd.all_true(stop_signal.requested is None, self.device):  # all ranks stop at one update
                    stopped_by = "signal"
                    break
                stopped_by = self.train_step()
        return self._end(stopped_by, stop_signal.requested)

    def _open(self) -> None:
        """What training writes to: config.yaml (this invocation's config), the report and its log window; the
        DDP-wrapped loss."""
        config_path = self.run_dir / "config.yaml"

        def write_config() -> None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                save_config(self.cfg, config_path)
            except OSError as exc:  # a full disk: one line naming the file, as for a checkpoint
                raise failed_write(config_path, exc, self.run_dir, self.state.step) from None

        self.dd.on_main(write_config, self.device, f"write {config_path}")
        self.train_module = TranslationLoss(self.model, self.t.label_smoothing)
        if self.dd.world > 1:
            self.train_module = nn.parallel.DistributedDataParallel(
                self.train_module, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.logger = Logger(self.run_dir, self.dd.is_main, self.session.options.progress, self.t.max_steps,
                             self.state.step, tensorboard=self.t.tensorboard)
        self.window = LogWindow(ThroughputMonitor())  # its clock starts here: the first rate includes no set-up

    def train_step(self) -> str:
        """One update over train.update_freq micro-batches (their gradients accumulate), then its log line,
        validation and checkpoint as their grids ask; returns the stopping rule that ends the run after it."""
        micro = self._micro_batches()
        update_tokens = sum(b.global_tgt_tokens for b in micro)
        self.lr = learning_rate(self.t, self.cfg.model.d_model, self.state.step + 1,
                                self.state.budget_progress(self.t.max_time))
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        loss_sum, nll_sum = self._forward_backward(micro, update_tokens)
        if not math.isfinite(loss_sum):
            self._skip_update()
            return self.stop_reason()
        self.bad_updates = 0
        if self.t.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += update_tokens
        self.window.add(loss_sum, nll_sum, update_tokens, sum(b.global_src_tokens for b in micro))
        return self._after_update()

    def _micro_batches(self) -> list[Batch]:
        """The next update's batches: train.update_freq of them, or fewer at the end of an epoch. An update does not
        span two epochs (as in fairseq): max_epochs stops at the epoch's end, and a run resumed there groups its
        batches as an uninterrupted run does."""
        micro = [self.batches.next()]
        while len(micro) < self.t.update_freq and not self.batches.epoch_done:
            micro.append(self.batches.next())
        return micro

    def _forward_backward(self, micro: list[Batch], update_tokens: int) -> tuple[float, float]:
        """Forward and backward over ``micro``, accumulating gradients; returns the update's loss and NLL summed over
        the ranks (a non-finite loss on any rank is then non-finite on all, so all skip the update). Each loss is
        normalised by the global token count of the whole update; DDP averages over ranks, hence the * world."""
        dd, device = self.dd, self.device
        loss_sum, nll_sum = 0.0, 0.0
        for i, batch in enumerate(micro):
            batch = batch.to(device)
            sync = i == len(micro) - 1 or dd.world == 1  # DDP reduces the gradients at the last micro-batch only
            accumulate = contextlib.nullcontext() if sync else self.train_module.no_sync()
            with accumulate, autocast(device, self.t.precision):
                loss, nll = self.train_module(batch.src, batch.tgt_in, batch.tgt_out)
            self.scaler.scale(loss * (dd.world / update_tokens)).backward()
            loss_sum += float(loss.detach())
            nll_sum += float(nll.detach())
        loss_sum, nll_sum = dd.all_sum([loss_sum, nll_sum], device)
        return loss_sum, nll_sum

    def _skip_update(self) -> None:
        """A non-finite loss skips its update; train.max_bad_updates of them in a row stop the run with one line
        naming its last good checkpoint."""
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_updates += 1
        update = self.state.step + 1
        self.logger.message(f"update {update}: non-finite loss, update skipped ({self.bad_updates} in a row)")
        if self.bad_updates >= self.t.max_bad_updates:
            self.logger.close()
            last = self.checkpoints.last or "not yet written"
            raise UserError(f"{self.bad_updates} non-finite losses in a row at update {update}: stopping; the last "
                            f"good checkpoint is {last} (try a lower learning rate or fp32)")

    def _after_update(self) -> str:
        """The update's log line, validation and checkpoint; returns the stopping rule that ends the run after it.
        The stopping rules come after the validation (patience counts it) and before the save: the last update's
        checkpoint is written once, by ``_end``, after its own validation. The first update of every invocation is
        logged by itself, as a new run's update 1 is: a resumed run reports at once."""
        state, t = self.state, self.t
        if state.step % t.log_every == 0 or state.step == self.first_step + 1:
            self._log_window()
        else:
            self.logger.advance(state.step)
        paused = time.monotonic()
        if state.step % t.validate_every == 0 and self.data.dev is not None:
            self.validate()
        stopped_by = self.stop_reason()
        if state.step % t.save_every == 0 and not stopped_by:
            self.checkpoints.save(state)
        self.window.start += time.monotonic() - paused  # tokens/s is the training speed: validation does not count
        return stopped_by

    def _log_window(self, last: bool = False) -> None:
        """The log line and record of the updates since the last one (``LogWindow.log``), on every rank."""
        self.dd.together(lambda: self.window.log(self.state, self.lr, self.logger, self.device, last=last),
                         self.device, f"write {self.logger.metrics_path}")

    def validate(self) -> None:
        """Dev loss / perplexity and (optionally) dev BLEU, on rank 0: the state takes the scores
        (``TrainState.add_validation``: best scores, patience count, ``state.dev``, which stays None off rank 0),
        checkpoint_best.pt is saved when they improve on the best, and every rank takes the early-stopping state."""
        state = self.state
        state.dev = None

        def score_and_record() -> None:  # rank 0; its failed write (checkpoint_best.pt) stops every rank
            dev = dev_scores(self.model, self.data, self.cfg, self.device, state.step)
            if state.add_validation(dev):
                self.checkpoints.save_best(state)  # with these weights' own scores, now the best
            record = validation_record(dev, state.best_bleu)
            self.logger.record(record, None)
            self.logger.message(validation_line(record))

        self.dd.on_main(score_and_record, self.device, f"save the validation of update {state.step}")
        share_early_stopping(self.dd, state)

    # -- the end -----------------------------------------------------------------------------------------------------

    def _end(self, stopped_by: str, signal: str | None) -> TrainResult:
        """The window that the end cut short (off the log_every grid), logged at the last update; the last update
        validated, then its checkpoint saved (a resumed run starts after it and does not log these updates again);
        the average of the last checkpoints (an interrupted run averages when it ends); the summary line."""
        state, t, dd = self.state, self.t, self.dd
        if self.window.updates:
            self._log_window(last=True)
        if self.data.dev is not None and state.step % t.validate_every != 0 and stopped_by != "signal" \
                and state.step > 0:
            self.validate()
        if self.checkpoints.last != ckpt.step_checkpoint_path(self.run_dir, state.step):
            self.checkpoints.save(state, stopped_by)
        if t.average_last > 0 and stopped_by != "signal":
            dd.on_main(lambda: average_last(self.run_dir, t, self.logger.message), self.device,
                       "average the last checkpoints")
        self.logger.close()  # the bar first: the summary is the last line on screen
        self.logger.message(
            f"stopped by {stopped_by} at update {state.step} (epoch {state.epoch + 1}) after {state.elapsed():.0f}s; "
            + (f"best dev BLEU {state.best_bleu:.2f}; " if state.best_bleu is not None else "")
            + (f"checkpoint {self.checkpoints.last}" if stopped_by == "signal"  # the CLI then says how to resume
               else checkpoint_to_use(self.run_dir, t, self.data.directory, self.cfg.data.src_lang))
        )
        dd.barrier()
        seconds = time.monotonic() - self.session.started
        return TrainResult(self.run_dir, state.step, state.epoch, stopped_by, state.best_bleu, self.checkpoints.last,
                           self.n_params, state.tokens, seconds, peak_memory_mb(self.device),
                           state.elapsed_before + seconds, state.run_tokens(), t.max_steps, signal)


def initial_model(cfg: Config, vocab: Vocab) -> Seq2Seq:
    """The model as training starts it, seeded by train.seed: a finished run's starting point can be rebuilt and
    compared with its checkpoints (``rpr_mt.experiments.untrained``). It seeds torch's global generator, whose
    stream the run's dropout then continues."""
    torch.manual_seed(cfg.train.seed)
    return Seq2Seq(cfg.model, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id)


def _dry_run(cfg: Config, dd: Distributed) -> TrainResult:
    """``--dry-run``: print the model, its parameter count and the tokens per update; read and write nothing."""
    t = cfg.train
    vocab_size = cfg.data.vocab_size
    model = Seq2Seq(cfg.model, vocab_size)
    tokens_per_update = t.max_tokens * t.update_freq
    if dd.is_main:
        print(model)
        print(f"parameters: {count_parameters(model):,} (vocabulary {vocab_size:,})")
        print(f"tokens per update: <= {tokens_per_update:,} source and <= {tokens_per_update:,} target "
              f"({t.max_tokens:,} per batch x update_freq {t.update_freq} across all {dd.world} process(es))")
    return TrainResult(Path(t.run_dir), 0, 0, "dry_run", None, None, count_parameters(model))
