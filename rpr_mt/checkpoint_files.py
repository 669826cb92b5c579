"""Checkpoint files: atomic writes, ``weights_only`` loads, averaging, and rebuilding a model for inference.

Everything that reads a checkpoint uses this module: ``rpr-mt translate`` and ``export``, the trainer (resuming,
``train.init_from``) and the experiments. It stands below ``train``, ``decode`` and ``export``, so that decoding
never imports the trainer. Which numbered checkpoints a run keeps, and when it writes them, is the trainer's
concern (``rpr_mt.train.checkpointing``).

Layout of a run directory::

    run_dir/config.yaml                          the fully resolved config of the run
    run_dir/metrics.jsonl                        one JSON record per log line / validation
    run_dir/tensorboard/                         the same scalars for TensorBoard (train.tensorboard)
    run_dir/checkpoints/checkpoint_00001000.pt   every train.save_every updates and at the end (last keep_last)
    run_dir/checkpoints/checkpoint_best.pt       best dev BLEU, ties broken by dev loss (dev loss alone when BLEU is off)
    run_dir/checkpoints/checkpoint_avg.pt        from `rpr-mt average-checkpoints` or train.average_last

A checkpoint holds everything needed to translate: the resolved config, the SentencePiece model bytes and their
fingerprint, and the weights; training checkpoints add optimizer, scaler, RNG states, the data position and, when
these weights were validated, their dev scores (``dev``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from rpr_mt.config import Config, config_from_dict, is_pretokenized, model_settings_read, yaml_value
from rpr_mt.data.prepare import is_prepared, prepared_vocab_sha256
from rpr_mt.data.vocab import Vocab
from rpr_mt.errors import UserError
from rpr_mt.faults import fault_point
from rpr_mt.host import give_new_file_mode
from rpr_mt.layouts import CTRANSLATE2_WEIGHTS, exported_from, is_ctranslate2_model
from rpr_mt.model.upgrade import upgrade_state_dict
from rpr_mt.text import casing

if TYPE_CHECKING:
    from torch import nn

    from rpr_mt.model.transformer import Seq2Seq

FORMAT = "rpr-mt-checkpoint/1"
STEP_PATTERN = re.compile(r"checkpoint_(\d+)\.pt$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"checkpoint_{step:08d}.pt"


def content_checksum(payload: dict[str, Any]) -> str:
    """sha256 over every tensor of a checkpoint (model, optimizer, RNG states, vocabulary), in a fixed order, with
    the keys that lead to each: flipped weight bytes, or a tensor swapped for another, change it."""
    digest = hashlib.sha256()

    def visit(key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(f"{key}:{value.dtype}:{tuple(value.shape)};".encode())
            if value.numel():  # reshape(-1): a 0-d tensor cannot be viewed as bytes
                digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                visit(f"{key}/{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{key}/{i}", v)

    visit("", {k: v for k, v in payload.items() if k != "checksum"})
    return digest.hexdigest()


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then rename over ``path``.

    A crash at any moment leaves either the old file or the new one, never a truncated checkpoint. The payload gets
    a ``checksum`` of its tensors (``content_checksum``), which ``load_checkpoint`` verifies.
    """
    path = Path(path)
    if path.is_symlink():  # the link's file is written (beside it) and the link kept, not replaced by a file
        path = Path(os.path.realpath(path))
    payload = {**payload, "checksum": content_checksum(payload)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            give_new_file_mode(handle.fileno())
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        fault_point("checkpoint_write")
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        reason = write_failure(exc, path.parent)
        if reason is None:
            raise
        # a full disk or quota: one line, not a traceback
        kept = "the file there is unchanged" if path.exists() else "nothing was written"
        raise UserError(f"cannot write {path} ({reason}); {kept}") from None
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def write_failure(exc: BaseException, directory: Path) -> str | None:
    """Why writing a file (a checkpoint, metrics.jsonl, config.yaml) into ``directory`` failed, in words, when
    ``exc`` is a failed write (None for anything else). torch's zip writer reports a short write (a full disk, a file size limit) as a RuntimeError
    of its own ("unexpected pos"), without the OS's reason: the disk's free space then says what it can."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in ("inline_container", "PytorchStreamWriter")):
        try:
            free = f"{shutil.disk_usage(directory).free / 2**20:,.0f} MiB free there"
        except OSError:
            free = "free space unknown"
        return f"torch's writer failed: {str(exc).splitlines()[0]}; {free}: a full disk or a file size limit?"
    return None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True``; a missing, truncated or foreign file is a ``UserError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:  # unreadable: a UserError, so that resumption falls back to an older checkpoint
        raise UserError(f"checkpoint {path} cannot be read ({exc.strerror or exc})") from None
    if magic and not magic.startswith((b"PK\x03\x04", b"\x80")):  # neither torch's zip format nor a legacy pickle
        raise UserError(f"{path} is not a checkpoint (not a file torch.save wrote)")
    try:
        with warnings.catch_warnings():  # a legacy pickle's protocol note would precede our one-line error
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:  # weights_only refuses anything but tensors and plain containers
        # torch's message is a paragraph of advice; the reason is the sentence after "WeightsUnpickler error:"
        lines = [line.strip() for line in (str(exc).partition("WeightsUnpickler error:")[2] or str(exc)).splitlines()]
        reason = next((line for line in lines if line), type(exc).__name__).split(". ")[0].rstrip(".")
        raise UserError(f"checkpoint {path} holds more than weights (refused by weights_only loading, which does "
                        f"not run code from a file: {reason})") from None
    except Exception as exc:  # torch raises several types for truncated/corrupt zip archives
        # torch's first sentence is the reason ("... failed finding central directory"); advice follows it
        reason = str(exc).strip().splitlines()[0].split(". ")[0].rstrip(".") if str(exc).strip() else type(exc).__name__
        raise UserError(f"checkpoint {path} is corrupt or truncated ({' '.join(reason.split()[:30])})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{path} is not an rpr-mt checkpoint")
    missing = [key for key in ("config", "vocab", "model") if not isinstance(payload.get(key), dict)]
    if missing:
        raise UserError(f"checkpoint {path} lacks {', '.join(missing)} (not a complete rpr-mt checkpoint)")
    if "checksum" in payload and payload["checksum"] != content_checksum(payload):  # older checkpoints have none
        raise UserError(f"checkpoint {path} is corrupt: its tensors differ from the checksum written with them")
    if isinstance(payload.get("model"), dict):
        payload["model"] = upgrade_state_dict(payload["model"])
    return payload


def list_step_checkpoints(run_dir: str | Path) -> list[Path]:
    """Numbered checkpoints of a run, oldest first."""
    return numbered_checkpoints_in(checkpoint_dir(run_dir))


def numbered_checkpoints_in(directory: str | Path) -> list[Path]:
    """The numbered checkpoints directly in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_folder(path: str | Path) -> Path:
    """Where the checkpoints of ``path`` are: a run directory's checkpoints/, or ``path`` itself (a checkpoints/
    folder given directly, or any folder of checkpoint files)."""
    path = Path(path)
    return checkpoint_dir(path) if checkpoint_dir(path).is_dir() else path


def _ctranslate2_export(path: Path) -> str | None:
    """Why ``path`` (a directory or its weights file) cannot be used as an rpr-mt checkpoint when it is a CTranslate2
    model that ``rpr-mt export`` wrote, else None: without this, a user who passed the export to ``translate`` read
    "no checkpoint_best.pt in ..." or a load error."""
    folder = path if path.is_dir() else path.parent
    if not is_ctranslate2_model(folder):
        return None
    if path.is_file() and path.name != CTRANSLATE2_WEIGHTS:
        return None
    source = exported_from(folder)
    return (f"{path} is a CTranslate2 model, not an rpr-mt checkpoint: decode it with CTranslate2 "
            f"(docs/guide/export.md) or pass " + (f"the checkpoint it was exported from, {source}" if source
                                                         else "the run it was exported from"))


def resolve_checkpoint(path: str | Path, which: str = "best") -> Path:
    """A checkpoint file, or a run directory -> its best / last / averaged checkpoint."""
    if which not in ("best", "last", "average"):  # checked for a file too, where it is not used: a typo is a typo
        raise UserError(f"--which must be best, last or average (got {which!r})")
    path = Path(path)
    exported = _ctranslate2_export(path)
    if exported is not None:
        raise UserError(exported)
    if path.is_file():
        return path
    if not path.is_dir():
        raise UserError(f"checkpoint not found: {path}")
    directory = checkpoint_folder(path)
    if which == "last":
        steps = numbered_checkpoints_in(directory)
        if not steps:
            raise UserError(f"no numbered checkpoints in {directory}")
        return steps[-1]
    name = "checkpoint_best.pt" if which == "best" else "checkpoint_avg.pt"
    candidate = directory / name
    if candidate.is_file():
        return candidate
    if which == "best":
        steps = numbered_checkpoints_in(directory)
        if steps:
            return steps[-1]
    raise UserError(f"no {name} in {directory}" + (" (run `rpr-mt average-checkpoints` first)" if which == "average" else ""))


def choose_which(checkpoint: str | Path, which: str | None, report: Callable[[str], None],
                 resolve: bool = False) -> str:
    """The ``--which`` to use (best when not given), with a word to ``report`` where the choice may surprise: a value
    given with a checkpoint file, where it is not used; best asked of a run directory without one (its newest
    numbered checkpoint is loaded); or a run directory's best checkpoint loaded by default while the run also has an
    averaged one that is not older (train.average_last writes it at the end of training, and the run's scores in
    result.json and the docs are of that average). ``resolve``: also resolve the checkpoint it chooses, so that a
    wrong path or ``--which`` is said at once."""
    path = Path(checkpoint)
    if which is not None and path.is_file():
        report(f"warning: --which {which} chooses within a run directory; {checkpoint} is a checkpoint file and is "
               "used as it is")
    if which in (None, "best") and path.is_dir():
        folder = checkpoint_folder(path)
        best, average = folder / "checkpoint_best.pt", folder / "checkpoint_avg.pt"
        if not best.is_file() and numbered_checkpoints_in(folder):  # resolve_checkpoint's fallback, said
            report(f"note: {folder} has no checkpoint_best.pt (no validation has saved one yet); loading its newest "
                   "numbered checkpoint, as --which last")
        elif which is None and best.is_file() and average.is_file() \
                and average.stat().st_mtime >= best.stat().st_mtime:
            report(f"note: {checkpoint} has an averaged checkpoint newer than its best one; loading the best one "
                   "(the default), --which average loads the average")
    which = which or "best"
    if resolve:
        resolve_checkpoint(checkpoint, which)
    return which


def prepared_data_of(output_dir: str | Path, checkpoint: str | Path, vocab_sha256: str | None = None) -> Path:
    """The prepared data a checkpoint's run used. ``data.output_dir`` is saved as the run gave it, often relative
    to the directory it was started from (``data/multi30k_...``). Candidates, in this order: the path itself when
    absolute; else the path below each directory above the checkpoint (the project that trained it, whatever the
    working directory), then the path from the working directory. The first candidate holding prepared data
    (``rpr_mt.data.prepare.is_prepared``) is taken; with ``vocab_sha256`` (the checkpoint's vocabulary) only one prepared with that
    SentencePiece model, and candidates with another are a UserError naming them: scoring a model on another
    preparation's text would be silently wrong. With no candidate, the path as saved (for the caller's error)."""
    output_dir = Path(output_dir)
    if output_dir.is_absolute():
        candidates = [output_dir]
    else:
        candidates = [ancestor / output_dir for ancestor in Path(os.path.abspath(checkpoint)).parents] + [output_dir]
    prepared = [c for c in candidates if is_prepared(c)]
    if vocab_sha256 is None:
        return prepared[0] if prepared else output_dir
    for candidate in prepared:
        if prepared_vocab_sha256(candidate) == vocab_sha256:
            return candidate
    if prepared:
        names = ", ".join(str(c) for c in dict.fromkeys(Path(os.path.abspath(c)) for c in prepared))
        raise UserError(f"the prepared data of {checkpoint} ({names}) has another SentencePiece vocabulary than the "
                        "model: it is not the data the model was trained on; prepare that data again from the run's "
                        "config, or pass --hyp/--ref")
    return output_dir


def describe_checkpoint(payload: dict[str, Any]) -> str:
    """What a checkpoint holds, in words: its update and the dev scores recorded for these weights, e.g.
    ``update 1200, dev BLEU 99.80 (200 sentences, beam 1), dev nll 1.084``."""
    averaged = payload.get("averaged_steps")
    if averaged:
        updates = f"update {averaged[0]}" if len(averaged) == 1 else f"updates {averaged[0]}..{averaged[-1]}"
        return f"average of {_checkpoints(len(averaged))}, {updates}; no dev score recorded"
    if payload.get("averaged_from"):  # averaged before the steps were recorded
        return f"average of {_checkpoints(len(payload['averaged_from']))}; no dev score recorded"
    step = payload.get("step")
    text = f"update {step}" if step is not None else "update unknown"
    dev = payload.get("dev")
    if not dev:
        return text + ", no dev score recorded"
    if dev.get("bleu") is not None:
        sentences = dev.get("sentences")
        text += (f", dev BLEU {dev['bleu']:.2f} ({'all' if sentences is None else sentences} sentences, "
                 f"beam {dev.get('beam_size', 1)})")
    return text + f", dev nll {dev['nll']:.3f}"


def _checkpoints(count: int) -> str:
    return f"{count} checkpoint{'' if count == 1 else 's'}"


def _mapped(path: Path) -> Any:
    """The payload of ``path`` with its tensors mapped, not read (cheap for a large checkpoint); None where torch
    cannot map the file (a legacy pickle, a damaged or foreign file: ``load_checkpoint`` says which)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:
        return None


def averaged_steps(path: str | Path) -> list[int] | None:
    """The updates of the checkpoints that the average ``path`` was made of (read with its tensors mapped); None
    when it is missing, unreadable or not an average (or one from before the updates were recorded)."""
    payload = _mapped(Path(path)) if Path(path).is_file() else None
    steps = payload.get("averaged_steps") if isinstance(payload, dict) else None
    return steps if isinstance(steps, list) else None


def peek_checkpoint(path: str | Path) -> tuple[Config, str] | None:
    """The config and vocabulary fingerprint of checkpoint ``path``, read with its tensors mapped, not read (a
    command's checks before it loads the weights); None where that is not possible (``load_checkpoint`` then says
    what is wrong, or loads a legacy file)."""
    payload = _mapped(Path(path))
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return None
    try:
        return config_from_dict(payload["config"], origin=str(path)), payload["vocab"]["fingerprint"]
    except (KeyError, TypeError, UserError):
        return None


def is_checkpoint_file(path: str | Path) -> bool:
    """Whether ``path`` holds an rpr-mt checkpoint: the only kind of file ``average-checkpoints --force`` replaces."""
    payload = _mapped(Path(path))
    if payload is None:
        try:
            payload = load_checkpoint(path)
        except UserError:
            return False
    return isinstance(payload, dict) and payload.get("format") == FORMAT


def _stored_step(path: Path) -> int | None:
    """The update number checkpoint ``path`` holds, read without reading its weights where torch can map the file;
    an average is refused: its checkpoints would count again, once in it and once more beside it or in the mean."""
    payload = _mapped(path)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        payload = load_checkpoint(path)  # a UserError naming what is wrong with the file
    sources = payload.get("averaged_from")
    if sources:
        names = [Path(source).name for source in sources]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
        raise UserError(f"{path} is already an average ({_checkpoints(len(names))}: {span}): average the numbered "
                        "checkpoints themselves, each once")
    step = payload.get("step")
    return step if isinstance(step, int) else None


def _different_model(payload: dict[str, Any], reference: dict[str, Any]) -> str | None:
    """What makes ``payload`` another model than ``reference`` (for the error: which of several keys, or the
    vocabulary), or None when they can be averaged."""
    if payload["vocab"]["fingerprint"] != reference["vocab"]["fingerprint"]:
        return "another SentencePiece vocabulary"
    # a setting the position scheme ignores may change when a run resumes (rpr_mt.train.run_dir)
    ours, theirs = model_settings_read(payload["config"]["model"]), model_settings_read(reference["config"]["model"])
    keys = [key for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]
    if not keys:
        return None
    shown = ", ".join(f"model.{key} {yaml_value(ours.get(key))} against {yaml_value(theirs.get(key))}"
                      for key in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _refuse_repeats(paths: list[Path]) -> list[int | None]:
    """The update number of each of ``paths``, after refusing a checkpoint that would weigh twice in the mean: one
    file listed twice (under any spelling), an average (``_stored_step``), or two files of the same update (a copy
    such as checkpoint_best.pt beside its numbered checkpoint; with other weights, an average that does not say so
    or another training's checkpoint)."""
    seen: dict[Path, Path] = {}
    for path in paths:
        earlier = seen.setdefault(path.resolve(), path)
        if earlier is not path:
            also = f" (also as {earlier})" if str(earlier) != str(path) else ""
            raise UserError(f"{path} is listed twice{also}: list each checkpoint once")
    steps = [_stored_step(path) for path in paths]
    by_step: dict[int, Path] = {}
    for path, step in zip(paths, steps):
        if step is None:
            continue
        earlier = by_step.setdefault(step, path)
        if earlier is path:
            continue
        first, second = load_checkpoint(earlier), load_checkpoint(path)
        difference = _different_model(second, first)
        if difference:  # the error for mismatched models, as below
            raise UserError(f"{path} has a different model config or vocabulary than {earlier} ({difference}); "
                            "cannot average")
        a, b = first["model"], second["model"]
        if a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a):
            raise UserError(f"{earlier} and {path} are the same checkpoint (update {step}, identical weights): list "
                            "each checkpoint once")
        raise UserError(f"{earlier} and {path} both hold update {step} but different weights (an average, or "
                        "checkpoints of two trainings): average one training's checkpoints, each update once")
    return steps


def average_inputs(inputs: list[Path], last: int, output: Path | None,
                   report: Callable[[str], None]) -> tuple[list[Path], Path]:
    """What ``average-checkpoints`` averages and where it writes: one run directory's (or checkpoint folder's) last
    ``last`` numbered checkpoints, into its checkpoint_avg.pt unless ``output`` is given; or the listed checkpoint
    files, into ``output`` (required). The output may not take a name training reserves (a numbered checkpoint, which
    resume and pruning would take for one of theirs; checkpoint_best.pt, which --which best would load)."""
    if last < 1:
        raise UserError("--last must be >= 1")
    # What the inputs are decides what else is needed (--output for files), so a missing input is said first.
    for path in inputs:
        if not path.exists():
            raise UserError(f"{path} does not exist (give a run directory or checkpoint files)")
    if len(inputs) > 1 and any(path.is_dir() for path in inputs):
        directory = next(path for path in inputs if path.is_dir())
        raise UserError(f"{directory} is a directory: give one run directory, or checkpoint files")
    if len(inputs) == 1 and inputs[0].is_dir():
        folder = checkpoint_folder(inputs[0])  # RUN/checkpoints, or a folder of checkpoint files
        paths = numbered_checkpoints_in(folder)[-last:]
        if not paths:
            raise UserError(f"no numbered checkpoints in {folder}")
        if len(paths) < last:
            report(f"warning: --last {last}, but {inputs[0]} has only {len(paths)} numbered checkpoint(s) (a run "
                   f"keeps the last train.keep_last of those it writes every train.save_every updates); averaging "
                   f"{len(paths)}")
        output = output or folder / "checkpoint_avg.pt"
    else:
        paths = list(inputs)
        if output is None:
            raise UserError("--output is required when averaging listed checkpoint files")
    if STEP_PATTERN.search(output.name):
        raise UserError(f"--output {output}: a numbered name (checkpoint_NNNNNNNN.pt) is reserved for training "
                        "checkpoints; choose another name, e.g. checkpoint_avg.pt")
    if output.name == "checkpoint_best.pt":
        raise UserError(f"--output {output}: checkpoint_best.pt is reserved for the training's best checkpoint; "
                        "choose another name, e.g. checkpoint_avg.pt")
    return paths, output


def average_checkpoints(paths: list[Path], report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Mean of the model parameters of ``paths`` (Vaswani et al. 2017 / Shaw et al. 2018 average the last 20).

    The inputs are taken in the order of their update numbers, whatever the order listed (the same sums, so the same
    file), and each at most once (``_refuse_repeats``). The result carries the config, vocabulary and update of the
    newest checkpoint and no optimizer state; all inputs must share the same model config and vocabulary.
    Floating-point sums run in float64 to avoid accumulation error. No dev score: those of the inputs belong to other
    weights. But translate's short-output warning needs a dev length statistic, and the newest validated input's
    (``dev_lengths``: its ``length_ratio_p01`` and update) stands in for the average's: it changes little between
    checkpoints late in a run. ``report`` receives one line per loaded checkpoint.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    paths = [Path(path) for path in paths]
    steps = _refuse_repeats(paths)
    if None not in steps:  # else (steps not recorded) as listed, the last one taken for the newest
        paths = [path for _, path in sorted(zip(steps, paths), key=lambda pair: pair[0])]
        steps = sorted(steps)
    newest = load_checkpoint(paths[-1])
    sums: dict[str, torch.Tensor] = {}
    lengths = None
    for index, path in enumerate(paths):
        payload = newest if index == len(paths) - 1 else load_checkpoint(path)
        if report is not None:
            report(f"loaded {path} ({describe_checkpoint(payload)})")
        difference = _different_model(payload, newest)
        if difference:
            raise UserError(f"{path} has a different model config or vocabulary than {paths[-1]} ({difference}); "
                            "cannot average")
        validated = payload.get("dev") or payload.get("dev_lengths") or {}
        if validated.get("length_ratio_p01") is not None:  # the newest one wins: inputs run oldest first
            lengths = {"step": validated.get("step", payload.get("step")),
                       "length_ratio_p01": validated["length_ratio_p01"]}
        for key, tensor in payload["model"].items():
            if tensor.is_floating_point():
                sums[key] = sums[key] + tensor.double() if key in sums else tensor.double()
            else:  # integer buffers (none today) are taken from the newest checkpoint, which comes last
                sums[key] = tensor
    reference = newest["model"]
    averaged = {
        k: (v / len(paths)).to(reference[k].dtype) if reference[k].is_floating_point() else v for k, v in sums.items()
    }
    result = {
        "format": FORMAT,
        "step": newest.get("step"),
        "config": newest["config"],
        "vocab": newest["vocab"],
        "model": averaged,
        "averaged_from": [str(p) for p in paths],
        "averaged_steps": steps if None not in steps else None,
    }
    if lengths is not None:
        result["dev_lengths"] = lengths
    return result


def vocab_payload(spm_model_path: str | Path) -> dict[str, Any]:
    """The vocabulary as stored in a checkpoint: SentencePiece model bytes, their sha256 and the size; and the casing
    model's file bytes where the prepared data beside it has one (lowercased text: ``rpr_mt.text.casing``). Bytes
    in uint8 tensors: the checkpoint's checksum covers them."""
    vocab = Vocab.load(spm_model_path)
    data = Path(spm_model_path).read_bytes()
    payload = {
        "fingerprint": vocab.fingerprint,
        "size": vocab.size,
        "spm_model": torch.frombuffer(bytearray(data), dtype=torch.uint8),
    }
    casing_file = Path(spm_model_path).parent / casing.FILE_NAME
    if casing_file.is_file():
        payload["casing_model"] = torch.frombuffer(bytearray(casing_file.read_bytes()), dtype=torch.uint8)
    return payload


def vocab_from_payload(vocab: dict[str, Any], source: str | Path) -> Vocab:
    """Rebuild the SentencePiece vocabulary stored in checkpoint ``source`` (no dependency on the data directory).

    A broken one is a UserError naming ``source``: the temporary file it was read from is gone by then. (Checkpoints
    with a checksum cannot hold one unnoticed; older ones can.)"""
    data = vocab.get("spm_model")
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise UserError(f"checkpoint {source}: its vocabulary holds no SentencePiece model bytes")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spm.model"
        model_bytes = data.numpy().tobytes()
        path.write_bytes(model_bytes)
        try:
            loaded = Vocab.load(path)
            loaded._fingerprint = hashlib.sha256(model_bytes).hexdigest()  # the file is gone after this block
        except UserError as exc:
            reason = str(exc).removeprefix(f"{path}: ").replace(f" from {path}", "").replace(str(path), "spm.model")
            raise UserError(f"checkpoint {source}: its vocabulary is broken ({reason})") from None
    casing_bytes = vocab.get("casing_model")
    if isinstance(casing_bytes, torch.Tensor):
        try:
            loaded.casing = casing.Casing.from_json(casing_bytes.numpy().tobytes().decode("utf-8"), casing.FILE_NAME)
        except (UnicodeDecodeError, casing.CasingError) as exc:
            raise UserError(f"checkpoint {source}: its casing model is broken ({exc})") from None
    return loaded


def casing_of_data(config: Config, checkpoint: str | Path, vocab: Vocab) -> casing.Casing | None:
    """The casing model of the prepared data a checkpoint names (``data.output_dir``, found as ``prepared_data_of``
    finds it, with the checkpoint's vocabulary), for checkpoints written before they carried one; None when its data
    keeps its case, or is not there, or has none."""
    if not is_pretokenized(config.data):
        return None
    try:
        data_dir = prepared_data_of(config.data.output_dir, checkpoint, vocab.fingerprint)
    except UserError:  # prepared again with another vocabulary: not this model's data
        return None
    path = data_dir / casing.FILE_NAME
    if not path.is_file():
        return None
    try:
        return casing.load(path)
    except casing.CasingError as exc:
        raise UserError(str(exc)) from None


def weights_mismatch(model: "nn.Module", weights: dict[str, torch.Tensor]) -> str | None:
    """The first way ``weights`` do not fit ``model``, in words (a parameter's name and both shapes, or a name that
    one side lacks), with the count of the others; None when they fit. torch's own error puts a header first and
    every mismatch on its own line."""
    expected = model.state_dict()
    problems = []
    for name, tensor in expected.items():
        if name not in weights:
            problems.append(f"{name} is missing from the checkpoint")
        elif tuple(weights[name].shape) != tuple(tensor.shape):
            problems.append(f"{name} is {list(weights[name].shape)} in the checkpoint but {list(tensor.shape)} in "
                            "the model")
    problems += [f"the checkpoint has {name}, which the model lacks" for name in weights if name not in expected]
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f"; {more} more difference{'s' if more > 1 else ''}" if more else "")


def model_from_payload(payload: dict[str, Any], config: Config, source: str | Path) -> tuple["Seq2Seq", Vocab]:
    """The model (eval mode, on the CPU) that checkpoint ``source`` describes, with its weights, and its vocabulary
    with its casing model (the checkpoint's; for checkpoints from before they carried one, their prepared data's:
    ``casing_of_data``). Weights that do not fit the model its config describes are a one-line UserError naming the
    first mismatch."""
    from rpr_mt.model.transformer import Seq2Seq  # deferred: keeps checkpoint I/O importable without the model

    vocab = vocab_from_payload(payload["vocab"], source)
    model = Seq2Seq(config.model, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id)
    problem = weights_mismatch(model, payload["model"])
    if problem is not None:
        raise UserError(f"{source}: its weights do not fit the model its config describes ({problem})")
    model.load_state_dict(payload["model"])
    if vocab.casing is None:
        vocab.casing = casing_of_data(config, source, vocab)
    return model.eval(), vocab


@dataclass
class LoadedModel:
    """What ``load_for_inference`` returns: a model ready to translate and what comes with it."""

    model: "Seq2Seq"  # eval mode, on the device asked for
    config: Config  # the run's resolved config, as saved in the checkpoint
    vocab: Vocab  # the joint SentencePiece vocabulary stored in the checkpoint
    checkpoint: Path  # the file loaded (a run directory resolves to its best / last / averaged checkpoint)
    # the dev set's 1st-percentile output/source length ratio, if recorded (an average: its newest validated
    # input's): translate warns of outputs below it (``min_length_ratio``)
    length_ratio_floor: Optional[float] = None


def load_for_inference(
    path: str | Path, which: str = "best", device: str | torch.device = "cpu",
    report: Callable[[str], None] | None = None,
) -> LoadedModel:
    """Model (eval mode), config, vocabulary and dev length floor from a checkpoint file or a run directory.

    ``report`` receives one line saying which file was loaded and what it holds (``describe_checkpoint``)."""
    resolved = resolve_checkpoint(path, which)
    payload = load_checkpoint(resolved)
    if report is not None:
        report(f"loaded {resolved} ({describe_checkpoint(payload)})")
    config = config_from_dict(payload["config"], origin=str(resolved))
    model, vocab = model_from_payload(payload, config, resolved)
    floor = (payload.get("dev") or payload.get("dev_lengths") or {}).get("length_ratio_p01")
    return LoadedModel(model.to(device), config, vocab, resolved, floor)
