"""The training loop: token-budget batches, accumulation, autocast, DDP, validation, checkpoints, signals.

``train(config)`` is the importable entry point behind ``rpr-mt train``. Under ``torchrun`` it runs data-parallel
(DistributedDataParallel; NCCL on CUDA, gloo on CPU): every rank builds the same global batches and takes its share
of each, so W processes compute the same update as one process with the same global batch. Rank 0 alone writes
checkpoints, metrics and logs.

Resuming restores model, optimizer, grad scaler, RNG states and the (epoch, batch) position, so an interrupted and
resumed CPU run reaches bit-identical parameters to an uninterrupted one (same seed and thread count). The run state
is one ``TrainState`` (``state.py``), which builds and reads the checkpoint payload and keeps the run's update, data
position, best scores and token and time totals. ``train()`` reads top to bottom, one comment per phase; beside it
stand the stopping rules (``_stop_reason``), the checkpoint files (``_Checkpoints``), the batch order
(``_Batches``), the log window (``_Window``) and validation (``_validate``). The ``budget`` schedule depends on
wall-clock time and is therefore not bit-reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rpr_mt.config import Config, TrainConfig, config_to_dict, save_config
from rpr_mt.data.binarize import ids_file, load_split
from rpr_mt.data.prepare import check_prepared, prepare
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from rpr_mt.host import keep_freed_memory
from rpr_mt.model.transformer import Seq2Seq, count_parameters
from rpr_mt.train.optimizer import build_optimizer
from rpr_mt.train import checkpoint as ckpt
from rpr_mt.train.batching import Batch, EpochIterator, collate, make_batches, usable_examples
from rpr_mt.train.loss import label_smoothed_nll
from rpr_mt.train.schedule import learning_rate
from rpr_mt.train.state import TrainState
from rpr_mt.train.throughput import ThroughputMonitor, slowdown_warning

# Train keys that may change between an interrupted run and its resumption (stopping rules, logging, threads).
RESUMABLE_TRAIN_KEYS = {
    "max_steps", "max_epochs", "max_time", "patience", "log_every", "save_every", "validate_every", "keep_last",
    "num_threads", "valid_bleu", "valid_max_sentences", "valid_beam_size", "average_last", "max_bad_updates", "device",
}


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


class TranslationLoss(nn.Module):
    """Model + label-smoothed loss in one module, so DistributedDataParallel wraps the whole forward."""

    def __init__(self, model: Seq2Seq, label_smoothing: float) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.model.decode_hidden(tgt_in, self.model.encode(src))  # [B, T, D]
        keep = tgt_out.ne(self.model.pad_id)
        # Project only non-pad positions: padding then costs neither the vocabulary matmul nor the log-softmax.
        logits = self.model.output_logits(hidden[keep])  # [N, V]
        return label_smoothed_nll(logits, tgt_out[keep], self.label_smoothing)


@dataclass
class _Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, text: str) -> None:
        """A line on stderr, from rank 0 only."""
        if self.is_main:
            print(text, file=sys.stderr, flush=True)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_true(self, flag: bool, device: torch.device) -> bool:
        if self.world == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item() > 0)


def _init_distributed(device_kind: str) -> _Distributed:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Distributed()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return _Distributed(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _pick_device(cfg: Config, dd: _Distributed) -> torch.device:
    kind = cfg.train.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UserError("train.device is 'cuda' but no CUDA device is available")
        torch.cuda.set_device(dd.local_rank)
        return torch.device("cuda", dd.local_rank)
    return torch.device("cpu")


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _saved_config(config_path: Path, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The config a run directory was trained with: its config.yaml, or, when a kill left that unreadable or empty,
    the config stored in its newest loadable checkpoint (config.yaml is rewritten at the start of every run)."""
    import yaml

    try:
        saved = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        saved = None
    if isinstance(saved, dict) and saved:
        return saved
    found = ckpt.latest_valid_checkpoint(run_dir, warn=log)
    if found is None:
        return {}
    log(f"{config_path} is unreadable or empty; comparing with the config saved in {found[0].name}")
    return found[1]["config"]


def _config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``section.key: old -> new`` for each setting that would make ``new`` another run than ``old``. A setting that
    ``old`` lacks was added to rpr-mt after that run began; at its default value it changes nothing. Settings whose
    values are mappings (data.splits, data.demo_sizes) compare whole: an entry they gain is a change."""
    sections = _section_paths(Config())
    defaults = _flat(config_to_dict(Config()), sections)
    old, new = _flat(old, sections), _flat(new, sections)
    diffs = []
    for name in sorted(set(old) | set(new)):
        section, _, key = name.partition(".")
        if section not in ("data", "model", "train"):
            continue
        if section == "train" and key.split(".")[0] in RESUMABLE_TRAIN_KEYS:
            continue
        if name == "train.run_dir":  # the run is this directory, however the path is spelled
            continue
        a, b = old.get(name), new.get(name)
        if name not in old and b == defaults.get(name):
            continue
        if a != b:
            diffs.append(f"{name}: {a!r} -> {b!r}")
    return diffs


def _section_paths(config: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the config's sections, nested ones included: {"data", "model", "model.t5", ...}."""
    paths = set()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            paths.add(prefix + field.name)
            paths |= _section_paths(value, f"{prefix}{field.name}.")
    return paths


def _flat(tree: dict[str, Any], sections: set[str], prefix: str = "") -> dict[str, Any]:
    """{"model": {"t5": {"num_buckets": 32}}} -> {"model.t5.num_buckets": 32}: sections compare setting by setting;
    any other value, mappings included, is one setting."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and prefix + key in sections:
            flat.update(_flat(value, sections, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def tensorboard_tag(key: str) -> str:
    """The TensorBoard name of a metrics.jsonl key: dev_bleu -> dev/bleu, best_dev_bleu -> dev/best_bleu,
    loss -> train/loss (two groups, so that TensorBoard shows training and validation curves apart)."""
    if key.startswith("dev_"):
        return "dev/" + key[4:]
    if key.startswith("best_dev_"):
        return "dev/best_" + key[9:]
    return "train/" + key


class _Logger:
    """tqdm bar on a terminal, plain lines otherwise; metrics.jsonl; TensorBoard scalars. Rank 0 only."""

    def __init__(self, run_dir: Path, enabled: bool, progress: bool | None, total: int | None, initial: int,
                 tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.metrics_path = run_dir / "metrics.jsonl"
        self.bar = None
        self.tensorboard = None
        if not enabled:
            return
        use_bar = sys.stderr.isatty() if progress is None else progress
        if use_bar:
            from tqdm import tqdm

            # With a total (train.max_steps) tqdm shows the estimated time left; a max_time-only run has none.
            self.bar = tqdm(total=total, initial=initial, unit="upd", dynamic_ncols=True, file=sys.stderr)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # a dependency of the package, so only a broken install gets here
                self.message("warning: no TensorBoard logs: the tensorboard package is missing "
                             "(pip install tensorboard, or set train.tensorboard=false)")
            else:
                self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def record(self, record: dict[str, Any], line: str | None = None) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                    self.tensorboard.add_scalar(tensorboard_tag(key), value, record["step"])
        if line is not None:
            if self.bar is None:
                self.message(line)

    def advance(self, step: int, postfix: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(step - self.bar.n)  # update(), not n = step: tqdm's rate and time left come from it

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


class _StopSignal:
    """First SIGINT/SIGTERM asks the loop to save and stop at the next update; a second one stops at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignal":
        if threading.current_thread() is threading.main_thread():  # signal handlers need the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = signal.Signals(signum).name
        for sig, handler in self.previous.items():  # a second signal gets the default behaviour
            signal.signal(sig, handler)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _load_data(cfg: Config, dd: _Distributed, log: Callable[[str], None], progress: bool) -> Path:
    """Prepared data directory; prepares it first (rank 0) when it is missing or stale."""
    reason = check_prepared(cfg.data)
    if reason is not None:
        if dd.is_main:
            log(f"data in {cfg.data.output_dir} needs preparing ({reason}); running `rpr-mt prepare` first")
            prepare(cfg.data, progress=progress)
        dd.barrier()
        reason = check_prepared(cfg.data)
        if reason is not None:
            raise UserError(f"data in {cfg.data.output_dir} is still not usable ({reason}); run `rpr-mt prepare`")
    return Path(cfg.data.output_dir)


def evaluate_loss(model: Seq2Seq, data, indices: np.ndarray, cfg: Config, device: torch.device) -> tuple[float, int]:
    """Mean per-token NLL (no smoothing) of ``data`` rows ``indices``; returns (nll, tokens)."""
    loss_module = TranslationLoss(model, 0.0)
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode(), _autocast(device, cfg.train.precision):
        for rows in make_batches(data, indices, cfg.train.max_tokens, seed=0, epoch=0, shuffle=False):
            batch = collate(data, rows, model.pad_id, model.bos_id, model.eos_id).to(device)
            _, nll = loss_module(batch.src, batch.tgt_in, batch.tgt_out)
            total += float(nll)
            tokens += batch.global_tgt_tokens
    model.train(was_training)
    return total / max(tokens, 1), tokens


def dev_bleu(
    model: Seq2Seq, vocab: Vocab, data_dir: Path, cfg: Config, device: torch.device
) -> tuple[float, float | None] | None:
    """sacreBLEU of the first ``valid_max_sentences`` dev lines, decoded with ``valid_beam_size``, and the 1st
    percentile of their output/source length ratio in pieces (``length_ratio_floor``: translate warns when many
    outputs fall below it)."""
    import sacrebleu

    from rpr_mt.decode.translate import read_lines, translate_lines

    src_path = data_dir / f"dev.{cfg.data.src_lang}"
    ref_path = data_dir / f"dev.{cfg.data.tgt_lang}"
    if not src_path.is_file() or not ref_path.is_file():
        return None
    n = cfg.train.valid_max_sentences
    sources, references = read_lines(src_path)[:n], read_lines(ref_path)[:n]
    decode = dataclasses.replace(cfg.decode, beam_size=cfg.train.valid_beam_size, nbest=1)
    hypotheses = translate_lines(model, vocab, sources, decode=decode, device=device, progress=False,
                                 src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang, min_length_ratio=0.0)
    bleu = float(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    return bleu, length_ratio_floor(sources, hypotheses, vocab.encode)


def length_ratio_floor(sources: list[str], hypotheses: list[str], encode: Callable[[str], list[int]]) -> float | None:
    """The 1st percentile of output pieces / source pieces over the non-empty sources (None if there are none)."""
    ratios = [len(encode(h)) / len(encode(s)) for s, h in zip(sources, hypotheses) if s.strip() and encode(s)]
    return float(np.percentile(ratios, 1)) if ratios else None


def train(
    cfg: Config, *, overwrite: bool = False, dry_run: bool = False, progress: bool | None = None,
    more_steps: int | None = None,
) -> TrainResult:
    """Train (or resume) the run described by ``cfg``; see the module docstring.

    ``more_steps``: continue the run's latest checkpoint for exactly this many more updates (fairseq users raise
    ``--max-update``): train.max_steps becomes that checkpoint's update + more_steps, and max_epochs, max_time and
    patience no longer stop the run. A step-based schedule is evaluated with the new max_steps, as if the run had
    been planned that long (``cosine`` therefore rises again); the time-based ``budget`` schedule cannot be extended
    this way (raise train.max_time instead).
    """
    if more_steps is not None and more_steps < 1:
        raise UserError(f"--more-steps must be >= 1 (got {more_steps})")
    t = cfg.train
    start_time = time.monotonic()
    if t.num_threads is not None:
        torch.set_num_threads(t.num_threads)
    kind = t.device if t.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if t.precision == "fp16" and kind != "cuda":
        raise UserError("train.precision 'fp16' needs CUDA; use 'bf16' on CPU")
    dd = _init_distributed(kind)
    device = _pick_device(cfg, dd)
    if device.type == "cpu":
        keep_freed_memory()  # ~12% of a CPU step was page faults on freshly mapped tensors; see rpr_mt.host
    if dry_run:
        return _dry_run(cfg, dd)
    run_dir = Path(t.run_dir)
    log = dd.log

    # -- checks before any work (preparing data can take long): what the run will need to read or write ------------
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"train.run_dir: {run_dir} is a file, not a directory")
    if more_steps is not None and not ckpt.list_step_checkpoints(run_dir):
        raise UserError(f"--more-steps: {run_dir} has no checkpoint to continue; train it first")
    if more_steps is not None and t.lr_schedule == "budget":
        raise UserError("--more-steps: the 'budget' schedule is a function of train.max_time; continue a "
                        "time-budget run with --set train.max_time=SECONDS (its new total) instead")
    if t.init_from is not None and not ckpt.list_step_checkpoints(run_dir):  # a resumed run no longer reads it
        try:
            ckpt.resolve_checkpoint(t.init_from, "best")
        except UserError as exc:
            raise UserError(f"train.init_from: {exc}") from None

    # -- run directory: refuse to mix two different runs ------------------------------------------------------------
    config_path = run_dir / "config.yaml"
    if dd.is_main:
        for stale in ckpt.remove_stale_temporaries(run_dir):
            log(f"removed {stale.name}, left by a checkpoint write that was interrupted")
    refusal = ""
    if dd.is_main and config_path.is_file():
        old = _saved_config(config_path, run_dir, log)
        diffs = _config_differences(old, config_to_dict(cfg))
        if diffs and not overwrite:
            refusal = (f"{run_dir} holds a run with a different config ({'; '.join(diffs[:3])}); "
                       "pass --overwrite to replace it or choose another train.run_dir")
        if diffs and overwrite:
            log(f"--overwrite: removing the previous run in {run_dir}")
            shutil.rmtree(ckpt.checkpoint_dir(run_dir), ignore_errors=True)
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    if not dd.all_true(not refusal, device):  # every rank stops, not rank 0 alone (the others would wait for it)
        raise UserError(refusal or f"{run_dir} holds a run with a different config (rank 0 says which)")
    dd.barrier()

    # -- data, model, optimizer -------------------------------------------------------------------------------------
    data_dir = _load_data(cfg, dd, log, sys.stderr.isatty() if progress is None else progress)
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

    model = initial_model(cfg, vocab).to(device)
    n_params = count_parameters(model)
    log(f"model: {cfg.model.positions} positions, {n_params:,} parameters; vocabulary {vocab.size:,}; "
        f"{len(train_indices):,} training pairs" + (f" ({dropped:,} skipped: empty or a side over {cap})" if dropped else ""))
    log(f"device {device}, precision {t.precision}, {dd.world} process(es), "
        f"<= {t.max_tokens * t.update_freq:,} tokens per side per update (shared by all processes)")

    optimizer = build_optimizer(model, t, device)
    scaler = torch.amp.GradScaler(device.type, enabled=(t.precision == "fp16"))

    # -- resume (or fine-tune, or start) ----------------------------------------------------------------------------
    state = TrainState(started=start_time)
    found = ckpt.latest_valid_checkpoint(run_dir, warn=log)
    vocab_info = ckpt.vocab_payload(data_dir / "spm.model")
    if found is not None:
        path, payload = found
        if payload["vocab"]["fingerprint"] != vocab_info["fingerprint"]:
            raise UserError(f"{path} was trained with another vocabulary than {data_dir / 'spm.model'}")
        state = TrainState.restore(payload, model=model, optimizer=optimizer, scaler=scaler, device=device,
                                   started=start_time)
        log(f"resuming from {path} (update {state.step}, epoch {state.epoch + 1}, batch {state.position})")
        if t.init_from is not None:
            log(f"train.init_from is not used: {run_dir} already has checkpoints of its own")
    elif t.init_from is not None:
        _init_from(t, model, optimizer, vocab_info, data_dir, log)
    if more_steps is not None:
        if found is None:  # every checkpoint is corrupt (each was named above)
            raise UserError(f"--more-steps: {run_dir} has no checkpoint to continue; train it first")
        t = dataclasses.replace(t, max_steps=state.step + more_steps, max_epochs=None, max_time=None, patience=None)
        cfg = dataclasses.replace(cfg, train=t)
        log(f"--more-steps {more_steps}: training to update {t.max_steps} (max_epochs, max_time and patience lifted)")
    if dd.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, config_path)

    train_module: nn.Module = TranslationLoss(model, t.label_smoothing)
    if dd.world > 1:
        train_module = nn.parallel.DistributedDataParallel(
            train_module, device_ids=[device.index] if device.type == "cuda" else None
        )
    checkpoints = _Checkpoints(run_dir, t, dd, model=model, optimizer=optimizer, scaler=scaler, device=device,
                               config=config_to_dict(cfg), vocab=vocab_info)
    batches = _Batches(train_data, train_indices, t, model, dd, state)
    logger = _Logger(run_dir, dd.is_main, progress, t.max_steps, state.step, tensorboard=t.tensorboard)
    window = _Window(ThroughputMonitor())
    stopped_by = ""
    bad_updates = 0  # non-finite losses in a row

    # -- the loop: one update per pass ------------------------------------------------------------------------------
    model.train()
    with _StopSignal() as stop_signal:
        while not (stopped_by := _stop_reason(t, state, dd, device)):
            if not dd.all_true(stop_signal.requested is None, device):  # every rank stops at the same update
                stopped_by = "signal"
                break

            # forward and backward over update_freq micro-batches (gradients accumulate)
            micro = [batches.next() for _ in range(t.update_freq)]
            update_tokens = sum(b.global_tgt_tokens for b in micro)
            lr = learning_rate(t, cfg.model.d_model, state.step + 1, state.budget_progress(t.max_time))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum, nll_sum = 0.0, 0.0
            for i, batch in enumerate(micro):
                batch = batch.to(device)
                sync = i == len(micro) - 1 or dd.world == 1
                with (contextlib.nullcontext() if sync else train_module.no_sync()), _autocast(device, t.precision):
                    loss, nll = train_module(batch.src, batch.tgt_in, batch.tgt_out)
                # Normalise by the global token count of the whole update; DDP averages over ranks, hence * world.
                scaler.scale(loss * (dd.world / update_tokens)).backward()
                loss_sum += float(loss.detach())
                nll_sum += float(nll.detach())

            # a non-finite loss on any rank skips the update on all; max_bad_updates of them in a row stop the run
            if not dd.all_true(math.isfinite(loss_sum), device):
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

            # log, validate, save
            if state.step % t.log_every == 0 or state.step == 1:
                window.log(state, lr, state.elapsed(), _peak_memory_mb(device), logger, device.type)
            else:
                logger.advance(state.step)
            paused = time.monotonic()
            if state.step % t.validate_every == 0 and dev_data is not None:
                _validate(model, vocab, dev_data, data_dir, cfg, device, dd, state, logger, checkpoints)
            if state.step % t.save_every == 0:
                checkpoints.save(state)
            window.start += time.monotonic() - paused  # tokens/s is the training speed: validation does not count

    # -- the end: a final validation and checkpoint, the average of the last checkpoints ----------------------------
    if dev_data is not None and state.step % t.validate_every != 0 and stopped_by != "signal" and state.step > 0:
        _validate(model, vocab, dev_data, data_dir, cfg, device, dd, state, logger, checkpoints)
    if checkpoints.last != ckpt.step_checkpoint_path(run_dir, state.step):
        checkpoints.save(state)
    if t.average_last > 0 and dd.is_main and stopped_by != "signal":  # an interrupted run averages when it ends
        _average_last(run_dir, t, logger)
    logger.message(
        f"stopped by {stopped_by} at update {state.step} (epoch {state.epoch + 1}) after {state.elapsed():.0f}s; "
        + (f"best dev BLEU {state.best_bleu:.2f}; " if state.best_bleu is not None else "")
        + f"checkpoint {checkpoints.last}"
    )
    logger.close()
    dd.barrier()
    seconds = time.monotonic() - start_time
    return TrainResult(run_dir, state.step, state.epoch, stopped_by, state.best_bleu, checkpoints.last, n_params,
                       state.tokens, seconds, _peak_memory_mb(device), state.elapsed_before + seconds,
                       state.run_tokens())


def initial_model(cfg: Config, vocab: Vocab) -> Seq2Seq:
    """The model as training starts it, seeded by train.seed: a finished run's starting point can be rebuilt and
    compared with its checkpoints (``rpr_mt.experiments.untrained``). It seeds torch's global generator, whose
    stream the run's dropout then continues."""
    torch.manual_seed(cfg.train.seed)
    return Seq2Seq(cfg.model, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id)


def _dry_run(cfg: Config, dd: _Distributed) -> TrainResult:
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


def _stop_reason(t: TrainConfig, state: TrainState, dd: _Distributed, device: torch.device) -> str:
    """The stopping rule that ends the run before another update ("" while none does); the same on every rank."""
    if t.max_steps is not None and state.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs is not None and state.epoch >= t.max_epochs:
        return "max_epochs"
    if t.max_time is not None and dd.all_true(state.elapsed() >= t.max_time, device):
        return "max_time"
    if t.patience is not None and state.bad_validations >= t.patience:
        return "patience"
    return ""


class _Checkpoints:
    """The run's checkpoint files, written by rank 0. Each holds ``TrainState.payload`` of this run's model,
    optimizer and grad scaler; ``last`` is the numbered checkpoint this invocation saved last."""

    def __init__(self, run_dir: Path, t: TrainConfig, dd: _Distributed, *, model: nn.Module,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device,
                 config: dict[str, Any], vocab: dict[str, Any]) -> None:
        self.run_dir, self.t, self.dd = run_dir, t, dd
        self.parts = dict(model=model, optimizer=optimizer, scaler=scaler, device=device, config=config, vocab=vocab)
        self.last: Path | None = None

    def save(self, state: TrainState) -> None:
        """checkpoint_<update>.pt, then prune to train.keep_last; every rank waits for it."""
        path = ckpt.step_checkpoint_path(self.run_dir, state.step)
        if self.dd.is_main:
            ckpt.save_checkpoint(state.payload(**self.parts), path)
            ckpt.prune_checkpoints(self.run_dir, self.t.keep_last, self.t.save_every)
        self.last = path
        self.dd.barrier()

    def save_best(self, state: TrainState) -> None:
        """checkpoint_best.pt, after a validation that improved the best score (rank 0 only)."""
        ckpt.save_checkpoint(state.payload(**self.parts), ckpt.checkpoint_dir(self.run_dir) / "checkpoint_best.pt")


def _average_last(run_dir: Path, t: TrainConfig, logger: "_Logger") -> None:
    """checkpoint_avg.pt: the mean of the last train.average_last numbered checkpoints (rank 0 only)."""
    paths = ckpt.list_step_checkpoints(run_dir)[-t.average_last:]
    if len(paths) < t.average_last:
        logger.message(f"warning: train.average_last is {t.average_last} but {run_dir} keeps only {len(paths)} "
                       f"numbered checkpoint(s) (train.keep_last {t.keep_last}); averaging {len(paths)}")
    ckpt.save_checkpoint(ckpt.average_checkpoints(paths), ckpt.checkpoint_dir(run_dir) / "checkpoint_avg.pt")
    logger.message(f"averaged {len(paths)} checkpoints into {ckpt.checkpoint_dir(run_dir) / 'checkpoint_avg.pt'}")


class _Batches:
    """The training batches in order, across epochs, keeping ``state.epoch`` and ``state.position`` (the resume
    point) up to date."""

    def __init__(self, data, indices: np.ndarray, t: TrainConfig, model: Seq2Seq, dd: "_Distributed",
                 state: TrainState) -> None:
        self.data, self.indices, self.t, self.model, self.dd, self.state = data, indices, t, model, dd, state
        self._start(state.position)

    def _start(self, position: int) -> None:
        t, model, dd = self.t, self.model, self.dd
        self.iterator = EpochIterator(
            self.data, self.indices, max_tokens=t.max_tokens, seed=t.seed, epoch=self.state.epoch, pad_id=model.pad_id,
            bos_id=model.bos_id, eos_id=model.eos_id, rank=dd.rank, world=dd.world, start=position,
        )
        self.batches = iter(self.iterator)

    def next(self) -> Batch:
        while True:
            batch = next(self.batches, None)
            if batch is not None:
                self.state.position = self.iterator.position
                return batch
            self.state.epoch += 1
            self.state.position = 0
            self._start(0)


class _Window:
    """Sums over the updates since the last log line, and the log line itself."""

    def __init__(self, monitor: ThroughputMonitor) -> None:
        self.monitor = monitor
        self.first = True  # the first window includes start-up work (compilation, first allocations): not a rate
        self.reset()

    def reset(self) -> None:
        self.loss, self.nll, self.tgt, self.src, self.start = 0.0, 0.0, 0, 0, time.monotonic()

    def add(self, loss: float, nll: float, tgt: int, src: int) -> None:
        self.loss += loss
        self.nll += nll
        self.tgt += tgt
        self.src += src

    def log(self, state: TrainState, lr: float, elapsed: float, peak_mb: float, logger: "_Logger",
            device_type: str) -> None:
        seconds = max(time.monotonic() - self.start, 1e-9)
        step = state.step
        record = {
            "step": step, "epoch": state.epoch + 1, "loss": self.loss / max(self.tgt, 1),
            "nll": self.nll / max(self.tgt, 1), "lr": lr, "tgt_tok_s": self.tgt / seconds,
            "src_tok_s": self.src / seconds, "elapsed": elapsed, "peak_mem_mb": peak_mb,
        }
        logger.record(record, (
            f"update {step} | epoch {state.epoch + 1} | loss {record['loss']:.3f} | lr {lr:.2e} | "
            f"{record['tgt_tok_s']:,.0f} tgt tok/s | {record['src_tok_s']:,.0f} src tok/s | "
            f"{record['elapsed']:.0f}s | peak {record['peak_mem_mb']:,.0f} MB"))
        logger.advance(step, {"loss": f"{record['loss']:.3f}", "lr": f"{lr:.1e}", "tok/s": f"{record['tgt_tok_s']:,.0f}"})
        if not self.first and (reference := self.monitor.observe(record["tgt_tok_s"])) is not None:
            logger.message(slowdown_warning(record["tgt_tok_s"], reference, step, device_type, torch.get_num_threads()))
        self.first = False
        self.reset()


def _init_from(t: TrainConfig, model: Seq2Seq, optimizer: torch.optim.Optimizer, vocab_info: dict[str, Any],
               data_dir: Path, log: Callable[[str], None]) -> None:
    """Fine-tuning: a new run starts from the weights of ``train.init_from`` (its own update count, schedule and
    data order start at zero, like fairseq's --finetune-from-model), with fresh Adam moments unless
    ``train.reset_optimizer`` is false."""
    try:
        source = ckpt.resolve_checkpoint(t.init_from, "best")
        state = ckpt.load_checkpoint(source)
    except UserError as exc:
        raise UserError(f"train.init_from: {exc}") from None
    if state["vocab"]["fingerprint"] != vocab_info["fingerprint"]:
        raise UserError(f"train.init_from: {source} was trained with another vocabulary than "
                        f"{data_dir / 'spm.model'}; fine-tuning needs data prepared with the checkpoint's vocabulary")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0][:160]
        raise UserError(f"train.init_from: {source} does not fit this model section ({first})") from None
    if not t.reset_optimizer:
        if not state.get("optimizer"):
            raise UserError(f"train.init_from: {source} has no optimizer state (an averaged checkpoint?); "
                            "set train.reset_optimizer=true")
        try:
            optimizer.load_state_dict(state["optimizer"])
        except ValueError as exc:
            raise UserError(f"train.init_from: the optimizer state of {source} does not fit ({exc}); "
                            "set train.reset_optimizer=true") from None
    log(f"initialised from {source} ({ckpt.describe_checkpoint(state)}); "
        f"optimizer {'reset' if t.reset_optimizer else 'state loaded'}; updates and schedule start at 0")


def _validate(model, vocab, dev_data, data_dir, cfg, device, dd, state: TrainState, logger,
              checkpoints: _Checkpoints) -> None:
    """Dev loss / perplexity and (optionally) dev BLEU; the state takes the scores (``TrainState.add_validation``:
    best scores, patience count, ``state.dev``, which stays None off rank 0) and checkpoint_best.pt is saved when
    they improve on the best."""
    t = cfg.train
    indices = usable_examples(dev_data, cfg.model.max_positions)
    record: dict[str, Any] = {"step": state.step}
    state.dev = None
    if dd.is_main:
        nll, _ = evaluate_loss(model, dev_data, indices, cfg, device)
        record.update(dev_nll=nll, dev_ppl=math.exp(min(nll, 50.0)))
        bleu = floor = None
        if t.valid_bleu:
            scores = dev_bleu(model, vocab, data_dir, cfg, device)
            if scores is not None:
                bleu, floor = scores
                record["dev_bleu"] = bleu
        dev = {"step": state.step, "nll": nll, "bleu": bleu, "sentences": t.valid_max_sentences,
               "beam_size": t.valid_beam_size}
        if floor is not None:  # read back by load_for_inference: translate's short-output warning
            dev["length_ratio_p01"] = floor
        if state.add_validation(dev):
            checkpoints.save_best(state)  # with these weights' own scores, now the best
        record["best_dev_bleu"] = state.best_bleu
        logger.record(record, None)
        logger.message(
            f"validation at update {state.step}: dev nll {nll:.3f} | ppl {record['dev_ppl']:.2f}"
            + (f" | dev BLEU {bleu:.2f} (best {state.best_bleu:.2f})" if bleu is not None else "")
        )
    if dd.world > 1:  # share the early-stopping state so every rank stops together
        shared = [state.best_bleu, state.best_loss, state.bad_validations]
        dist.broadcast_object_list(shared, src=0)
        state.best_bleu, state.best_loss, state.bad_validations = shared
