"""The training loop: token-budget batches, accumulation, autocast, DDP, validation, checkpoints, signals.

``train(config)`` is the importable entry point behind ``rpr-mt train``. Under ``torchrun`` it runs data-parallel
(DistributedDataParallel; NCCL on CUDA, gloo on CPU): every rank builds the same global batches and takes its share
of each, so W processes compute the same update as one process with the same global batch. Rank 0 alone writes
checkpoints, metrics and logs.

Resuming restores model, optimizer, grad scaler, RNG states and the (epoch, batch) position, so an interrupted and
resumed CPU run reaches bit-identical parameters to an uninterrupted one (same seed and thread count). The run state
is one ``TrainState`` (``state.py``), which builds and reads the checkpoint payload and keeps the run's update, data
position, best scores and token and time totals. ``train()`` reads top to bottom, one comment per phase; this file
holds it and its stopping rules (``_stop_reason``). Each helper has its file in ``rpr_mt.train``: the processes
(``distributed``) and devices (``device``), the run directory's config (``run_dir``), the report (``logger``) and
its log window (``window``), signals (``signals``), the checkpoint files (``checkpointing``), the batch order
(``batching.BatchStream``), fine-tuning (``init_from``) and validation (``validation``). The ``budget`` schedule
depends on wall-clock time and is therefore not bit-reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from rpr_mt import checkpoints as ckpt
from rpr_mt.config import Config, TrainConfig, config_to_dict, save_config
from rpr_mt.data.binarize import ids_file, load_split
from rpr_mt.data.prepare import changed_since_prepared, check_prepared, dev_changed_since_prepared, prepare, \
    settings_changed_since_prepared, training_data_fingerprint
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from rpr_mt.host import keep_freed_memory
from rpr_mt.model.positions import describe_positions
from rpr_mt.model.transformer import Seq2Seq, count_parameters
from rpr_mt.train.batching import BatchStream, usable_examples
from rpr_mt.train.checkpointing import Checkpoints, average_is_current, average_last, failed_write, \
    latest_valid_checkpoint, remove_stale_temporaries
from rpr_mt.train.checkpointing import checkpoint_to_use
from rpr_mt.train.device import autocast, cpu_bf16_warning, oversubscribed_threads_warning, peak_memory_mb, \
    pick_device
from rpr_mt.train.distributed import Distributed, init_distributed
from rpr_mt.train.init_from import init_from
from rpr_mt.train.logger import Logger
from rpr_mt.train.loss import TranslationLoss
from rpr_mt.train.optimizer import build_optimizer
from rpr_mt.train.run_dir import RunDirLock, check_run_dir, config_differences, dev_measure_changes, \
    remove_previous_run, saved_config
from rpr_mt.train.schedule import learning_rate
from rpr_mt.train.signals import StopSignal, before_first_update, interrupt_on_stop_signals
from rpr_mt.train.state import TrainState
from rpr_mt.train.throughput import ThroughputMonitor
from rpr_mt.train.validation import validate
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


def _load_data(cfg: Config, dd: Distributed, log: Callable[[str], None], progress: bool, device: torch.device) -> Path:
    """Prepared data directory; prepares it first (rank 0) when it is missing or stale. Rank 0's failure to prepare
    stops every rank with a one-line error (the others would wait for it at a barrier until its exit broke the
    process group, with a traceback burying rank 0's message)."""
    reason = check_prepared(cfg.data)
    if reason is not None:
        def prepare_data() -> None:  # prepare says "preparing DIR (why)" once it has checked the inputs
            with interrupt_on_stop_signals():  # SIGTERM's default left the temporary directory behind
                prepare(cfg.data, progress=progress)

        dd.on_main(prepare_data, device, f"prepare the data in {cfg.data.output_dir}")
        reason = check_prepared(cfg.data)
        if reason is not None:
            raise UserError(f"data in {cfg.data.output_dir} is still not usable ({reason}); run `rpr-mt prepare`")
    return Path(cfg.data.output_dir)


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
    with contextlib.ExitStack() as held:  # what the run holds until it returns or fails: its directory's lock
        return _train(cfg, overwrite=overwrite, dry_run=dry_run, progress=progress, more_steps=more_steps,
                      extend_hint=extend_hint, held=held)


def _train(
    cfg: Config, *, overwrite: bool, dry_run: bool, progress: bool | None, more_steps: int | None,
    extend_hint: bool, held: contextlib.ExitStack,
) -> TrainResult:
    if more_steps is not None and more_steps < 1:
        raise UserError(f"--more-steps must be >= 1 (got {more_steps})")
    if more_steps is not None and overwrite:  # refused before --overwrite below deletes the run it would continue
        raise UserError(f"--more-steps continues the run in {cfg.train.run_dir} and --overwrite deletes it: pass one "
                        "or the other")
    t = cfg.train
    start_time = time.monotonic()
    # until the loop's StopSignal: a signal stops the start-up with one line (closed below, or as the run unwinds)
    startup = held.enter_context(contextlib.ExitStack())
    startup.enter_context(before_first_update())
    if t.num_threads is not None:
        torch.set_num_threads(t.num_threads)
    kind = t.device.partition(":")[0] if t.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if t.precision == "fp16" and kind != "cuda":
        raise UserError("train.precision 'fp16' needs CUDA; use 'bf16' on CPU")
    dd = init_distributed(kind)
    device = pick_device(cfg, dd)
    if device.type == "cpu":
        keep_freed_memory()  # ~12% of a CPU step was page faults on freshly mapped tensors; see rpr_mt.host
    if dry_run:
        return _dry_run(cfg, dd)
    run_dir = Path(t.run_dir)
    log = dd.log
    warnings = (cpu_bf16_warning(device, t.precision),
                oversubscribed_threads_warning(device, t.num_threads, dd.world))
    for warning in warnings:
        if warning is not None:
            log(f"warning: {warning}")

    # -- checks before any work (preparing data can take long): what the run will need to read or write ------------
    check_run_dir(run_dir, t.tensorboard, Path(cfg.data.output_dir))
    has_checkpoints = bool(ckpt.list_step_checkpoints(run_dir))  # until --overwrite below removes them
    if more_steps is not None and not has_checkpoints:
        raise UserError(f"--more-steps: {run_dir} has no checkpoint to continue; train it first")
    if more_steps is not None and t.lr_schedule == "budget":
        raise UserError("--more-steps: the 'budget' schedule is a function of train.max_time; continue a "
                        "time-budget run with --set train.max_time=SECONDS (its new total) instead")
    # a resumed run no longer reads it; under --overwrite it is read after the old run is gone: checked before
    if t.init_from is not None and (overwrite or not has_checkpoints):
        try:
            ckpt.resolve_checkpoint(t.init_from, "best")
        except UserError as exc:
            raise UserError(f"train.init_from: {exc}") from None

    # -- run directory: one training at a time, and never two different runs ---------------------------------------
    busy = dd.is_main and not held.enter_context(RunDirLock(run_dir, warn=log)).acquired
    if not dd.all_true(not busy, device):
        raise UserError(f"another `rpr-mt train` is training in {run_dir} (it holds {run_dir / RunDirLock.NAME}); "
                        "wait for it to finish, or choose another train.run_dir")
    config_path = run_dir / "config.yaml"
    if dd.is_main:
        for stale in remove_stale_temporaries(run_dir):
            log(f"removed {stale.name}, left by a checkpoint write that was interrupted")
    refusal = ""
    has_run = config_path.is_file() or has_checkpoints
    # Data whose inputs changed since the run's checkpoints were trained on it: preparing it again (below) would
    # replace the vocabulary they need before the resume could refuse it. (Damaged files of unchanged inputs are
    # prepared again: the same inputs give the same vocabulary.)
    changed = changed_since_prepared(cfg.data) if dd.is_main and has_checkpoints else None
    if dd.is_main and has_run:
        old, new = saved_config(config_path, run_dir, log), config_to_dict(cfg)
        diffs = config_differences(old, new)
        measure = dev_measure_changes(old, new) if old and not diffs and not overwrite else []
        other_settings = settings_changed_since_prepared(cfg.data) if changed else None
        if measure:
            log(f"warning: the dev BLEU of {run_dir} is measured differently from now on ({'; '.join(measure)}): "
                "its best checkpoint and patience compare new validations with a best score measured the old way")
        # a corrected dev file is prepared again (the vocabulary stays: it is learnt from the training pairs alone)
        dev_changed = (dev_changed_since_prepared(cfg.data) if has_checkpoints and not changed and not diffs
                       and not overwrite else None)
        if dev_changed:
            log(f"warning: the dev set of {run_dir} changed since its last validation ({dev_changed}): its best "
                "checkpoint and patience compare new validations with a best score measured on the old set")
        if diffs and not overwrite:
            settings = config_path if config_path.is_file() else "in its checkpoints"
            refusal = (f"{run_dir} holds a run with a different config ({'; '.join(diffs[:3])}); to resume it, "
                       f"train with its own settings ({settings}); to start another run, choose another "
                       "train.run_dir, or pass --overwrite to delete that run (its checkpoints too)")
        elif changed and not overwrite and other_settings:
            # The run's config is unchanged, so another config prepared the shared directory since: this run's own
            # settings and inputs rebuild what its checkpoints were trained on (the vocabulary check below confirms)
            refusal = (f"{cfg.data.output_dir} was prepared since with other data settings than this run's "
                       f"({other_settings}), probably for another run sharing it. "
                       f"`rpr-mt prepare` with this run's config rebuilds the data {run_dir} was trained on (the same "
                       "inputs and settings give the same vocabulary) but replaces the other run's: give each its own "
                       "data.output_dir")
        elif changed and not overwrite:
            refusal = (f"{run_dir} holds checkpoints trained on the data in {cfg.data.output_dir}, but its inputs "
                       f"changed since ({changed}): preparing it again could change the vocabulary they need. To "
                       "resume, restore what changed; to start over on the new data, pass --overwrite (deletes the "
                       "run's checkpoints) or choose another train.run_dir")
    if not dd.all_true(not refusal, device):  # every rank stops, not rank 0 alone (the others would wait for it)
        raise UserError(refusal or f"{run_dir} holds a run that this config cannot resume (rank 0 says why)")
    dd.barrier()
    # The checkpoint to resume from, read before the data is prepared: when every one of them is corrupt, starting
    # from update 0 would replace them (and the best one) with a new run's; that is --overwrite's to decide
    found = None if overwrite else latest_valid_checkpoint(run_dir, warn=log)
    if found is None and not overwrite and ckpt.list_step_checkpoints(run_dir):
        raise UserError(f"no checkpoint in {ckpt.checkpoint_dir(run_dir)} loads (each is named above), so {run_dir} "
                        "cannot be resumed; restore one, or pass --overwrite to delete the run and start it over")

    # -- data, model, optimizer -------------------------------------------------------------------------------------
    data_dir = _load_data(cfg, dd, log, sys.stderr.isatty() if progress is None else progress, device)
    vocab = Vocab.load(data_dir / "spm.model")
    train_data = load_split(data_dir, "train")
    dev_data = load_split(data_dir, "dev") if ids_file(data_dir, "dev", "src").is_file() else None
    train_indices = usable_examples(train_data, cfg.model.max_positions, cfg.data.max_train_tokens)
    # The limit that binds (usable_examples): pieces a side, eos not counted.
    if cfg.data.max_train_tokens is not None and cfg.data.max_train_tokens < cfg.model.max_positions - 1:
        cap = f"{cfg.data.max_train_tokens} pieces (data.max_train_tokens)"
    else:
        cap = f"{cfg.model.max_positions - 1} pieces (model.max_positions={cfg.model.max_positions} with eos)"
    if len(train_indices) == 0:
        raise UserError(f"no training pair in {data_dir} is non-empty with both sides within {cap}")
    dropped = len(train_data) - len(train_indices)
    if t.patience is not None and dev_data is None and more_steps is None:  # (--more-steps lifts patience)
        # Not an error: max_steps, max_epochs or max_time (one is required) still end the run.
        log(f"warning: train.patience is {t.patience} but {data_dir} has no dev split: nothing is validated, so "
            "patience cannot stop the run")
    elif dev_data is None:  # (a data.demo_sizes or data.splits without dev): say so before the run, not after it
        log(f"note: {data_dir} has no dev split: nothing is validated (no dev loss or BLEU, no checkpoint_best.pt; "
            "translate and eval-bleu then take the last checkpoint)")

    model = initial_model(cfg, vocab).to(device)
    n_params = count_parameters(model)
    log(f"model: {describe_positions(cfg.model)} positions, {n_params:,} parameters; vocabulary {vocab.size:,}; "
        f"{len(train_indices):,} training pairs" + (f" ({dropped:,} skipped: empty or a side over {cap})" if dropped else ""))
    log(f"device {device}, precision {t.precision}, {dd.world} process(es), "
        f"<= {t.max_tokens * t.update_freq:,} tokens per side per update (shared by all processes)")
    too_long = _pairs_over(train_data, train_indices, t.max_tokens)
    if too_long:  # each goes into a batch of its own, over the limit the line above promises
        log(f"warning: {too_long:,} training pair(s) have a side longer than train.max_tokens ({t.max_tokens:,} "
            "tokens with eos): each is a batch of its own, over that limit; raise train.max_tokens or cap the "
            "pairs with data.max_train_tokens")

    optimizer = build_optimizer(model, t, device)
    scaler = torch.amp.GradScaler(device.type, enabled=(t.precision == "fp16"))

    # -- resume (or fine-tune, or start) ----------------------------------------------------------------------------
    state = TrainState(started=start_time)
    vocab_info = ckpt.vocab_payload(data_dir / "spm.model")
    trained_on = training_data_fingerprint(data_dir)
    if found is not None:
        path, payload = found
        if payload["vocab"]["fingerprint"] != vocab_info["fingerprint"]:
            raise UserError(f"{path} was trained with another vocabulary than {data_dir / 'spm.model'}")
        # the same vocabulary, other pairs: `rpr-mt prepare` rebuilt the data from changed inputs since (the check of
        # the inputs above compares them with the manifest, which that rebuild rewrote); checkpoints from before the
        # fingerprint have none
        if payload.get("train_data") not in (None, trained_on):
            raise UserError(f"{path} was trained on other training pairs than {data_dir} holds now (prepared again "
                            "since from changed inputs?). To resume, restore the inputs and run `rpr-mt prepare "
                            "--force` with this run's config; to start "
                            "over on this data, pass --overwrite (deletes the run's checkpoints) or choose another "
                            "train.run_dir")
        state = TrainState.restore(payload, model=model, optimizer=optimizer, scaler=scaler, device=device,
                                   started=start_time)
        log(f"resuming from {path} (update {state.step}, epoch {state.epoch + 1}, batch {state.position})")
        if t.init_from is not None:
            log(f"train.init_from is not used: {run_dir} already has checkpoints of its own")
    elif t.init_from is not None:
        init_from(t, model, optimizer, vocab_info, data_dir, log, cfg.model)
    # --overwrite deletes the previous run only now, once the data, model and optimizer are made and
    # train.init_from's weights loaded: an input error (mismatched files, a vocabulary too large, a sentence limit)
    # used to leave neither the old run nor a new one. With the same config too: a run started over after a code
    # fix, or one whose checkpoints broke.
    if overwrite and dd.is_main and has_run:
        log(f"--overwrite: removing the previous run in {run_dir}")
        remove_previous_run(run_dir)
    dd.barrier()
    batches = BatchStream(train_data, train_indices, t, model, dd, state)  # reads only max_tokens and seed of t
    # Whether the run is finished by the stopping rules of this command's config (those in effect before
    # --more-steps lifts them): a finished run is not trained again, an unfinished one is not extended.
    finished = _stop_reason(t, state, dd, device, batches.epoch_done) if found is not None else ""
    if more_steps is not None:
        if found is None:  # every checkpoint is corrupt (each was named above)
            raise UserError(f"--more-steps: {run_dir} has no checkpoint to continue; train it first")
        if not finished:  # N more than its latest checkpoint would shorten the run and its step-based schedule
            target = _unfinished_target(t, state, batches.epoch_done)
            raise UserError(f"--more-steps: {run_dir} is not finished: {target}; run the same command without "
                            "--more-steps to resume it")
        t = dataclasses.replace(t, max_steps=state.step + more_steps, max_epochs=None, max_time=None, patience=None)
        cfg = dataclasses.replace(cfg, train=t)
        log(f"--more-steps {more_steps}: training to update {t.max_steps} (max_epochs, max_time and patience lifted)")
    elif finished:
        # The command of a finished run, again: validating, saving or rewriting config.yaml would change the run
        # (its patience count, its config's stopping rules, a duplicate dev record) without training it.
        more = ("--set train.max_time=SECONDS (a larger total) trains longer" if t.lr_schedule == "budget"
                else "--more-steps N trains N more updates")  # the budget schedule refuses --more-steps
        # Except its average: train.average_last raised (or set) after the end asks for one that only needs the
        # checkpoints kept, as fairseq's average_checkpoints.py would make it; the same average is not made again
        average = t.average_last > 0 and dd.is_main and not average_is_current(run_dir, t)
        log(f"{run_dir} is already finished ({_finished_because(finished, t, state, batches.epoch_done)}): nothing "
            f"to train, {'averaging its last checkpoints (train.average_last)' if average else 'nothing changed'}"
            + (f"; {more}" if extend_hint else ""))
        if average:
            average_last(run_dir, t, log)
        seconds = time.monotonic() - start_time
        return TrainResult(run_dir, state.step, state.epoch, finished, state.best_bleu, found[0], n_params, 0,
                           seconds, peak_memory_mb(device), state.elapsed_before, state.run_tokens())
    def write_config() -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            save_config(cfg, config_path)
        except OSError as exc:  # a full disk: one line naming the file, as for a checkpoint
            raise failed_write(config_path, exc, run_dir, state.step) from None

    dd.on_main(write_config, device, f"write {config_path}")

    train_module: nn.Module = TranslationLoss(model, t.label_smoothing)
    if dd.world > 1:
        train_module = nn.parallel.DistributedDataParallel(
            train_module, device_ids=[device.index] if device.type == "cuda" else None
        )
    # Only an interrupted run's off-grid checkpoint is superseded: a finished run's last checkpoint (max_steps,
    # max_time or patience off the grid), continued by --more-steps or a raised limit, is a result the user may have
    # reported. The checkpoint says why its run ended; one from before it did counts as finished when this config's
    # rules are met (finished), else as interrupted.
    interrupted_at = _off_grid_step(found) if _was_interrupted(found, finished) else None
    checkpoints = Checkpoints(run_dir, t, dd, model=model, optimizer=optimizer, scaler=scaler, device=device,
                              config=config_to_dict(cfg), vocab=vocab_info, train_data=trained_on,
                              interrupted_at=interrupted_at)
    logger = Logger(run_dir, dd.is_main, progress, t.max_steps, state.step, tensorboard=t.tensorboard)
    window = LogWindow(ThroughputMonitor())
    bad_updates = 0  # non-finite losses in a row

    # -- the loop: one update per pass ------------------------------------------------------------------------------
    model.train()
    stopped_by = _stop_reason(t, state, dd, device, batches.epoch_done)
    startup.close()
    with StopSignal() as stop_signal:
        while not stopped_by:
            if not dd.all_true(stop_signal.requested is None, device):  # every rank stops at the same update
                stopped_by = "signal"
                break

            # forward and backward over update_freq micro-batches (gradients accumulate). An update does not span
            # two epochs (as in fairseq): the epoch's last one takes only the batches left, so max_epochs stops at the
            # epoch's end and a run resumed there groups its batches as an uninterrupted one does.
            micro = [batches.next()]
            while len(micro) < t.update_freq and not batches.epoch_done:
                micro.append(batches.next())
            update_tokens = sum(b.global_tgt_tokens for b in micro)
            lr = learning_rate(t, cfg.model.d_model, state.step + 1, state.budget_progress(t.max_time))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum, nll_sum = 0.0, 0.0
            for i, batch in enumerate(micro):
                batch = batch.to(device)
                sync = i == len(micro) - 1 or dd.world == 1
                with (contextlib.nullcontext() if sync else train_module.no_sync()), autocast(device, t.precision):
                    loss, nll = train_module(batch.src, batch.tgt_in, batch.tgt_out)
                # Normalise by the global token count of the whole update; DDP averages over ranks, hence * world.
                scaler.scale(loss * (dd.world / update_tokens)).backward()
                loss_sum += float(loss.detach())
                nll_sum += float(nll.detach())

            # Each rank summed its own share of the update: the update's loss is the sum over the ranks (a non-finite
            # loss on any rank is then non-finite on all, so all skip the update; max_bad_updates in a row stop the run)
            loss_sum, nll_sum = dd.all_sum([loss_sum, nll_sum], device)
            if not math.isfinite(loss_sum):
                optimizer.zero_grad(set_to_none=True)
                bad_updates += 1
                logger.message(f"update {state.step + 1}: non-finite loss, update skipped ({bad_updates} in a row)")
                if bad_updates >= t.max_bad_updates:
                    logger.close()
                    last = checkpoints.last or "not yet written"
                    raise UserError(
                        f"{bad_updates} non-finite losses in a row at update {state.step + 1}: stopping; the last "
                        f"good checkpoint is {last} (try a lower learning rate or fp32)"
                    )
                stopped_by = _stop_reason(t, state, dd, device, batches.epoch_done)
                continue
            bad_updates = 0

            # the update
            if t.clip_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.tokens += update_tokens
            window.add(loss_sum, nll_sum, update_tokens, sum(b.global_src_tokens for b in micro))

            # log, validate, save; the stopping rules come after the validation (patience counts it) and before
            # the save: the last update's checkpoint is written once, below, after its own validation
            if state.step % t.log_every == 0 or state.step == 1:
                dd.together(lambda: window.log(state, lr, state.elapsed(), peak_memory_mb(device), logger,
                                               device.type), device, f"write {logger.metrics_path}")
            else:
                logger.advance(state.step)
            paused = time.monotonic()
            if state.step % t.validate_every == 0 and dev_data is not None:
                validate(model, vocab, dev_data, data_dir, cfg, device, dd, state, logger, checkpoints)
            stopped_by = _stop_reason(t, state, dd, device, batches.epoch_done)
            if state.step % t.save_every == 0 and not stopped_by:
                checkpoints.save(state)
            window.start += time.monotonic() - paused  # tokens/s is the training speed: validation does not count

    # -- the end: the last log window, the last update validated, then its checkpoint, the average of the last
    # checkpoints. The window that the end cut short (off the log_every grid) is logged at the last update, whose
    # checkpoint is saved below: a resumed run starts after it and does not log these updates again.
    if window.updates:
        dd.together(lambda: window.log(state, lr, state.elapsed(), peak_memory_mb(device), logger, device.type,
                                       last=True), device, f"write {logger.metrics_path}")
    if dev_data is not None and state.step % t.validate_every != 0 and stopped_by != "signal" and state.step > 0:
        validate(model, vocab, dev_data, data_dir, cfg, device, dd, state, logger, checkpoints)
    if checkpoints.last != ckpt.step_checkpoint_path(run_dir, state.step):
        checkpoints.save(state, stopped_by)
    if t.average_last > 0 and stopped_by != "signal":  # an interrupted run averages when it ends
        dd.on_main(lambda: average_last(run_dir, t, logger.message), device, "average the last checkpoints")
    logger.close()  # the bar first: the summary is the last line on screen
    logger.message(
        f"stopped by {stopped_by} at update {state.step} (epoch {state.epoch + 1}) after {state.elapsed():.0f}s; "
        + (f"best dev BLEU {state.best_bleu:.2f}; " if state.best_bleu is not None else "")
        + (f"checkpoint {checkpoints.last}" if stopped_by == "signal"  # the CLI then says how to resume
           else checkpoint_to_use(run_dir, t, data_dir, cfg.data.src_lang))
    )
    dd.barrier()
    seconds = time.monotonic() - start_time
    return TrainResult(run_dir, state.step, state.epoch, stopped_by, state.best_bleu, checkpoints.last, n_params,
                       state.tokens, seconds, peak_memory_mb(device), state.elapsed_before + seconds,
                       state.run_tokens(), t.max_steps, stop_signal.requested)


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


def _pairs_over(data: Any, indices: Any, max_tokens: int) -> int:
    """How many of the pairs ``indices`` have a side of more than ``max_tokens`` tokens with its eos (make_batches
    gives each of them a batch of its own)."""
    src = np.asarray(data.src_lengths)[indices] + 1
    tgt = np.asarray(data.tgt_lengths)[indices] + 1
    return int(np.count_nonzero((src > max_tokens) | (tgt > max_tokens)))


def _was_interrupted(found: tuple[Path, dict] | None, finished: str) -> bool:
    """Whether the checkpoint a run resumes from was saved because a signal stopped it (not because the run ended):
    its ``stopped_by``, or for a checkpoint from before that was recorded, whether this config has not finished it."""
    if found is None:
        return False
    stopped_by = found[1].get("stopped_by")
    return stopped_by == "signal" if stopped_by is not None else not finished


def _off_grid_step(found: tuple[Path, dict] | None) -> int | None:
    """The update of the checkpoint a run resumes from when it lies off the save grid of the invocation that wrote
    it (saved by a signal): superseded once this run saves past it."""
    if found is None:
        return None
    step = found[1].get("step")
    every = found[1].get("config", {}).get("train", {}).get("save_every")
    return step if isinstance(step, int) and isinstance(every, int) and every > 0 and step % every else None


def _stop_reason(
    t: TrainConfig, state: TrainState, dd: Distributed, device: torch.device, epoch_done: bool = False
) -> str:
    """The stopping rule that ends the run before another update ("" while none does); the same on every rank.
    ``epoch_done``: the current epoch's last batch has been trained (``state.epoch`` counts up only when the next
    epoch's first batch is drawn, so without it max_epochs would train one update of the next epoch)."""
    if t.max_steps is not None and state.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs is not None and state.epoch + int(epoch_done) >= t.max_epochs:
        return "max_epochs"
    if t.max_time is not None and dd.all_true(state.elapsed() >= t.max_time, device):
        return "max_time"
    if t.patience is not None and state.bad_validations >= t.patience:
        return "patience"
    return ""


def _unfinished_target(t: TrainConfig, state: TrainState, epoch_done: bool = False) -> str:
    """Where an unfinished run trains to, in words: its stopping rules that end a run by themselves."""
    targets = []
    if t.max_steps is not None:
        targets.append(f"to update {t.max_steps} (now at {state.step})")
    if t.max_epochs is not None:
        targets.append(f"for {t.max_epochs} epoch(s) ({state.epoch + int(epoch_done)} done)")
    if t.max_time is not None:
        targets.append(f"for {t.max_time:g}s (it has trained {state.elapsed_before:.0f}s)")
    return "it trains " + " or ".join(targets)  # Config.validate requires one of them


def _finished_because(reason: str, t: TrainConfig, state: TrainState, epoch_done: bool = False) -> str:
    """Why a resumed run has nothing left to train, in words (``reason`` from ``_stop_reason``)."""
    if reason == "max_steps":
        return f"it is at update {state.step}, and train.max_steps is {t.max_steps}"
    if reason == "max_epochs":
        return f"it has trained {state.epoch + int(epoch_done)} epoch(s), and train.max_epochs is {t.max_epochs}"
    if reason == "max_time":
        return f"it has trained {state.elapsed_before:.0f}s, and train.max_time is {t.max_time:g}s"
    return f"its last {state.bad_validations} validations did not improve, and train.patience is {t.patience}"
