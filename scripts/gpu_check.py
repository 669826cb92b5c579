"""Everything that needs a GPU, in one command (``scripts/gpu_check.sh`` runs it). Measured on one H200
(2026-11-26): tests 117 s, trainer 219 s (with longer runs than today's: demo 600 and 300 updates, Multi30k 1,000),
ddp 15 s, train 53 s (two repeats; now three, with a replayed warm-up: about 2 minutes), bench 37 s; so about
6 minutes now, plus the machine's start. With a 15-minute lease, run it once whole and re-run single parts
(--parts) if one fails.

1. tests    the GPU unit tests (pytest -m gpu: float32 and bfloat16 exactness of the Triton kernels and of the torch
            path against a float64 reference, seeded dropout, cached decoding equal to full decoding, SDPA for
            content attention, the CUDA default policy); with --all-tests also every Triton kernel test (-m triton)
2. trainer  the real CLI on one GPU: ``rpr-mt prepare`` + ``train`` of the demo in bf16 and in fp16 (GradScaler), and
            with --multi30k-dir the literature recipe (configs/multi30k_en_de_lit.yaml) for --multi30k-steps updates in
            bf16; each then ``eval-bleu --checkpoint --device cuda`` (beam search with the KV cache on the GPU)
3. ddp      torchrun with NCCL: a DistributedDataParallel worker on every GPU (parameters must agree after the
            updates), and with two or more GPUs also ``rpr-mt train`` itself under torchrun on the demo corpus
4. train    a short WMT-shaped training run of the base models (benchmarks/bench_gpu_train.py) in bf16: absolute,
            relative on the torch path and relative on the Triton kernels, with the split and the serial backward
            pass (RPR_MT_TRITON_BACKWARD); target tokens/s and peak memory
5. bench    the attention benchmark (benchmarks/bench_gpu_attention.py): Triton kernel vs torch path vs SDPA
            flash, forward+backward at L = 64 ... 1024

It prints one table: every check, its result and the issue's goal (Shaw K+V fwd+bwd <= 1.3x SDPA flash at
L = 128-512; training tokens/s relative / absolute >= 0.93; peak memory relative <= 1.1x absolute), the paper's
runs costed from the measured tokens/s, then the detailed tables. The same Markdown goes to --out, ready for
docs/benchmarks.md, rewritten after every part, so a run cut off by a time limit still leaves what it measured.

    scripts/gpu_check.sh --multi30k-dir ../shared/data/multi30k   # everything
    scripts/gpu_check.sh --parts tests bench   # some parts
    scripts/gpu_check.sh --dry-run             # no GPU needed: the plan and the table's form (CI runs this)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmarks' shared argument types, beside the ones it runs
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

from rpr_mt.errors import UserError  # noqa: E402

PARTS = ("tests", "trainer", "ddp", "train", "bench")
ATTENTION_GOAL = 1.3  # Shaw K+V forward+backward / SDPA flash, L = 128-512
ATTENTION_GOAL_LENGTHS = (128, 256, 512)
# Seconds one command of each part may take: a few times what it took on an H200 (tests 117 s, a trainer command
# under 100 s, ddp 15 s, train 53 s with two repeats, bench 37 s), so that --all-tests and --presets big fit too.
PART_TIMEOUTS = {"tests": 900, "trainer": 300, "ddp": 300, "train": 1200, "bench": 600}
SPEED_GOAL = 0.93  # training tokens/s, relative / absolute
MEMORY_GOAL = 1.1  # peak memory, relative / absolute
# The paper's runs (Shaw et al. 2018 after Vaswani et al. 2017): updates of ~25,000 target tokens.
PAPER_RUNS = {"base": 100_000, "big": 300_000}
UPDATE_TOKENS = 25_000
PER_GPU_TOKENS = UPDATE_TOKENS // 8  # one GPU's share of an update on 8 GPUs
# the training part's rows: both relative-attention paths, and the Triton kernels with the serial backward pass
TRAIN_SCHEMES = ("absolute", "relative-torch", "relative-triton", "relative-triton-serial")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the table's form; needs no GPU")
    parser.add_argument("--all-tests", action="store_true", help="also run every Triton kernel test on the GPU")
    parser.add_argument("--presets", nargs="+", choices=["base", "big"], default=["base"],
                        help="models of the training part (big adds about 2 minutes)")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--gpus", type=positive_int, default=None,
                        help="processes for the torchrun part (default: all GPUs)")
    parser.add_argument("--multi30k-dir", default=None,
                        help="trainer part: Multi30k's files (as ../shared/data/multi30k, with tok/) for the recipe run")
    parser.add_argument("--multi30k-steps", type=positive_int, default=600,
                        help="trainer part: updates of the recipe run")
    parser.add_argument("--part-timeout", type=positive_int, default=None,
                        help="seconds each command of a part may take (default: per part, PART_TIMEOUTS)")
    parser.add_argument("--out", default=None, help="write the Markdown here (default runs/gpu_check/<time>.md)")
    parser.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)  # the torchrun child
    parser.add_argument("--ddp-device", choices=["cuda", "cpu"], default="cuda", help=argparse.SUPPRESS)  # cpu: gloo
    return parser.parse_args(argv)


def check_paths(args: argparse.Namespace) -> None:
    """Refuse a --multi30k-dir without the recipe's files and an --out that cannot be written, before the first part
    (else `rpr-mt prepare` or the first table write finds them, minutes in). Creates nothing."""
    if args.multi30k_dir is not None:
        root = Path(args.multi30k_dir)
        if not root.is_dir():
            raise UserError(f"--multi30k-dir {root}: no such directory")
        from rpr_mt.config import load_config
        from rpr_mt.data.sources import local_inputs

        # the files the recipe run reads, as the data pipeline names them
        data = load_config(REPO / "configs" / "multi30k_en_de_lit.yaml", [f"data.multi30k_dir={root}"]).data
        missing = [path for path in local_inputs(data).values() if not path.is_file()]
        if missing:
            raise UserError(f"--multi30k-dir {root}: missing {missing[0].relative_to(root)}"
                            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                            + " (the recipe reads tok/{train,val,test_2016_flickr}.{en,de}.gz)")
    if args.out is not None:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {out} is a directory; give a file, e.g. {out / 'gpu_check.md'}")
        parent = out.parent
        while not parent.exists():  # the nearest existing folder must be one this user can create folders in
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"--out {out}: cannot create its directory ({parent} is "
                            f"{'not a directory' if not parent.is_dir() else 'not writable'})")


# ----------------------------------------------------------------------------------------------------------------------
# The parts
# ----------------------------------------------------------------------------------------------------------------------


def environment() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    info["gpu"] = torch.cuda.get_device_name(0) if info["gpus"] else "no GPU"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    return info


def child_env() -> dict:
    """The environment of the parts' processes: this checkout first on the path, the real GPU (no interpreter)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_logged(command: list[str], log: Path, timeout: int) -> tuple[int, str, float]:
    """Run ``command`` in the repository, output to ``log`` (and echoed); (exit status, output, seconds)."""
    print(f"$ {' '.join(command)}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        code, output = 124, f"{error.stdout or ''}{error.stderr or ''}\ntimed out after {timeout} s"
    log.write_text(output)
    tail = "\n".join(output.strip().splitlines()[-15:])
    print(tail, flush=True)
    return code, output, time.monotonic() - start


def part_tests(work: Path, all_tests: bool, timeout: int) -> dict:
    marker = "gpu or triton" if all_tests else "gpu"
    code, output, seconds = run_logged(
        [sys.executable, "-m", "pytest", "-q", "-m", f"({marker}) and not slow", "tests/model"],
        work / "tests.log", timeout=timeout)
    summary = next((line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", summary)}
    return {"ok": code == 0 and counts.get("passed", 0) > 0, "marker": marker, "counts": counts,
            "seconds": seconds, "summary": summary.strip("= ")}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rpr_mt.cli", *args]


def _sets(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def _training_records(run_dir: Path) -> list[dict]:
    """A run's training records, through the trainer's own reader (a cut-off last line is not a failure; a corrupt
    file raises UserError)."""
    from rpr_mt.run_metrics import read_records

    metrics = run_dir / "metrics.jsonl"
    return [r for r in read_records(metrics) if "tgt_tok_s" in r] if metrics.is_file() else []


def _last_speed(run_dir: Path) -> dict:
    """A run's last update, its median target tokens/s over the last half of its logged windows (a GPU's first
    epoch is several times slower: new batch shapes), and its peak memory."""
    try:
        records = _training_records(run_dir)
    except UserError:
        records = []
    last = records[-1] if records else {}
    speeds = [r["tgt_tok_s"] for r in records[len(records) // 2:]]
    return {"updates": last.get("step"), "tgt_tok_s": statistics.median(speeds) if speeds else None,
            "peak_mb": max((r.get("peak_mem_mb") or 0 for r in records), default=None)}


def trainer_run(work: Path, name: str, config: str, data_settings: list[str], train_settings: list[str],
                timeout: int, which: str = "last", device: str = "cuda") -> dict:
    """``rpr-mt train`` of ``config`` on the GPU, then ``eval-bleu --checkpoint`` of its test split on the GPU
    (``device`` cpu: a test of this code on a machine without one)."""
    data, run_dir = work / f"{name}_data", work / f"{name}_run"
    data_sets = _sets([f"data.output_dir={data}", *data_settings])
    result: dict = {"name": name, "ok": False}
    if not (data / "manifest.json").is_file():
        code, _, seconds = run_logged(_cli("prepare", "--config", config, "--no-progress", *data_sets),
                                      work / f"{name}_prepare.log", timeout)
        result["prepare_s"] = seconds
        if code != 0:
            return {**result, "error": "prepare failed"}
    settings = [f"train.run_dir={run_dir}", f"train.device={device}", *train_settings]
    code, _, seconds = run_logged(_cli("train", "--config", config, "--no-progress", *data_sets, *_sets(settings)),
                                  work / f"{name}_train.log", timeout)
    result.update(train_s=seconds, **_last_speed(run_dir))
    if code != 0:
        return {**result, "error": "train failed"}
    code, output, seconds = run_logged(_cli("eval-bleu", "--checkpoint", str(run_dir), "--which", which, "--split",
                                            "test", "--device", device, "--json", "--no-progress"),
                                       work / f"{name}_eval.log", timeout)
    result["eval_s"] = seconds
    scores = _json_object(output)
    if code != 0 or scores is None:
        return {**result, "error": "eval-bleu failed"}
    return {**result, "ok": True, "bleu": scores.get("sacrebleu"), "lc_tok_bleu": scores.get("lc_tok_bleu")}


def _json_object(output: str) -> dict | None:
    """The JSON object eval-bleu --json printed (the last line that parses)."""
    for line in reversed(output.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def part_trainer(work: Path, multi30k_dir: str | None, multi30k_steps: int, timeout: int) -> dict:
    """The product on one GPU, as a user runs it: prepare, train (bf16; fp16 with its GradScaler), eval-bleu."""
    demo = ["train.validate_every=150", "train.save_every=150", "train.log_every=50"]
    runs = [trainer_run(work, "demo_bf16", "configs/demo.yaml", [], [*demo, "train.precision=bf16",
                                                                      "train.max_steps=300"], timeout)]
    # the fp16 run reuses the bf16 run's prepared data
    (work / "demo_fp16_data").symlink_to(work / "demo_bf16_data")
    runs.append(trainer_run(work, "demo_fp16", "configs/demo.yaml", [], [*demo, "train.precision=fp16",
                                                                         "train.max_steps=150"], timeout))
    if multi30k_dir:
        runs.append(trainer_run(work, "multi30k_lit", "configs/multi30k_en_de_lit.yaml",
                                [f"data.multi30k_dir={Path(multi30k_dir).resolve()}"],
                                ["train.precision=bf16", f"train.max_steps={multi30k_steps}",
                                 f"train.validate_every={max(1, multi30k_steps // 2)}", "train.save_every=250",
                                 "train.log_every=100"], timeout, which="average"))
    return {"ok": all(r["ok"] for r in runs), "runs": runs}


def part_train(work: Path, presets: list[str], timeout: int) -> dict:
    out = work / "train.json"
    code, _, seconds = run_logged([sys.executable, "benchmarks/bench_gpu_train.py", "--presets", *presets,
                                   "--schemes", *TRAIN_SCHEMES, "--json", str(out)], work / "train.log",
                                  timeout=timeout)
    result = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    return {"ok": code == 0, "seconds": seconds, **result}


def part_bench(work: Path, lengths: list[int], timeout: int) -> dict:
    out = work / "bench.json"
    code, _, seconds = run_logged([sys.executable, "benchmarks/bench_gpu_attention.py", "--lengths",
                                   *map(str, lengths), "--json", str(out)], work / "bench.log", timeout=timeout)
    result = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    return {"ok": code == 0, "seconds": seconds, **result}


def torchrun() -> list[str]:
    # torchrun through this interpreter: a `torchrun` found on PATH may belong to another Python (no torch, or
    # another torch) when this one is an unactivated virtualenv's.
    return [sys.executable, "-m", "torch.distributed.run"]


def part_ddp(work: Path, gpus: int, timeout: int) -> dict:
    """NCCL all-reduce through DDP on ``gpus`` processes; with >= 2 GPUs also the trainer itself under torchrun."""
    report = work / "ddp.json"
    command = [*torchrun(), "--standalone", "--nproc_per_node", str(gpus), "scripts/gpu_check.py", "--ddp-worker",
               "--out", str(report)]
    code, _, seconds = run_logged(command, work / "ddp.log", timeout=timeout)
    result = json.loads(report.read_text()) if report.is_file() else {}
    result.update(ok=code == 0 and result.get("agree") is True, gpus=gpus, seconds=seconds)
    if gpus >= 2:
        result["trainer"] = trainer_under_torchrun(work, gpus)
        result["ok"] = result["ok"] and result["trainer"]["ok"]
    return result


def trainer_under_torchrun(work: Path, gpus: int) -> dict:
    """``rpr-mt train`` on the demo corpus with ``gpus`` processes (NCCL), bf16, about 30 seconds of updates."""
    data, run_dir = work / "demo_data", work / "demo_run"
    settings = [f"data.output_dir={data}", f"train.run_dir={run_dir}", "train.device=cuda", "train.precision=bf16",
                "train.max_time=30", "train.validate_every=100000", "train.save_every=100000", "train.valid_bleu=false",
                "train.valid_max_sentences=100", "train.max_tokens=8192"]
    sets = _sets(settings)
    code, _, _ = run_logged(_cli("prepare", "--config", "configs/demo.yaml", *sets[:2]), work / "demo_prepare.log",
                            timeout=300)
    if code != 0:
        return {"ok": False, "error": "prepare failed"}
    code, output, seconds = run_logged([*torchrun(), "--standalone", "--nproc_per_node", str(gpus), "-m",
                                        "rpr_mt.cli", "train", "--config", "configs/demo.yaml", *sets],
                                       work / "demo_train.log", timeout=600)
    try:
        records = _training_records(run_dir)
    except UserError as err:
        return {"ok": False, "error": str(err), "seconds": seconds}
    last = records[-1] if records else {}
    return {"ok": code == 0 and bool(records), "updates": last.get("step"), "tgt_tok_s": last.get("tgt_tok_s"),
            "seconds": seconds}


def ddp_worker(out: str, device_kind: str = "cuda") -> None:
    """The torchrun child: DDP over NCCL on a small relative-position model, a few bf16 updates on random data,
    then every rank's parameters are compared through an all-reduce. (device_kind "cpu": gloo, a test of this
    code on a machine without GPUs.)"""
    import torch
    import torch.distributed as dist

    from rpr_mt.config import config_from_dict
    from rpr_mt.model.transformer import Seq2Seq
    from rpr_mt.train.loss import TranslationLoss

    cuda = device_kind == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local)
    cfg = config_from_dict({"model": {"d_model": 128, "n_heads": 4, "encoder_layers": 2, "decoder_layers": 2,
                                      "ff_dim": 256, "positions": "relative", "clip": 8}}).model
    torch.manual_seed(0)
    model = Seq2Seq(cfg, 1000).to(device)
    module = torch.nn.parallel.DistributedDataParallel(TranslationLoss(model, 0.1),
                                                       device_ids=[local] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)  # every rank its own data: the all-reduce must agree them
    start = time.monotonic()
    for _ in range(5):
        src = torch.randint(4, 1000, (16, 30), generator=gen).to(device)
        tgt = torch.randint(4, 1000, (16, 31), generator=gen).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, _ = module(src, tgt[:, :-1], tgt[:, 1:])
        (loss / tgt[:, 1:].numel()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    agree = bool(torch.equal(low, high))
    if rank == 0:
        Path(out).write_text(json.dumps({"world": world, "backend": dist.get_backend(), "agree": agree,
                                         "updates": 5, "seconds": time.monotonic() - start}))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------------------


def verdict(value: float | None, goal: float, at_most: bool) -> str:
    if value is None:
        return "-"
    return "met" if (value <= goal if at_most else value >= goal) else "NOT met"


def _best_relative(rows: list[dict], preset: str, tokens: int) -> dict | None:
    """The faster relative row (torch path or Triton) of a training configuration."""
    candidates = [r for r in rows if r.get("model") == preset and r.get("max_tokens") == tokens
                  and r.get("scheme", "").startswith("relative") and r.get("tokens_per_s")]
    return max(candidates, key=lambda r: r["tokens_per_s"], default=None)


def _row(rows: list[dict], preset: str, tokens: int, scheme: str) -> dict | None:
    return next((r for r in rows if r.get("model") == preset and r.get("max_tokens") == tokens
                 and r.get("scheme") == scheme), None)


def summary_rows(results: dict, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(check, result, goal) for every part asked for; '-' where nothing was measured (--dry-run)."""
    rows: list[tuple[str, str, str]] = []
    if "tests" in args.parts:
        tests = results.get("tests")
        marker = "gpu or triton" if args.all_tests else "gpu"
        text = "-" if tests is None else f"{tests['summary'] or 'no summary'} ({tests['seconds']:.0f} s)"
        rows.append((f"GPU unit tests (pytest -m '{marker}')", text, "all pass"))
    if "trainer" in args.parts:
        names = ["demo_bf16", "demo_fp16"] + (["multi30k_lit"] if args.multi30k_dir else [])
        runs = {r["name"]: r for r in (results.get("trainer") or {}).get("runs", [])}
        for name in names:
            run = runs.get(name)
            text = "-"
            if run is not None:
                bleu = "" if run.get("bleu") is None else f", test BLEU {run['bleu']:.2f}"
                if run.get("lc_tok_bleu") is not None:
                    bleu += f" (literature BLEU {run['lc_tok_bleu']:.2f})"
                text = (f"{'ok' if run['ok'] else 'FAILED (' + run.get('error', '?') + ')'}: {run.get('updates')} "
                        f"updates, {run.get('tgt_tok_s') or 0:,.0f} tgt tok/s, peak {run.get('peak_mb') or 0:,.0f} MB, "
                        f"train {run.get('train_s', 0):.0f} s{bleu}")
            rows.append((f"rpr-mt train + eval-bleu on cuda: {name}", text, "ok"))
    if "ddp" in args.parts:
        ddp = results.get("ddp")
        text = "-"
        if ddp is not None:
            text = (f"{'ok' if ddp.get('ok') else 'FAILED'}: {ddp.get('world', ddp.get('gpus'))} process(es), "
                    f"backend {ddp.get('backend', '?')}, parameters equal on all ranks: {ddp.get('agree')}")
        rows.append(("torchrun + NCCL, DDP worker", text, "ok"))
        trainer = None if ddp is None else ddp.get("trainer")
        if trainer is not None:
            rows.append(("torchrun rpr-mt train (demo, bf16)",
                         f"{'ok' if trainer['ok'] else 'FAILED'}: {trainer.get('updates')} updates, "
                         f"{trainer.get('tgt_tok_s') or 0:,.0f} tgt tok/s", "ok"))
    if "train" in args.parts:
        train_rows = (results.get("train") or {}).get("rows", [])
        for preset in args.presets:
            for tokens in (PER_GPU_TOKENS, UPDATE_TOKENS):
                absolute = _row(train_rows, preset, tokens, "absolute")
                torch_path = _row(train_rows, preset, tokens, "relative-torch")
                kernel = _row(train_rows, preset, tokens, "relative-triton")
                best = _best_relative(train_rows, preset, tokens)
                speed = "-" if best is None else (
                    f"{best['ratio']:.3f} ({best['scheme']}; torch path {_fmt(torch_path, 'ratio')}, Triton "
                    f"{_fmt(kernel, 'ratio')}); absolute {_fmt(absolute, 'tokens_per_s', ',.0f')} tok/s")
                ratio = None if best is None else best["ratio"]
                rows.append((f"train {preset} bf16, {tokens:,} tokens/batch: tok/s relative / absolute", speed,
                             f">= {SPEED_GOAL} ({verdict(ratio, SPEED_GOAL, False)})"))
                memory = None if best is None else best.get("memory_ratio")
                rows.append((f"train {preset} bf16, {tokens:,} tokens/batch: peak memory relative / absolute",
                             "-" if memory is None else f"{memory:.3f} ({best['scheme']}, "
                                                        f"{best['peak_mib']:,.0f} MiB)",
                             f"<= {MEMORY_GOAL} ({verdict(memory, MEMORY_GOAL, True)})"))
    if "bench" in args.parts:
        bench_rows = {r["L"]: r for r in (results.get("bench") or {}).get("rows", [])}
        for length in args.lengths:
            row = bench_rows.get(length, {})
            ratio = row["kv_triton_ms"] / row["sdpa_ms"] if row.get("kv_triton_ms") and row.get("sdpa_ms") else None
            torch_ratio = row["kv_torch_ms"] / row["sdpa_ms"] if row.get("kv_torch_ms") and row.get("sdpa_ms") else None
            text = "-" if ratio is None else (f"{ratio:.2f}x ({row['kv_triton_ms']:.2f} vs {row['sdpa_ms']:.2f} ms; "
                                              f"torch path {'-' if torch_ratio is None else f'{torch_ratio:.2f}x'})")
            goal = f"<= {ATTENTION_GOAL} ({verdict(ratio, ATTENTION_GOAL, True)})" if length in ATTENTION_GOAL_LENGTHS \
                else "(no goal)"
            rows.append((f"attention L={length} bf16: Shaw K+V Triton / SDPA flash, fwd+bwd", text, goal))
    if "train" in args.parts:
        rows.extend(cost_rows((results.get("train") or {}).get("rows", []), args.presets))
    return rows


def _fmt(row: dict | None, key: str, spec: str = ".3f") -> str:
    return "-" if row is None or row.get(key) is None else format(row[key], spec)


def cost_rows(train_rows: list[dict], presets: list[str]) -> list[tuple[str, str, str]]:
    """GPU-hours of the paper's runs from the measured tokens/s at one GPU's share of an 8-GPU update
    (communication not included)."""
    rows = []
    for preset in presets:
        updates = PAPER_RUNS[preset]
        for scheme in ("absolute", "relative"):
            row = _row(train_rows, preset, PER_GPU_TOKENS, scheme) if scheme == "absolute" else \
                _best_relative(train_rows, preset, PER_GPU_TOKENS)
            rate = None if row is None else row.get("tokens_per_s")
            text = "-"
            if rate:
                gpu_hours = updates * UPDATE_TOKENS / rate / 3600
                text = f"{gpu_hours:,.0f} GPU-hours ({gpu_hours / 8:,.1f} h on 8 GPUs)"
            rows.append((f"cost: {preset} {scheme}, {updates:,} updates x {UPDATE_TOKENS:,} tokens", text,
                         "from the measured tok/s"))
    return rows


def render(results: dict, args: argparse.Namespace, env: dict) -> str:
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"### GPU check: {env['gpu']} x {env['gpus']}, torch {env['torch']} (CUDA {env['cuda']}), "
             f"triton {env['triton']}, {when}" + (" (dry run: nothing measured)" if args.dry_run else ""), "",
             "| check | result | goal |", "|:---|:---|:---|"]
    lines += [f"| {check} | {result} | {goal} |" for check, result, goal in summary_rows(results, args)]
    for name in ("train", "bench"):
        part = results.get(name)
        if part and part.get("rows"):
            module = _bench_module(name)
            lines += ["", part.get("setup", ""), "", module.header()] + [module.table_row(r) for r in part["rows"]]
    return "\n".join(lines) + "\n"


def _bench_module(name: str):
    import importlib.util

    path = REPO / "benchmarks" / ("bench_gpu_train.py" if name == "train" else "bench_gpu_attention.py")
    spec = importlib.util.spec_from_file_location(f"_gpu_check_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def plan(args: argparse.Namespace, gpus: int) -> list[str]:
    marker = "gpu or triton" if args.all_tests else "gpu"
    steps = {
        "tests": f"python -m pytest -q -m '({marker}) and not slow' tests/model",
        "trainer": "rpr-mt prepare/train/eval-bleu --device cuda: configs/demo.yaml in bf16 and fp16"
                   + (f", configs/multi30k_en_de_lit.yaml for {args.multi30k_steps} updates in bf16"
                      if args.multi30k_dir else ""),
        "train": f"python benchmarks/bench_gpu_train.py --presets {' '.join(args.presets)} "
                 f"--schemes {' '.join(TRAIN_SCHEMES)} --json WORK/train.json",
        "ddp": f"torchrun --standalone --nproc_per_node {gpus} scripts/gpu_check.py --ddp-worker"
               + ("; rpr-mt prepare + torchrun ... -m rpr_mt.cli train --config configs/demo.yaml"
                  if gpus >= 2 else ""),
        "bench": f"python benchmarks/bench_gpu_attention.py --lengths {' '.join(map(str, args.lengths))} "
                 "--json WORK/bench.json",
    }
    return [f"{part}: {steps[part]}" for part in args.parts]


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ddp_worker:
        ddp_worker(args.out, args.ddp_device)
        return 0
    check_paths(args)
    env = environment()
    if args.gpus is not None and 0 < env["gpus"] < args.gpus and not args.dry_run:
        raise UserError(f"--gpus {args.gpus}: this machine has {env['gpus']} GPU(s)")
    gpus = args.gpus or max(env["gpus"], 1)
    if args.dry_run:
        print("# plan (WORK: a fresh directory under runs/gpu_check)")
        print("\n".join(plan(args, gpus)))
        print()
        print(render({}, args, env), end="")
        return 0
    if env["gpus"] == 0:
        print("no CUDA device here: nothing to check (scripts/gpu_check.sh --dry-run shows the plan)", file=sys.stderr)
        return 2
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix=f"gpu_check_{stamp}_", dir=REPO / "runs" if (REPO / "runs").is_dir() else None))
    out = Path(args.out) if args.out else REPO / "runs" / "gpu_check" / f"{stamp}.md"
    results: dict = {}
    start = time.monotonic()
    for part in (p for p in PARTS if p in args.parts):  # tests first: a broken kernel shows before the timings
        print(f"\n## {part}", flush=True)
        timeout = args.part_timeout or PART_TIMEOUTS[part]
        if part == "tests":
            results["tests"] = part_tests(work, args.all_tests, timeout)
        elif part == "trainer":
            results["trainer"] = part_trainer(work, args.multi30k_dir, args.multi30k_steps, timeout)
        elif part == "train":
            results["train"] = part_train(work, args.presets, timeout)
        elif part == "ddp":
            results["ddp"] = part_ddp(work, gpus, timeout)
        elif part == "bench":
            results["bench"] = part_bench(work, args.lengths, timeout)
        out.parent.mkdir(parents=True, exist_ok=True)  # after every part: a run cut off still leaves its table
        out.write_text(render(results, args, env) + f"\n(gpu_check: cut off after {part}?)\n")
        (work / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=1, default=str))
    text = render(results, args, env)
    text += f"\n(gpu_check: {time.monotonic() - start:.0f} s; logs in {work})\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    (work / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=1, default=str))
    print("\n" + text)
    print(f"written to {out}")
    return 0 if all(part.get("ok", False) for part in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
