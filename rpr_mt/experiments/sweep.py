"""Sweeps that reproduce Shaw et al. (2018), Tables 1-3, from one base config.

Each table is a list of cells; a cell is a set of config overrides applied to the base config:

    positions   Table 1: absolute vs relative position representations
    clip        Table 2: the clipping distance k in {0, 1, 2, 4, 16, 64, 256}
    key_value   Table 3: the relative terms aV and aK, each on or off (neither = no position information)
    schemes     every position scheme of rpr_mt.model.positions (the study of docs/positions.md)

A *run* is one (resolved config, seed). Cells that resolve to the same config share one run: the base config's own
relative model is Table 1's "relative" row, Table 2's row for its k and Table 3's aV+aK row. Every run trains in its
own directory ``<root>/<run name>/seed<N>``, named by the overrides that differ from the base config ("base" when
none do), then decodes dev and test with the config's decode settings and writes ``result.json``.

Resumable: a run whose ``result.json`` matches its config is skipped; an interrupted run resumes from its latest
checkpoint (``rpr_mt.train.trainer.train`` does that for a run directory holding the same config); a run killed
after training but before decoding is only decoded. ``<root>/plan.json`` lists every run with the table cells it
stands for; ``rpr_mt.experiments.tables`` reads it with the results. Runs are independent, so a cluster can run one
per job (``--list`` prints the commands).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rpr_mt.config import Config, HubSettings, config_to_dict, is_pretokenized, load_config, yaml_value
from rpr_mt.errors import UserError, check_creatable_directory
from rpr_mt.files import write_json, write_lines
from rpr_mt.locks import held_by_another, locked_directory
from rpr_mt.provenance import code_version

TABLE_NAMES = ("positions", "clip", "key_value", "schemes")
PAPER_TABLES = ("positions", "clip", "key_value")  # Shaw et al.'s Tables 1-3; "schemes" is the position-scheme study
CLIPS = (0, 1, 2, 4, 16, 64, 256)  # Shaw et al., Table 2


@dataclass(frozen=True)
class Cell:
    table: str  # one of TABLE_NAMES
    label: str  # the row as the paper labels it
    overrides: tuple[str, ...]  # "section.key=value"


def table_cells(table: str) -> list[Cell]:
    """The cells of one of the paper's tables, in the paper's row order."""
    if table == "positions":
        return [
            Cell(table, "absolute", ("model.positions=absolute",)),
            Cell(table, "relative", ("model.positions=relative",)),
        ]
    if table == "clip":
        return [Cell(table, f"k={k}", ("model.positions=relative", f"model.clip={k}")) for k in CLIPS]
    if table == "key_value":
        relative = "model.positions=relative"
        return [
            Cell(table, "aV+aK", (relative, "model.use_value=true", "model.use_key=true")),
            Cell(table, "aK only", (relative, "model.use_value=false", "model.use_key=true")),
            Cell(table, "aV only", (relative, "model.use_value=true", "model.use_key=false")),
            # Both terms off leaves no position information at all: the paper's 12.5 BLEU row.
            Cell(table, "neither", ("model.positions=none",)),
        ]
    if table == "schemes":  # every position scheme (docs/positions.md)
        return [
            Cell(table, "absolute sinusoidal", ("model.positions=absolute", "model.absolute_kind=sinusoidal")),
            Cell(table, "absolute learned", ("model.positions=absolute", "model.absolute_kind=learned")),
            Cell(table, "Shaw k=16", ("model.positions=relative", "model.clip=16")),
            Cell(table, "Shaw k=4", ("model.positions=relative", "model.clip=4")),
            Cell(table, "Shaw k=64", ("model.positions=relative", "model.clip=64")),
            Cell(table, "T5 bias", ("model.positions=t5",)),
            Cell(table, "Transformer-XL", ("model.positions=xl",)),
            Cell(table, "RoPE", ("model.positions=rope",)),
            Cell(table, "ALiBi", ("model.positions=alibi",)),
            Cell(table, "none", ("model.positions=none",)),
        ]
    raise UserError(f"unknown table {table!r}; choose from {', '.join(TABLE_NAMES)}")


@dataclass
class Run:
    name: str  # directory under the sweep root, without the seed
    seed: int
    overrides: list[str]  # applied after the sweep-wide overrides
    cells: list[tuple[str, str]]  # (table, label) this run stands for

    @property
    def directory(self) -> str:
        return f"{self.name}/seed{self.seed}"


# Settings added after runs were fingerprinted: (section, key) -> (today's default, the behaviour before the key
# existed). At its default such a key is left out of the fingerprint, so that runs recorded before it existed are
# still found finished (as when resuming, a key the old config lacks is no difference at its default); decoded
# outputs recorded without it were made with the old behaviour (``recorded_decode``).
LATER_SETTINGS: dict[tuple[str, str], tuple[Any, Any]] = {
    ("train", "tensorboard"): (True, True),
    ("train", "init_from"): (None, None),
    ("train", "reset_optimizer"): (True, True),
    ("decode", "min_length"): (1, 0),
    ("decode", "split_sentences"): (True, False),
    ("data", "multi30k_text"): ("raw", "raw"),
    ("decode", "buffer_lines"): (2000, None),  # windows of the input: the same outputs as one window
    # data.source: hub's section; runs of other sources never read it
    ("data", "hub"): (dataclasses.asdict(HubSettings()), None),
}

# Where Multi30k is read from (data.multi30k_dir: a local copy, or the download when unset) is no setting of the
# experiment: prepare checks the files themselves by checksum. Fingerprints and plans recorded while it counted hold
# the run config's own value, or the ../shared/data/multi30k that the committed Multi30k configs named (null in
# configs of other sources): ``recorded_fingerprints`` accepts those.
RECORDED_MULTI30K_DIRS = (None, "../shared/data/multi30k")

# The decode settings that change what is decoded (nbest is 1 in sweeps; max_tokens only batches).
DECODE_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b", "min_length")


def comparable_config(cfg: Config) -> dict[str, Any]:
    """The config with what does not change the experiment (run directory, logging cadence) left out, and settings
    added later left out at their defaults (``LATER_SETTINGS``), and where Multi30k is read from."""
    raw = config_to_dict(cfg)
    raw["data"] = {key: value for key, value in raw["data"].items() if key != "multi30k_dir"}
    train = dict(raw["train"])
    for key in ("run_dir", "log_every", "num_threads", "device"):
        train.pop(key, None)
    raw["train"] = train
    for (section, key), (default, _) in LATER_SETTINGS.items():
        if raw[section].get(key) == default:
            raw[section] = {k: v for k, v in raw[section].items() if k != key}
    return raw


def decode_settings(cfg: Config) -> dict[str, Any]:
    """What decides a run's decoded outputs, as recorded in result.json."""
    return {key: getattr(cfg.decode, key) for key in DECODE_KEYS}


def recorded_decode(record: dict[str, Any]) -> dict[str, Any]:
    """The decode settings a result record's outputs were made with. Records from before a setting existed lack it:
    their outputs were made with the behaviour before it (``LATER_SETTINGS``)."""
    found = dict(record.get("decode") or {k: record[k] for k in ("beam_size", "length_penalty") if k in record})
    for (section, key), (_, before) in LATER_SETTINGS.items():
        if section == "decode" and key in DECODE_KEYS:  # split_sentences: sweeps decode whole lines regardless
            found.setdefault(key, before)
    return found


def config_fingerprint(cfg: Config) -> str:
    return _fingerprint(comparable_config(cfg))


def recorded_fingerprints(cfg: Config) -> set[str]:
    """The fingerprints a record of ``cfg``'s settings holds: today's, or one written while data.multi30k_dir was
    part of it (``RECORDED_MULTI30K_DIRS``, or the config's own)."""
    raw = comparable_config(cfg)
    return {_fingerprint(raw)} | {_fingerprint({**raw, "data": {**raw["data"], "multi30k_dir": value}})
                                  for value in {*RECORDED_MULTI30K_DIRS, cfg.data.multi30k_dir}}


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _differences(base: dict[str, Any], other: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in other.items():
        if isinstance(value, dict):
            out += _differences(base.get(key, {}), value, f"{prefix}{key}.")
        elif base.get(key) != value:
            out.append((f"{prefix}{key}", value))
    return out


def _run_name(differences: list[tuple[str, Any]]) -> str:
    if not differences:
        return "base"
    return "+".join(f"{key.split('.')[-1]}={_yaml_value(value)}" for key, value in differences)


def plan_runs(config_path: str | Path, tables: Iterable[str], seeds: Iterable[int], overrides: list[str]) -> list[Run]:
    """One run per distinct (resolved config, seed), each listing the table cells it stands for. A table or seed
    named twice is planned once (each cell would otherwise stand twice in its run's cells)."""
    tables, seeds = list(dict.fromkeys(tables)), list(dict.fromkeys(seeds))
    for override in overrides:  # run_config sets both for every run after the user's --set: it was dropped silently
        key = override.partition("=")[0].strip()
        if key in ("train.seed", "train.run_dir"):
            owner = "--seeds" if key == "train.seed" else "--root (each run is ROOT/RUN/seedN)"
            raise UserError(f"--set {override.strip()}: a sweep sets {key} of every run from {owner}; remove the --set")
    base = comparable_config(load_config(config_path, overrides))
    resolved = []
    for table in tables:
        for cell in table_cells(table):
            cfg = load_config(config_path, [*overrides, *cell.overrides])
            resolved.append((cell, cfg, _differences(base, comparable_config(cfg))))
    by_key: dict[tuple[str, int], Run] = {}
    for seed in seeds:  # seed-major: every cell has one seed before any has two, so tables fill in early
        for cell, cfg, differences in resolved:
            run_overrides = [f"{key}={_yaml_value(value)}" for key, value in differences]
            run = by_key.setdefault((config_fingerprint(cfg), seed), Run(_run_name(differences), seed, run_overrides, []))
            run.cells.append((cell.table, cell.label))
    return list(by_key.values())


def _yaml_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def run_config(config_path: str | Path, overrides: list[str], run: Run, root: str | Path) -> Config:
    return load_config(
        config_path,
        [*overrides, *run.overrides, f"train.seed={run.seed}", f"train.run_dir={Path(root) / run.directory}"],
    )


@contextlib.contextmanager
def _plan_locked(root: Path) -> Iterator[None]:
    """An exclusive lock on the sweep root while its plan is read, merged and written: the cluster mode's parallel
    ``--only`` jobs all merge into one plan.json (without it, one job's rename found another's temporary gone, or
    moved a plan into place that dropped the other's runs). flock on the directory itself: no lock file is left in a
    committed root. Without locks (no fcntl, a file system without them) the plan is written unlocked."""
    with locked_directory(root, wait=True):
        yield


def write_plan(root: str | Path, config_path: str | Path, overrides: list[str], runs: list[Run]) -> None:
    """Merge ``runs`` into ``<root>/plan.json`` (a later sweep over other tables or seeds adds to it); under a lock,
    so that sweeps writing into one root at once (parallel ``--only`` jobs) keep each other's runs."""
    check_root(root)
    with _plan_locked(Path(root)):
        _merge_plan(root, config_path, overrides, runs)


def _merge_plan(root: str | Path, config_path: str | Path, overrides: list[str], runs: list[Run]) -> None:
    path = Path(root) / "plan.json"
    plan = read_plan(root)
    base = check_plan(plan, root, config_path, overrides)
    plan = plan or {"runs": {}}
    plan.setdefault("config", str(config_path))  # the path and overrides recorded first stay: the settings decide
    plan.setdefault("overrides", overrides)
    plan["base_settings"] = base
    for run in runs:
        entry = plan["runs"].setdefault(run.directory, {"seed": run.seed, "overrides": run.overrides, "cells": []})
        for cell in run.cells:
            if list(cell) not in entry["cells"]:
                entry["cells"].append(list(cell))
    write_json(path, plan)


def check_plan(plan: dict[str, Any] | None, root: str | Path, config_path: str | Path,
               overrides: list[str]) -> dict[str, Any]:
    """The base config's settings now, after checking that ``plan`` (the root's plan.json, None if there is none yet)
    is a plan of this base config: the one check of both planning and ``--list``, so that --list never prints
    commands that then fail. The settings decide, not how they are spelled: the same file as ./x.yaml or an absolute
    path, an identical copy, or overrides that change nothing (train.num_threads) are the same sweep. A plan from
    before settings were recorded (``base_settings``; the committed roots under results/) is compared with the config
    file it names, read again, with its overrides; when that file cannot be read, only the same file and overrides
    are known to be the same."""
    base = check_base_settings(plan, root, config_path, overrides)
    if plan is None or plan.get("base_settings") is not None:
        return base
    recorded, recorded_overrides = plan.get("config", str(config_path)), plan.get("overrides", overrides)
    if recorded_overrides == overrides and (recorded == str(config_path) or _same_file(recorded, config_path)):
        return base
    if Path(recorded).is_file():
        try:
            if _base_settings(recorded, recorded_overrides) == base:
                return base
        except UserError:  # no longer a valid config: not known to be the same
            pass
    unread = "" if Path(recorded).is_file() else f" ({recorded} is not found from here: run where the sweep was planned)"
    raise UserError(
        f"{Path(root) / 'plan.json'} belongs to a sweep of {recorded} with overrides {recorded_overrides}, not "
        f"known to have the settings of {config_path} with {overrides}{unread}; use another --root for a different "
        "base config"
    )


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def check_base_settings(plan: dict[str, Any] | None, root: str | Path, config_path: str | Path,
                        overrides: list[str]) -> dict[str, Any]:
    """The base config's settings now (``_base_settings``), after checking them against those ``plan`` recorded
    (the root's plan.json; None or a plan from before they were recorded: nothing to check): the runs under the root
    were trained with those, so a config edited since is a UserError naming the first changes."""
    base = _base_settings(config_path, overrides)
    recorded = (plan or {}).get("base_settings")
    if isinstance(recorded, dict) and isinstance(recorded.get("data"), dict):  # where Multi30k was read: no setting
        recorded = {**recorded, "data": {k: v for k, v in recorded["data"].items() if k != "multi30k_dir"}}
    if recorded is not None and recorded != base:
        changes = _differences(recorded, base) + [(key, None) for key, _ in _differences(base, recorded)
                                                  if _setting(base, key) is _MISSING]
        shown = ", ".join(f"{key}: {_shown(_setting(recorded, key))} -> {_shown(_setting(base, key))}"
                          for key, _ in changes[:3])
        planned_by = (plan or {}).get("config")  # as it was typed: compared where it names a file from here
        if planned_by is not None and Path(planned_by).is_file() and not os.path.samefile(planned_by, config_path):
            # another file than the one the root was planned with: not an edit to restore
            raise UserError(
                f"{root} holds a sweep planned with {planned_by}, whose settings differ from {config_path}'s (with "
                f"their overrides: {shown}{', ...' if len(changes) > 3 else ''}): start this sweep in another --root"
            )
        raise UserError(
            f"{config_path} (with its overrides) changed since this sweep planned its runs in {root} ({shown}"
            f"{', ...' if len(changes) > 3 else ''}): the runs there were trained with the settings before; restore "
            "them, or start the changed sweep in another --root"
        )
    return base


def read_plan(root: str | Path) -> dict[str, Any] | None:
    """``<root>/plan.json``, or None when there is none yet."""
    path = Path(root) / "plan.json"
    try:
        plan = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError) as exc:  # a hand-edited or half-written plan: say which file, not a traceback
        raise UserError(f"{path}: cannot read the sweep's plan ({exc})") from None
    if plan is not None and not (isinstance(plan, dict) and isinstance(plan.get("runs"), dict)):
        # valid JSON of another shape (another tool's file): planning would fail on it with an AttributeError
        raise UserError(f"{path} is not a sweep plan (no 'runs' mapping); use another --root for a new sweep")
    return plan


def _base_settings(config_path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """The base config's settings that decide its runs (``comparable_config``, less the seed each run sets)."""
    raw = comparable_config(load_config(config_path, overrides))
    raw["train"] = {key: value for key, value in raw["train"].items() if key != "seed"}
    return raw


_MISSING = object()


def _shown(value: Any) -> str:
    """A recorded setting as the config spells it; one the record lacks is unset."""
    return "(unset)" if value is _MISSING else yaml_value(value)


def _setting(settings: dict[str, Any], dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def check_root(root: str | Path, create: bool = True) -> None:
    """The sweep root must be a directory or creatable as one (before any run is planned or trained): ``--root`` given
    a file, or a path under a file, is a ``UserError`` naming it, not a FileExistsError from mkdir. ``create=False``
    (``--list``, which writes nothing) checks the same without making the directory."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UserError(f"--root {root} is a file; give a directory for the sweep (new, or one a sweep made)")
    if not create:
        check_creatable_directory(root, "--root")
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file further up, or no permission
        raise UserError(f"--root {root}: cannot create the directory ({exc.strerror}: {exc.filename})") from None


def only_run_name(only: str, root: str) -> str:
    """A --only run as the sweep names it (``base/seed1``), from the path a shell completes: ``base/seed1/``, or the
    run's path under ``root`` spelled any way (``ROOT/base/seed1``, ``./base/seed1`` from inside the root)."""
    inside = os.path.relpath(os.path.abspath(only), os.path.abspath(root))
    return (os.path.normpath(only) if inside.startswith("..") else inside).replace(os.sep, "/")


def is_finished(cfg: Config) -> bool:
    path = Path(cfg.train.run_dir) / "result.json"
    if not path.is_file():
        return False
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):  # damaged: the run is done again and writes it anew
        return False
    return isinstance(result, dict) and result.get("fingerprint") in recorded_fingerprints(cfg)


# Without torch (--list imports none): rpr_mt.train.run_dir.RunDirLock.NAME and rpr_mt.checkpoint_files.STEP_PATTERN.
_TRAIN_LOCK = ".train.lock"
_STEP_CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pt$")


def run_state(cfg: Config) -> str:
    """What ``--list`` says of a run: finished; running now (a sweep job holds the run, or a training its run
    directory: the same command again would be refused); trained (to its max_steps: the next job decodes it);
    started (its newest checkpoint, where the next job resumes); or to do. A cluster user reads it to know which
    commands to launch."""
    if is_finished(cfg):
        return "finished"
    run_dir = Path(cfg.train.run_dir)
    if held_by_another(run_dir) or held_by_another(run_dir / _TRAIN_LOCK):
        return "running now"
    newest = _newest_checkpoint_step(cfg)
    if newest is None:
        return "to do"
    if _trained(cfg, newest):
        return f"trained to update {newest}: decodes it"
    return f"started: resumes from update {newest}"


def _newest_checkpoint_step(cfg: Config) -> int | None:
    """The update of the run's newest numbered checkpoint (read from the names: no torch), if it has one."""
    steps = [int(m.group(1)) for p in (Path(cfg.train.run_dir) / "checkpoints").glob("checkpoint_*.pt")
             if (m := _STEP_CHECKPOINT.search(p.name))]
    return max(steps) if steps else None


def _trained(cfg: Config, newest: int | None) -> bool:
    """Whether a checkpoint at update ``newest`` ends the run's training (max_steps reached), so that the next job
    only decodes it: --list said 'resumes from update 6' and the job 'training' for a run trained to its end."""
    return newest is not None and cfg.train.max_steps is not None and newest >= cfg.train.max_steps


@contextlib.contextmanager
def _holding_run(run_dir: Path) -> Iterator[None]:
    """This job's exclusive lock on one run for as long as it prepares, trains and decodes it, so that a second job
    given the same run (a cluster relaunch) is refused, not left to decode it again beside the first and write the
    same files (the training's own lock covers only the training). flock on the run directory itself, as the plan's
    on the root: no lock file. No locks (no fcntl, a file system without them): unlocked, as the plan is."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with locked_directory(run_dir, wait=False) as held:
        if not held:
            raise UserError(f"{run_dir} is being run by another sweep job; --list says which runs are running now")
        yield


def execute_run(cfg: Config, run: Run, log: Callable[[str], None]) -> dict[str, Any] | str:
    """Train (or resume) one run, then decode dev and test; returns the result, or the name of the signal that
    stopped its training ("SIGINT", "SIGTERM", "SIGHUP")."""
    code = code_version()  # the code this process runs: read before the first import of the training modules
    # Deferred imports: planning and --list need no torch.
    import torch

    from rpr_mt.data.prepare import prepare, reference_files
    from rpr_mt.decode.translate import translate_lines
    from rpr_mt.lines import read_lines
    from rpr_mt.evaluate import score
    from rpr_mt.checkpoint_files import load_for_inference
    from rpr_mt.train.trainer import train

    run_dir = Path(cfg.train.run_dir)
    prepare(cfg.data, progress=False)
    result = train(cfg, progress=False, extend_hint=False)  # no --more-steps in a sweep
    _append_invocation(run_dir, result, code)
    if result.stopped_by == "signal":
        return result.signal or "SIGINT"  # None: a DDP rank stopped with the rank that received it
    which = "average" if cfg.train.average_last > 1 else "last"
    loaded = load_for_inference(run_dir, which)
    model, vocab, checkpoint = loaded.model, loaded.vocab, loaded.checkpoint
    # Whole lines, as before sentence splitting existed: the recorded scores stay comparable (and Multi30k's
    # captions are one sentence each, so splitting would change nothing there).
    decode = dataclasses.replace(cfg.decode, nbest=1, split_sentences=False)
    record: dict[str, Any] = {
        "run": run.directory,
        "seed": run.seed,
        "overrides": run.overrides,
        "cells": run.cells,
        "fingerprint": config_fingerprint(cfg),
        "model": config_to_dict(cfg)["model"],
        "parameters": result.parameters,
        "updates": result.step,
        "completed_epochs": result.epoch,
        "stopped_by": result.stopped_by,
        "checkpoint": which,
        "checkpoint_file": checkpoint.name,
        "beam_size": decode.beam_size,
        "length_penalty": decode.length_penalty,
        "decode": decode_settings(cfg),
        **_training_totals(run_dir),
    }
    for split in ("dev", "test"):
        src_path, ref_path = reference_files(cfg.data.output_dir, split)
        log(f"{run.directory}: decoding {split} ({which} checkpoint, beam {decode.beam_size})")
        hypotheses = translate_lines(model, vocab, read_lines(src_path), decode=decode, device=torch.device("cpu"),
                                     min_length_ratio=loaded.length_ratio_floor)
        write_lines(str(run_dir / f"{split}.hyp"), hypotheses)
        scores = score(hypotheses, read_lines(ref_path), lang=cfg.data.tgt_lang, pretokenized=is_pretokenized(cfg.data))
        record[f"{split}_bleu"] = scores["sacrebleu"]
        record[f"{split}_chrf"] = scores["chrf"]
        record[f"{split}_lc_tok_bleu"] = scores["lc_tok_bleu"]
        record["signature"] = scores["sacrebleu_signature"]
        record["lc_tok_signature"] = scores["lc_tok_bleu_signature"]
    write_json(run_dir / "result.json", record)
    return record


def _append_invocation(run_dir: Path, result: Any, code: str) -> None:
    """Each train() call's wall clock, tokens and code version (a run resumed with other code can be told apart), and
    the run's totals so far as its checkpoints carry them."""
    with open(run_dir / "invocations.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"seconds": result.seconds, "target_tokens": result.target_tokens,
                                 "run_seconds": result.run_seconds, "run_target_tokens": result.run_target_tokens,
                                 "stopped_by": result.stopped_by, "step": result.step, "code": code}) + "\n")


def _training_totals(run_dir: Path) -> dict[str, Any]:
    """Training time and throughput of the whole run. The last invocation's run totals come from the checkpoints, so
    they also count an invocation killed before it could append its line; older records without them are summed."""
    entries = [json.loads(line) for line in (run_dir / "invocations.jsonl").read_text(encoding="utf-8").splitlines()]
    if entries[-1].get("run_target_tokens") is not None:
        seconds, tokens = entries[-1]["run_seconds"], entries[-1]["run_target_tokens"]
    else:
        seconds = sum(entry["seconds"] for entry in entries)
        tokens = sum(entry["target_tokens"] for entry in entries)
    code: list[str] = []
    for entry in entries:
        version = entry.get("code", "unrecorded")
        if version not in code:
            code.append(version)
    return {"train_seconds": seconds, "tgt_tok_s": tokens / seconds if seconds > 0 else 0.0, "code": code}


def run_sweep(
    config_path: str | Path,
    root: str | Path,
    tables: Iterable[str],
    seeds: Iterable[int],
    overrides: list[str] | None = None,
    only: Iterable[str] | None = None,
    log: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
    after_run: Callable[[Config], None] | None = None,
) -> str:
    """Run every planned run not yet finished, in order; returns "done", or the name of the signal that stopped a
    run's training ("SIGINT", "SIGTERM", "SIGHUP": re-run to resume; ``signal_exit_status`` gives the exit code).

    ``after_run`` is called with each finished run's config (trained now or found finished) before the next run
    starts: work that follows a run, such as the study's long sets, is then done run by run, not left to the end."""
    overrides = list(overrides or [])
    runs = plan_runs(config_path, tables, seeds, overrides)
    wanted = {name.rstrip("/") for name in only or []}  # base/seed1/, as a shell completes a directory
    unknown = wanted - {run.directory for run in runs}
    if unknown:  # before the plan is written: a typo must leave the root as it was
        raise UserError(f"--only {sorted(unknown)[0]!r} is not a run of this sweep (the runs: "
                        f"{', '.join(run.directory for run in runs[:4])}{', ...' if len(runs) > 4 else ''})")
    write_plan(root, config_path, overrides, runs)
    for index, run in enumerate(runs, 1):
        if wanted and run.directory not in wanted:
            continue
        cfg = run_config(config_path, overrides, run, root)
        cells = ", ".join(f"{table} {label}" for table, label in run.cells)
        if is_finished(cfg):
            log(f"[{index}/{len(runs)}] {run.directory}: finished, skipped ({cells})")
        else:
            with _holding_run(Path(cfg.train.run_dir)):
                if is_finished(cfg):  # by another job, between the check above and the lock
                    log(f"[{index}/{len(runs)}] {run.directory}: finished by another job, skipped ({cells})")
                else:
                    newest = _newest_checkpoint_step(cfg)
                    doing = f"trained to update {newest}, decoding" if _trained(cfg, newest) else "training"
                    log(f"[{index}/{len(runs)}] {run.directory}: {doing} ({cells})")
                    record = execute_run(cfg, run, log)
                    if isinstance(record, str):
                        log(f"{run.directory}: stopped by {record}; run the same command again to resume")
                        return record
                    log(f"[{index}/{len(runs)}] {run.directory}: dev BLEU {record['dev_bleu']:.2f}, "
                        f"test BLEU {record['test_bleu']:.2f}")
        if after_run is not None:
            after_run(cfg)
    return "done"
