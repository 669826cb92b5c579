"""The peers side by side: what a user of OpenNMT-py, fairseq or rpr-mt gets from the same wall-clock budget on the
same CPU, the same Multi30k En->De text and the same model shape (issue #54).

One toolkit a run (each row needs the machine to itself):

    python3 benchmarks/bench_peers.py --toolkit rpr-mt-fp32 --minutes 60 --out results/peers
    python3 benchmarks/bench_peers.py --toolkit rpr-mt-bf16 --minutes 60 --out results/peers
    python3 benchmarks/bench_peers.py --toolkit onmt --minutes 60 --out results/peers
    python3 benchmarks/bench_peers.py --toolkit fairseq --minutes 60 --out results/peers
    python3 benchmarks/bench_peers.py --toolkit onmt --minutes 3 --max-updates 60 --save-every 20 --out /tmp/smoke

Each run:
1. prepares the data once, in ``--work`` (shared by the rows): ``rpr-mt prepare`` with the recipe's data section
   (configs/multi30k_en_de_lit.yaml: Multi30k's tok/ text, a joint SentencePiece BPE of 8,000 pieces, rpr-mt's
   training-pair filter), then writes the prepared train/dev/test ids back as SentencePiece piece text. The peers
   train on those pieces: the same pairs and the same segmentation as rpr-mt, with no per-batch tokenization cost;
2. trains the model shape of the recipe, Transformer-tiny (Wu et al., ACL 2021: 4+4 layers, d_model 128, 4 heads,
   ff 256, dropout 0.3; shared embeddings), with each toolkit's own best-known settings (``onmt_config`` and
   ``fairseq_train_args`` say where each one comes from), for ``--minutes`` of wall clock counted from the trainer's
   start: rpr-mt stops itself (train.max_time), fairseq too (--stop-time-hours), OpenNMT-py has no time limit and
   gets SIGTERM, its last saved checkpoints being what it made;
3. averages the last checkpoints (10 unless fewer exist) where the toolkit can, decodes val and test_2016_flickr with
   beam 5, turns the output pieces back into Multi30k's tokenized text (SentencePiece decoding, as rpr-mt's own
   translations are made) and scores them with ``rpr-mt eval-bleu --pretokenized`` against the tok/ references:
   the literature's BLEU (tokenized text as it is) and sacreBLEU;
4. writes ``--out/TOOLKIT/result.json`` (updates, target tokens, wall seconds, target tokens/s over the run, peak
   resident memory of the trainer and its children, dev/test BLEU, the commands) and prints one Markdown table row.

"Target tokens/s over the run" is the target tokens the trainer consumed (non-padding, with eos; from its own log:
rpr-mt tgt_tok_s x window seconds, OpenNMT-py bsz x updates per report, fairseq wpb x updates per epoch) divided by
the trainer process's wall seconds, start-up, validation and checkpoint saving included. Peak memory is the largest
sum of VmRSS over the trainer and its descendants, sampled every 0.5 s.

The peers live in virtual environments of their own (``--venv``, default /work/peer-venvs/onmt and
/work/peer-venvs/fairseq); results/peers/README.md lists the install commands and their workarounds. By default the
peers run with the process settings rpr-mt gives itself (OMP_WAIT_POLICY=PASSIVE, glibc malloc keeping freed memory:
MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647; docs/benchmarks.md measured OpenNMT-py 1.43x faster with the
malloc setting); ``--peer-env default`` leaves them unset. An allocator preloaded into this script
(``LD_PRELOAD=.../libjemalloc.so.2 MALLOC_CONF=...``) reaches every process of the row, and result.json records it.
"""

# (no `from __future__ import annotations`: the tests load this file as a module outside sys.modules, where
# dataclasses cannot resolve string annotations)
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_float, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.errors import UserError  # noqa: E402

TOOLKITS = ("onmt", "fairseq", "rpr-mt-bf16", "rpr-mt-fp32")
RECIPES = {"rpr-mt-fp32": REPO / "configs" / "multi30k_en_de_lit.yaml",
           "rpr-mt-bf16": REPO / "configs" / "multi30k_en_de_lit_bf16.yaml"}
DEFAULT_VENVS = {"onmt": Path("/work/peer-venvs/onmt"), "fairseq": Path("/work/peer-venvs/fairseq")}
SPLITS = {"dev": "val", "test": "test_2016_flickr"}  # rpr-mt's prepared split -> Multi30k file prefix
SRC, TGT = "en", "de"
# rpr-mt's own process settings (rpr_mt/host.py), given to the peers as environment variables
SAME_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
# a preloaded allocator and its settings, which every process of a row inherits: they change its speed and memory
ALLOCATOR_ENV = ("LD_PRELOAD", "MALLOC_CONF")
AVERAGE_LAST = 10  # the literature's "average of the last 10 checkpoints" (Revisit-MMT's evaluate.sh)
BEAM = 5


def default_data_dir() -> Path:
    return Path(os.environ.get("RPR_MT_MULTI30K_DIR", "/work/shared/data/multi30k"))


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="bench_peers.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--toolkit", choices=TOOLKITS, required=True)
    parser.add_argument("--minutes", type=positive_float, default=60.0,
                        help="wall-clock training budget, from the trainer's start (default 60)")
    parser.add_argument("--max-updates", type=positive_int, default=None,
                        help="also stop after this many updates (smoke runs)")
    parser.add_argument("--save-every", type=positive_int, default=None,
                        help="updates between checkpoints (rpr-mt, OpenNMT-py; default: each recipe's own: 250, "
                             "100); fairseq saves at each epoch's end, as its recipe does")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "peers",
                        help="results go to OUT/TOOLKIT/ (default results/peers)")
    parser.add_argument("--work", type=Path, default=None,
                        help="prepared data shared by the rows (default OUT/work)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="Multi30k with tok/{train,val,test_2016_flickr}.{en,de}.gz (default $RPR_MT_MULTI30K_DIR "
                             "or /work/shared/data/multi30k)")
    parser.add_argument("--venv", type=Path, default=None, help="the peer's virtual environment")
    parser.add_argument("--peer-env", choices=("same", "default"), default="same",
                        help="same: the peer gets rpr-mt's OpenMP and malloc settings (default); default: unset")
    return parser


# ------------------------------------------------------------------------------------------------------------------
# Settings (pure: tested in tests/benchmarks/test_bench_peers.py)
# ------------------------------------------------------------------------------------------------------------------


def onmt_config(work: Path, run: Path, *, max_updates: Optional[int], save_every: Optional[int]) -> dict:
    """OpenNMT-py 3.5 training options (written as its YAML config) for Transformer-tiny on the shared pieces.

    Sources: OpenNMT-py's documented Transformer recipe (docs/source/FAQ.md, "How do I use the Transformer model?":
    adam with beta2 0.998, the noam schedule, label smoothing 0.1, token batches with token normalization,
    max_grad_norm 0, param_init 0 with Glorot, shared embeddings); from the literature's fairseq recipe (Revisit-MMT,
    README-baseline.md) the warm-up (2,000, where the FAQ's 8,000 is WMT's) and the peak learning rate 5e-3: noam's
    rate is learning_rate * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), whose peak at step 2,000 is 5e-3 for
    learning_rate = 5e-3 * sqrt(128 * 2000) = 2.53 (the FAQ's 2 gives 3.95e-3); the decay after it is
    inverse-square-root, fairseq's. Relative positions (Shaw et al.) with k = 16: max_relative_positions 16 and no
    sinusoids; pre-norm is OpenNMT-py's own layer order. Attention dropout 0, as in both recipes of the issue's
    model (fairseq's default, rpr-mt's recipe)."""
    pieces = work / "pieces"
    return {
        "save_data": str(run / "onmt"),
        "src_vocab": str(run / "vocab.shared"),
        "share_vocab": True,
        "overwrite": True,
        "data": {
            "corpus_1": {"path_src": str(pieces / f"train.{SRC}"), "path_tgt": str(pieces / f"train.{TGT}")},
            "valid": {"path_src": str(pieces / f"dev.{SRC}"), "path_tgt": str(pieces / f"dev.{TGT}")},
        },
        "src_vocab_size": 16000, "tgt_vocab_size": 16000,  # above the 8,000 pieces: the whole vocabulary
        "src_seq_length": 256, "tgt_seq_length": 256,
        "save_model": str(run / "model"),
        "save_checkpoint_steps": save_every or 100,  # 10 kept: the last 1,000 updates, about 8 epochs, averaged
        "keep_checkpoint": AVERAGE_LAST,
        "seed": 1,
        "train_steps": max_updates or 1_000_000,  # the wall clock ends the run
        "valid_steps": 1000,  # as rpr-mt's recipe (validate_every 1000)
        "report_every": 10,  # the updates after the last report, up to 9, are not counted
        "world_size": 1, "gpu_ranks": [],  # CPU
        "num_workers": 0,
        # examples read per bucket before batching: the default, 262,144, read Multi30k's 29,000 pairs 9 times over
        # at start-up and held them all (3.4 GB resident in a smoke run); one pass of the corpus a bucket suffices
        "bucket_size": 32768,  # one process: the peer's data loader workers would compete for the two cores
        "model_dtype": "fp32",
        "batch_type": "tokens", "batch_size": 4096, "valid_batch_size": 2048, "normalization": "tokens",
        "accum_count": [1],
        # the model: Transformer-tiny with Shaw et al. relative positions, k = 16
        "encoder_type": "transformer", "decoder_type": "transformer",
        "enc_layers": 4, "dec_layers": 4, "hidden_size": 128, "word_vec_size": 128, "transformer_ff": 256,
        "heads": 4, "dropout": [0.3], "attention_dropout": [0.0],
        "position_encoding": False, "max_relative_positions": 16,
        "share_embeddings": True, "share_decoder_embeddings": True,
        # optimisation: OpenNMT-py's Transformer recipe, warm-up and peak from the literature's
        "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.998,
        "decay_method": "noam", "learning_rate": 2.53, "warmup_steps": 2000,
        "label_smoothing": 0.1, "max_grad_norm": 0.0, "param_init": 0.0, "param_init_glorot": True,
    }


def fairseq_train_args(bin_dir: Path, save_dir: Path, *, minutes: float, max_updates: Optional[int]) -> list[str]:
    """fairseq-train's command line: the literature's Transformer-tiny recipe for Multi30k (Wu et al., ACL 2021,
    github.com/LividWo/Revisit-MMT, README-baseline.md: --share-all-embeddings --dropout 0.3 --warmup-updates 2000
    --lr 0.005 --max-tokens 4096 --patience 10; adam (0.9, 0.98), inverse_sqrt and label smoothing 0.1 as in
    fairseq's own translation examples, which the recipe inherits), the shape spelled out (fairseq's built-in
    transformer_tiny is a smaller 2-layer, d 64 model), absolute sinusoidal positions and post-norm (fairseq's
    transformer defaults; it has no relative positions). Its epoch checkpoints are kept for averaging the last 10
    (evaluate.sh). --stop-time-hours stops the run cleanly at the budget (fairseq counts training time from its
    trainer's start, a few seconds after the process's)."""
    args = [
        str(bin_dir), "--task", "translation", "--source-lang", SRC, "--target-lang", TGT,
        "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "4", "--decoder-layers", "4",
        "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
        "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--dropout", "0.3",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", "0.005", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2000", "--warmup-init-lr", "1e-07",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "4096", "--patience", "10",
        "--seed", "1", "--cpu", "--num-workers", "0",
        "--save-dir", str(save_dir), "--keep-last-epochs", str(AVERAGE_LAST),
        "--stop-time-hours", f"{minutes / 60:.6f}",
        "--log-format", "json", "--log-interval", "50", "--no-progress-bar",
    ]
    if max_updates:
        args += ["--max-update", str(max_updates)]
    return args


def rpr_mt_train_args(toolkit: str, work: Path, run: Path, data_dir: Path, *, minutes: float,
                      max_updates: Optional[int], save_every: Optional[int]) -> list[str]:
    """``rpr-mt train``'s arguments: the recipe file as it is (its comments say where each setting comes from), its
    data and run directories moved here, and the wall-clock budget as train.max_time."""
    sets = {"data.multi30k_dir": data_dir, "data.output_dir": work / "data", "train.run_dir": run,
            "train.max_time": minutes * 60}
    if max_updates:
        sets["train.max_steps"] = max_updates
    if save_every:
        sets["train.save_every"] = save_every
    args = ["train", "--config", str(RECIPES[toolkit]), "--no-progress"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


# ------------------------------------------------------------------------------------------------------------------
# Logs (pure)
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Progress:
    updates: int = 0  # the last update the log reports
    tgt_tokens: float = 0.0  # target tokens consumed over those updates


_ONMT_STEP = re.compile(r"Step (\d+)/\s*\d+;.*?bsz:\s*([\d.]+)/\s*([\d.]+)/\s*([\d.]+);")


def parse_onmt_log(lines: Iterable[str]) -> Progress:
    """OpenNMT-py's report lines ("Step 100/1000000; acc: ...; bsz: 1803/1973/128; ..."): bsz's second figure is the
    mean target tokens per update over the updates since the previous report."""
    progress = Progress()
    for line in lines:
        match = _ONMT_STEP.search(line)
        if match:
            step, tgt_per_update = int(match.group(1)), float(match.group(3))
            progress.tgt_tokens += tgt_per_update * (step - progress.updates)
            progress.updates = step
    return progress


def parse_fairseq_log(lines: Iterable[str]) -> Progress:
    """fairseq-train's JSON epoch summaries ("| train | {"epoch": 3, "train_wpb": "3012.4", "train_num_updates":
    "372", ...}"), logged at each epoch's end and when the run stops inside one: wpb is the mean target tokens per
    update of that epoch."""
    progress = Progress()
    for line in lines:
        if "| train |" not in line:
            continue
        record = json.loads(line[line.index("{"):])
        updates = int(float(record["train_num_updates"]))
        progress.tgt_tokens += float(record["train_wpb"]) * (updates - progress.updates)
        progress.updates = updates
    return progress


def parse_rpr_mt_metrics(lines: Iterable[str]) -> Progress:
    """rpr-mt's metrics.jsonl training records ({"step", "tgt_tok_s", "elapsed", ...}): each window's tokens are its
    rate times its seconds (the elapsed time since the previous record)."""
    progress, last_elapsed = Progress(), 0.0
    for line in lines:
        record = json.loads(line)
        if "tgt_tok_s" not in record:
            continue  # a validation record
        progress.tgt_tokens += record["tgt_tok_s"] * (record["elapsed"] - last_elapsed)
        progress.updates, last_elapsed = int(record["step"]), record["elapsed"]
    return progress


def rpr_mt_stop_reason(lines: Iterable[str]) -> Optional[str]:
    """Why ``rpr-mt train`` ended ("stopped by max_time at update 5321 ..."): max_time where the hour ran out before
    the recipe's updates, max_steps where they were done within it."""
    for line in lines:
        match = re.match(r"stopped by (\w+) at update", line)
        if match:
            return match.group(1)
    return None


def parse_fairseq_hypotheses(lines: Iterable[str]) -> list[str]:
    """fairseq-generate's "H-<id>\\t<score>\\t<pieces>" lines, in input order."""
    found: dict[int, str] = {}
    for line in lines:
        if line.startswith("H-"):
            head, _, rest = line.rstrip("\n").partition("\t")
            found[int(head[2:])] = rest.partition("\t")[2]
    missing = [i for i in range(len(found)) if i not in found]
    if missing:
        raise UserError(f"fairseq-generate's output has no hypothesis for line {missing[0]}")
    return [found[i] for i in range(len(found))]


def last_checkpoints(paths: Iterable[Path], pattern: str, count: int = AVERAGE_LAST) -> list[Path]:
    """The ``count`` highest-numbered of ``paths`` whose name matches ``pattern`` (one group: the number)."""
    numbered = []
    for path in paths:
        match = re.fullmatch(pattern, path.name)
        if match:
            numbered.append((int(match.group(1)), path))
    return [path for _, path in sorted(numbered)[-count:]]


def table_row(result: dict) -> str:
    def bleu(split: str, key: str) -> str:
        scores = result.get("scores", {}).get(split)
        return f"{scores[key]:.2f}" if scores else "-"

    return (f"| {result['toolkit']} | {result['updates']:,} | {result['tgt_tokens_per_s']:,.0f} | "
            f"{result['peak_rss_mb']:,.0f} | {bleu('dev', 'lc_tok_bleu')} | {bleu('test', 'lc_tok_bleu')} | "
            f"{bleu('test', 'sacrebleu')} | {result['train_seconds']:,.0f} |")


TABLE_HEADER = ("| toolkit | updates | target tok/s | peak RSS MB | dev lit. BLEU | test_2016 lit. BLEU | "
                "test_2016 sacreBLEU | train s |\n|---|---|---|---|---|---|---|---|")


# ------------------------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------------------------


def tree_rss_kb(root: int) -> int:
    """The sum of VmRSS (KiB) over ``root`` and its descendants, read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in members]
        members.update(children)
        frontier.extend(children)
    total = 0
    for pid in members:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


@dataclass
class Finished:
    seconds: float
    peak_rss_mb: float
    returncode: int
    stopped_by: str  # itself | budget (SIGTERM)
    command: list[str] = field(default_factory=list)


def run_measured(command: list[str], log: Path, env: dict, *, budget: Optional[float], grace: float = 0.0,
                 cwd: Optional[Path] = None) -> Finished:
    """Run ``command`` (stdout and stderr to ``log``), sampling its process tree's resident memory; with ``budget``,
    send SIGTERM to its process group at budget + grace seconds (then SIGKILL 60 s later)."""
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        peak, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tree_rss_kb(proc.pid))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        stopped_by = "itself"
        try:
            proc.wait(timeout=None if budget is None else budget + grace)
        except subprocess.TimeoutExpired:
            stopped_by = "budget"
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            stop.set()
            sampler.join()
    return Finished(time.monotonic() - start, peak[0] / 1024, proc.returncode, stopped_by, command)


def run_step(command: list[str], log: Path, env: dict, cwd: Optional[Path] = None) -> None:
    """A preparation or decoding step: its output to ``log``; a failure is a one-line error naming the log."""
    finished = run_measured(command, log, env, budget=None, cwd=cwd)
    if finished.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise UserError(f"{Path(command[0]).name} failed (exit {finished.returncode}); see {log}: {tail[0][:200]}")


def rpr_mt_command() -> list[str]:
    return [sys.executable, "-m", "rpr_mt.cli"]


def base_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def peer_env(choice: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer's venv only
    if choice == "same":
        env.update(SAME_ENV)
    else:
        for key in SAME_ENV:
            env.pop(key, None)
    # torch >= 2.6 loads checkpoints weights_only by default; OpenNMT-py 3.5's and fairseq 0.12's hold Python
    # objects (their options), and neither passes weights_only=False
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    return env


def venv_tool(venv: Path, name: str) -> str:
    path = venv / "bin" / name
    if not path.is_file():
        raise UserError(f"{path} not found: install the peer in {venv} (results/peers/README.md), or pass --venv")
    return str(path)


# ------------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------------


def prepare_data(work: Path, data_dir: Path) -> Path:
    """rpr-mt's prepared data of the recipe in work/data, and its splits as piece text in work/pieces."""
    for prefix in SPLITS.values():
        for lang in (SRC, TGT):
            path = data_dir / "tok" / f"{prefix}.{lang}.gz"
            if not path.is_file():
                raise UserError(f"{path} not found: --data-dir must hold Multi30k's tok/ files")
    if not (data_dir / "tok" / f"train.{SRC}.gz").is_file():
        raise UserError(f"{data_dir / 'tok' / f'train.{SRC}.gz'} not found: --data-dir must hold Multi30k's tok/ files")
    work.mkdir(parents=True, exist_ok=True)
    run_step(rpr_mt_command() + ["prepare", "--config", str(RECIPES["rpr-mt-fp32"]), "--no-progress",
                                 "--set", f"data.multi30k_dir={data_dir}", "--set", f"data.output_dir={work / 'data'}"],
             work / "prepare.log", base_env())
    pieces = work / "pieces"
    done = pieces / "done"
    if done.is_file() and done.read_text() == (work / "data" / "manifest.json").read_text():
        return pieces
    from rpr_mt.data.binarize import load_split
    from rpr_mt.data.vocab import Vocab

    vocab = Vocab.load(work / "data")
    pieces.mkdir(exist_ok=True)
    for split in ("train", "dev", "test"):
        ids = load_split(work / "data", split)
        for side, lang in (("src", SRC), ("tgt", TGT)):
            get = ids.src if side == "src" else ids.tgt
            text = "".join(" ".join(vocab.piece(i) for i in get(n)) + "\n" for n in range(len(ids)))
            tmp = pieces / f".{split}.{lang}.tmp"
            tmp.write_text(text)
            tmp.replace(pieces / f"{split}.{lang}")
    done.write_text((work / "data" / "manifest.json").read_text())
    return pieces


def pieces_to_text(lines: Iterable[str], model: Path) -> list[str]:
    """Piece lines ("▁ein ▁mann ▁in ...") back to text, as rpr-mt decodes its own output (SentencePiece)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.decode([sp.piece_to_id(p) for p in line.split()]) for line in lines]


def score_file(hyp: Path, split: str, data_dir: Path, log: Path) -> dict:
    """rpr-mt eval-bleu on ``hyp`` against Multi30k's tok/ reference: literature BLEU and sacreBLEU (JSON)."""
    ref = data_dir / "tok" / f"{SPLITS[split]}.{TGT}.gz"
    command = rpr_mt_command() + ["eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--pretokenized", "--json"]
    run_step(command, log, base_env())
    return json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])


# ------------------------------------------------------------------------------------------------------------------
# Toolkits
# ------------------------------------------------------------------------------------------------------------------


def run_onmt(args, work: Path, run: Path) -> tuple[Finished, Progress, dict[str, Path], dict]:
    import yaml

    venv = args.venv or DEFAULT_VENVS["onmt"]
    env = peer_env(args.peer_env)
    config = run / "onmt.yaml"
    config.write_text(yaml.safe_dump(onmt_config(work, run, max_updates=args.max_updates,
                                                 save_every=args.save_every), sort_keys=False))
    run_step([venv_tool(venv, "onmt_build_vocab"), "-config", str(config), "-n_sample", "-1"], run / "vocab.log", env)
    finished = run_measured([venv_tool(venv, "onmt_train"), "-config", str(config)], run / "train.log", env,
                            budget=args.minutes * 60)
    progress = parse_onmt_log(open(run / "train.log", errors="replace"))
    # SIGTERM can land inside a save: a cut-off file is not a whole zip archive (torch's format), and is left out
    whole = [path for path in run.glob("model_step_*.pt") if zipfile.is_zipfile(path)]
    chosen = last_checkpoints(whole, r"model_step_(\d+)\.pt")
    if not chosen:
        raise UserError(f"OpenNMT-py saved no checkpoint in {run} (see {run / 'train.log'})")
    model = chosen[-1]
    if len(chosen) > 1:
        model = run / "average.pt"
        run_step([venv_tool(venv, "onmt_average_models"), "-models", *map(str, chosen), "-output", str(model)],
                 run / "average.log", env)
    hyps = {}
    for split in SPLITS:
        out = run / f"hyp.{split}.pieces"
        source = work / "pieces" / f"{split}.{SRC}"
        run_step([venv_tool(venv, "onmt_translate"), "-model", str(model), "-src", str(source),
                  "-output", str(out), "-beam_size", str(BEAM), "-batch_size", "64", "-batch_type", "sents"],
                 run / f"translate.{split}.log", env)
        hyps[split] = out
    return finished, progress, hyps, {"averaged": [p.name for p in chosen], "settings": "onmt.yaml"}


FAIRSEQ_AVERAGE = """
import collections, sys, torch
# fairseq's scripts/average_checkpoints.py (not in its PyPI package): each parameter's mean over the checkpoints,
# the rest of the state from the last one
paths, out = sys.argv[1:-1], sys.argv[-1]
total, state = collections.OrderedDict(), None
for path in paths:
    state = torch.load(path, map_location="cpu")
    for key, value in state["model"].items():
        value = value.float() if value.is_floating_point() else value
        total[key] = total[key] + value if key in total else value.clone()
state["model"] = collections.OrderedDict(
    (k, v / len(paths) if v.is_floating_point() else v) for k, v in total.items())
torch.save(state, out)
"""


def run_fairseq(args, work: Path, run: Path) -> tuple[Finished, Progress, dict[str, Path], dict]:
    venv = args.venv or DEFAULT_VENVS["fairseq"]
    env = peer_env(args.peer_env)
    pieces, bin_dir, save_dir = work / "pieces", run / "bin", run / "checkpoints"
    run_step([venv_tool(venv, "fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT,
              "--trainpref", str(pieces / "train"), "--validpref", str(pieces / "dev"),
              "--testpref", str(pieces / "test"), "--destdir", str(bin_dir), "--joined-dictionary", "--workers", "1"],
             run / "preprocess.log", env)
    finished = run_measured([venv_tool(venv, "fairseq-train"),
                             *fairseq_train_args(bin_dir, save_dir, minutes=args.minutes,
                                                 max_updates=args.max_updates)],
                            run / "train.log", env, budget=args.minutes * 60, grace=300)
    progress = parse_fairseq_log(open(run / "train.log", errors="replace"))
    chosen = last_checkpoints(save_dir.glob("checkpoint*.pt"), r"checkpoint(\d+)\.pt")
    if not chosen:  # a run shorter than an epoch: its last checkpoint
        chosen = [save_dir / "checkpoint_last.pt"]
        if not chosen[0].is_file():
            raise UserError(f"fairseq saved no checkpoint in {save_dir} (see {run / 'train.log'})")
    model = chosen[-1]
    if len(chosen) > 1:
        model = run / "average.pt"
        run_step([str(venv / "bin" / "python"), "-c", FAIRSEQ_AVERAGE, *map(str, chosen), str(model)],
                 run / "average.log", env)
    hyps = {}
    for split, subset in (("dev", "valid"), ("test", "test")):
        log = run / f"generate.{split}.log"
        # pieces out (no --remove-bpe): they are turned into text the same way for every toolkit
        run_step([venv_tool(venv, "fairseq-generate"), str(bin_dir), "--path", str(model), "--gen-subset", subset,
                  "--beam", str(BEAM), "--batch-size", "128", "--cpu", "--source-lang", SRC, "--target-lang", TGT],
                 log, env)
        out = run / f"hyp.{split}.pieces"
        out.write_text("".join(h + "\n" for h in parse_fairseq_hypotheses(open(log, errors="replace"))))
        hyps[split] = out
    return finished, progress, hyps, {"averaged": [p.name for p in chosen]}


def run_rpr_mt(args, work: Path, run: Path, data_dir: Path) -> tuple[Finished, Progress, dict[str, Path], dict]:
    env = base_env()
    finished = run_measured(rpr_mt_command() + rpr_mt_train_args(
        args.toolkit, work, run / "run", data_dir, minutes=args.minutes, max_updates=args.max_updates,
        save_every=args.save_every), run / "train.log", env, budget=args.minutes * 60, grace=300)
    progress = parse_rpr_mt_metrics(open(run / "run" / "metrics.jsonl"))
    # train.average_last's mean of the last 10 checkpoints (rpr_mt/checkpoint_files.py names it), else the last
    which = "average" if (run / "run" / "checkpoints" / "checkpoint_avg.pt").is_file() else "last"
    hyps = {}
    for split in SPLITS:
        out = run / f"hyp.{split}.txt"
        run_step(rpr_mt_command() + ["eval-bleu", "--checkpoint", str(run / "run"), "--which", which,
                                     "--split", split, "--save-hyp", str(out), "--no-progress", "--json"],
                 run / f"translate.{split}.log", env)
        hyps[split] = out
    stopped = rpr_mt_stop_reason(open(run / "train.log", errors="replace"))
    return finished, progress, hyps, {"which": which, "trainer_stopped_by": stopped}


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings a row ran under, as its result.json records them ({} for the C library's malloc)."""
    return {name: environ[name] for name in ALLOCATOR_ENV if environ.get(name)}


def toolkit_version(toolkit: str, venv: Optional[Path]) -> str:
    if toolkit.startswith("rpr-mt"):
        import torch

        import rpr_mt

        return f"rpr-mt {rpr_mt.__version__}, torch {torch.__version__}"
    package = {"onmt": "OpenNMT-py", "fairseq": "fairseq"}[toolkit]
    python = str((venv or DEFAULT_VENVS[toolkit]) / "bin" / "python")
    probe = ("import importlib.metadata as m, sys; "
             f"print('{package}', m.version('{package}'), 'torch', m.version('torch'), "
             "'Python', sys.version.split()[0])")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


@reports_user_errors
def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    out = args.out
    work = args.work or out / "work"
    run = out / args.toolkit
    if args.toolkit in DEFAULT_VENVS:
        venv_tool(args.venv or DEFAULT_VENVS[args.toolkit], "python")  # before any work
    run.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    run = run.resolve()
    pieces = prepare_data(work, data_dir)
    if args.toolkit == "onmt":
        finished, progress, hyps, extra = run_onmt(args, work, run)
    elif args.toolkit == "fairseq":
        finished, progress, hyps, extra = run_fairseq(args, work, run)
    else:
        finished, progress, hyps, extra = run_rpr_mt(args, work, run, data_dir)
    scores = {}
    for split, hyp in hyps.items():
        if hyp.name.endswith(".pieces"):
            text = hyp.with_name(f"hyp.{split}.txt")
            text.write_text("".join(line + "\n" for line in pieces_to_text(open(hyp), work / "data" / "spm.model")))
            hyp = text
        scores[split] = score_file(hyp, split, data_dir, run / f"score.{split}.json")
    result = {
        "toolkit": args.toolkit, "version": toolkit_version(args.toolkit, args.venv),
        "minutes": args.minutes, "max_updates": args.max_updates, "peer_env": args.peer_env,
        "allocator_env": allocator_env(os.environ),
        "stopped_by": finished.stopped_by, "returncode": finished.returncode,
        "updates": progress.updates, "tgt_tokens": round(progress.tgt_tokens),
        "train_seconds": finished.seconds, "tgt_tokens_per_s": progress.tgt_tokens / max(finished.seconds, 1e-9),
        "peak_rss_mb": finished.peak_rss_mb, "train_command": finished.command, "pieces": str(pieces),
        "scores": {split: {k: s[k] for k in ("lc_tok_bleu", "sacrebleu", "chrf", "sacrebleu_signature", "lines")}
                   for split, s in scores.items()},
        **extra,
    }
    tmp = run / ".result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(run / "result.json")
    print(TABLE_HEADER)
    print(table_row(result))


if __name__ == "__main__":
    main()
