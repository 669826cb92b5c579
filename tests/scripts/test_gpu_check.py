"""The parts of scripts/gpu_check.sh that a CPU can check: argument parsing, the plan, the table and its verdicts
(from canned measurements), and the GPU benchmarks' --dry-run tables. The GPU itself is checked by running it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.scripts import REPO, load_script


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_the_plan_and_the_table_without_a_gpu(tmp_path):
    # The shell script runs $PYTHON, here this test's interpreter (an unactivated virtualenv's, say), not the
    # python3 on PATH: a python3 that would fail stands first on PATH to prove it.
    import os

    (tmp_path / "python3").write_text("#!/bin/sh\necho 'not this interpreter' >&2\nexit 97\n")
    (tmp_path / "python3").chmod(0o755)
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--presets", "base", "big"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for part in ("tests: ", "train: ", "ddp: torchrun --standalone", "bench: "):
        assert part in out
    assert "(dry run: nothing measured)" in out and "| check | result | goal |" in out
    assert "| attention L=256 bf16: Shaw K+V Triton / SDPA flash, fwd+bwd | - | <= 1.3 (-) |" in out
    assert "| cost: big relative, 300,000 updates x 25,000 tokens | - | from the measured tok/s |" in out


def test_torchrun_is_this_interpreters():
    # a `torchrun` on PATH may belong to another Python; the DDP part must run under the one running the check
    gpu_check = load_script("scripts/gpu_check.py")
    assert gpu_check.torchrun() == [sys.executable, "-m", "torch.distributed.run"]


def test_arguments_are_checked():
    done = run(sys.executable, "scripts/gpu_check.py", "--parts", "nonsense")
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.parametrize("arguments, fragment", [
    (["--gpus", "0"], "--gpus: must be >= 1 (got 0)"),
    (["--gpus", "-2"], "--gpus: must be >= 1 (got -2)"),
    (["--lengths", "128", "0"], "--lengths: must be >= 1 (got 0)"),
    (["--lengths", "-64"], "--lengths: must be >= 1 (got -64)"),
    (["--multi30k-steps", "0"], "--multi30k-steps: must be >= 1 (got 0)"),
    (["--part-timeout", "-1"], "--part-timeout: must be >= 1 (got -1)"),
    (["--multi30k-dir", "{tmp}/absent"], "--multi30k-dir {tmp}/absent: no such directory"),
    (["--multi30k-dir", "{tmp}/empty"], "--multi30k-dir {tmp}/empty: missing tok/train.en.gz"),
    (["--out", "{tmp}/file.txt/table.md"], "--out {tmp}/file.txt/table.md: cannot create its directory"),
    (["--out", "{tmp}/empty"], "--out {tmp}/empty is a directory; give a file"),
], ids=["gpus-0", "gpus-negative", "lengths-0", "lengths-negative", "steps-0", "timeout-negative", "m30k-absent",
        "m30k-empty", "out-under-a-file", "out-a-directory"])
def test_bad_arguments_stop_it_before_any_work(arguments, fragment, tmp_path, capsys, monkeypatch):
    """Each a one-line error naming the option and its value, exit code 2, before the first part (a missing Multi30k
    directory was found by `rpr-mt prepare` minutes into the run; --gpus 0 silently meant every GPU)."""
    gpu_check = load_script("scripts/gpu_check.py")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    # a machine with one GPU: the check must come before the parts, which this test would otherwise reach
    monkeypatch.setattr(gpu_check, "environment", lambda: {"gpus": 1, "gpu": "G", "torch": "t", "cuda": "c"})
    monkeypatch.setattr(gpu_check, "part_tests", lambda *a: pytest.fail("a part started"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--parts", "tests", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and fragment.replace("{tmp}", str(tmp_path)) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_more_gpus_than_the_machine_has_is_refused_before_any_work(capsys, monkeypatch):
    gpu_check = load_script("scripts/gpu_check.py")
    monkeypatch.setattr(gpu_check, "environment", lambda: {"gpus": 1, "gpu": "G", "torch": "t", "cuda": "c"})
    monkeypatch.setattr(gpu_check, "part_tests", lambda *a: pytest.fail("a part started"))
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--parts", "tests", "ddp", "--gpus", "2"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--gpus 2: this machine has 1 GPU(s)" in err and len(err.splitlines()) == 1


def test_a_complete_multi30k_directory_and_a_new_out_file_pass(tmp_path):
    gpu_check = load_script("scripts/gpu_check.py")
    (tmp_path / "m30k" / "tok").mkdir(parents=True)
    for prefix in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (tmp_path / "m30k" / "tok" / f"{prefix}.{lang}.gz").write_bytes(b"")
    args = gpu_check.parse_args(["--multi30k-dir", str(tmp_path / "m30k"), "--out", str(tmp_path / "a" / "b.md")])
    gpu_check.check_paths(args)  # no error
    assert not (tmp_path / "a").exists()  # checking creates nothing


def canned(presets=("base",)) -> dict:
    def train(scheme, tokens, rate, ratio, peak, memory):
        return {"model": "base", "max_tokens": tokens, "scheme": scheme, "tokens_per_s": rate, "ratio": ratio,
                "peak_mib": peak, "memory_ratio": memory}

    return {
        "tests": {"ok": True, "summary": "14 passed in 50.1s", "seconds": 52.0, "counts": {"passed": 14}},
        "ddp": {"ok": True, "world": 1, "backend": "nccl", "agree": True, "gpus": 1},
        "train": {"setup": "# training on H100", "rows": [
            train("absolute", 3125, 100_000.0, 1.0, 10_000.0, 1.0),
            train("relative-torch", 3125, 80_000.0, 0.80, 13_000.0, 1.3),
            train("relative-triton", 3125, 95_000.0, 0.95, 10_500.0, 1.05),
            train("absolute", 25000, 120_000.0, 1.0, 20_000.0, 1.0),
            train("relative-torch", 25000, 102_000.0, 0.85, 30_000.0, 1.5),
            train("relative-triton", 25000, 108_000.0, 0.90, 21_600.0, 1.08),
        ]},
        "bench": {"setup": "# relative attention on H100", "rows": [
            {"L": 128, "B": 128, "sdpa_ms": 1.0, "kv_triton_ms": 1.2, "kv_torch_ms": 3.0, "blocks": "64x64 w4 s2"},
            {"L": 256, "B": 64, "sdpa_ms": 2.0, "kv_triton_ms": 2.8, "kv_torch_ms": 7.0},
        ]},
    }


def test_table_from_measurements_states_each_goal():
    gpu_check = load_script("scripts/gpu_check.py")
    args = gpu_check.parse_args(["--lengths", "128", "256"])
    env = {"gpu": "NVIDIA H100", "gpus": 1, "torch": "2.x", "cuda": "12", "triton": "3.9.0"}
    text = gpu_check.render(canned(), args, env)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "14 passed in 50.1s (52 s)" in rows["GPU unit tests (pytest -m 'gpu')"]
    assert "ok: 1 process(es), backend nccl, parameters equal on all ranks: True" in rows["torchrun + NCCL, DDP worker"]
    speed = rows["train base bf16, 3,125 tokens/batch: tok/s relative / absolute"]
    assert "0.950 (relative-triton; torch path 0.800, Triton 0.950)" in speed and ">= 0.93 (met)" in speed
    assert ">= 0.93 (NOT met)" in rows["train base bf16, 25,000 tokens/batch: tok/s relative / absolute"]
    assert "<= 1.1 (met)" in rows["train base bf16, 3,125 tokens/batch: peak memory relative / absolute"]
    assert "1.20x (1.20 vs 1.00 ms; torch path 3.00x) | <= 1.3 (met)" in rows[
        "attention L=128 bf16: Shaw K+V Triton / SDPA flash, fwd+bwd"]
    assert "<= 1.3 (NOT met)" in rows["attention L=256 bf16: Shaw K+V Triton / SDPA flash, fwd+bwd"]
    # 100,000 updates x 25,000 tokens at 100,000 tok/s = 6.9 GPU-hours; relative at the faster 95,000 tok/s
    assert "| 7 GPU-hours (0.9 h on 8 GPUs) |" in rows["cost: base absolute, 100,000 updates x 25,000 tokens"]
    assert "| 7 GPU-hours (0.9 h on 8 GPUs) |" in rows["cost: base relative, 100,000 updates x 25,000 tokens"]
    # the detailed tables follow, in the benchmarks' own formats
    assert "| base | 3,125 | relative-triton | 95,000 | 0.950 | 10,500 | 1.050 |" in text
    assert "| 128 | 128 | 1.00 | 1.20 | 1.20x | - | - | 3.00 | 3.00x | - / - / - | 64x64 w4 s2 |" in text


def test_trainer_part_rows_say_what_each_run_did():
    gpu_check = load_script("scripts/gpu_check.py")
    args = gpu_check.parse_args(["--parts", "trainer", "--multi30k-dir", "m30k"])
    runs = [{"name": "demo_bf16", "ok": True, "updates": 300, "tgt_tok_s": 57128.4, "peak_mb": 156.2, "train_s": 54.4,
             "bleu": 99.17, "lc_tok_bleu": 99.17},
            {"name": "demo_fp16", "ok": False, "error": "train failed", "updates": 12, "train_s": 9.0},
            {"name": "multi30k_lit", "ok": True, "updates": 600, "tgt_tok_s": 52740.0, "peak_mb": 682.0,
             "train_s": 60.2, "bleu": 29.32, "lc_tok_bleu": 29.31}]
    text = gpu_check.render({"trainer": {"ok": False, "runs": runs}}, args, {"gpu": "G", "gpus": 1, "torch": "t",
                                                                           "cuda": "c", "triton": "x"})
    assert ("| rpr-mt train + eval-bleu on cuda: demo_bf16 | ok: 300 updates, 57,128 tgt tok/s, peak 156 MB, train "
            "54 s, test BLEU 99.17 (literature BLEU 99.17) | ok |") in text
    assert "| rpr-mt train + eval-bleu on cuda: demo_fp16 | FAILED (train failed): 12 updates" in text
    assert "multi30k_lit | ok: 600 updates, 52,740 tgt tok/s, peak 682 MB, train 60 s, test BLEU 29.32" in text


def test_trainer_part_runs_the_cli_on_the_cpu(tmp_path):
    """The trainer part's commands (prepare, train, eval-bleu --checkpoint --json) and what it reads back, on the CPU
    with a tiny demo: a GPU session must not be the first to run them (the first one found eval-bleu's JSON key)."""
    gpu_check = load_script("scripts/gpu_check.py")
    run = gpu_check.trainer_run(tmp_path, "demo", "configs/demo.yaml",
                                ["data.demo_sizes={train: 400, dev: 20, test: 20}"],
                                ["train.max_steps=6", "train.validate_every=3", "train.save_every=3",
                                 "train.log_every=2", "train.valid_max_sentences=10"], timeout=300, device="cpu")
    assert run["ok"], run
    assert run["updates"] == 6 and run["tgt_tok_s"] > 0 and run["peak_mb"] > 0
    assert 0 <= run["bleu"] <= 100 and 0 <= run["lc_tok_bleu"] <= 100
    assert (tmp_path / "demo_eval.log").read_text().startswith("{")
    broken = gpu_check.trainer_run(tmp_path, "bad", "configs/demo.yaml", [], ["train.nonsense=1"], timeout=300,
                                   device="cpu")
    assert broken["ok"] is False and broken["error"] == "train failed"


def test_training_benchmark_warms_up_on_the_batches_it_times():
    """A batch shape met for the first time costs more on a GPU than it does again: every timed batch is replayed
    in the warm-up (the first H200 run, timing first meetings, swung 2x between repeats)."""
    bench = load_script("benchmarks/bench_gpu_train.py")
    order = bench.batch_order(n_batches=50, warmup=20, updates=20)
    assert order[20:] == list(range(20)) and sorted(order[:20]) == list(range(20))
    assert bench.batch_order(n_batches=3, warmup=2, updates=5) == [0, 1, 0, 1, 2, 0, 1]


@pytest.mark.parametrize("script", ["benchmarks/bench_gpu_attention.py", "benchmarks/bench_gpu_train.py"])
def test_gpu_benchmarks_dry_run(script, tmp_path):
    done = run(sys.executable, script, "--dry-run", "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# ") and lines[1].startswith("| ") and set(lines[2]) <= set("|-: ")
    assert (tmp_path / "rows.json").is_file()
    module = load_script(script)
    assert isinstance(module.parse_args([]), argparse.Namespace)


def interpreted(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(list(command), cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.triton
def test_attention_benchmark_measures_on_the_cpu_in_the_interpreter(tmp_path):
    """Every code path of the measurement (tile candidates, K/V-only rows, the torch path, memory), on tiny shapes in
    Triton's interpreter, so that a GPU session does not find a bug in it."""
    pytest.importorskip("triton")
    done = interpreted(sys.executable, "benchmarks/bench_gpu_attention.py", "--device", "cpu", "--dtype", "fp32",
                       "--lengths", "16", "--tokens", "16", "--heads", "1", "--dim", "16", "--clip", "2",
                       "--repeats", "1", "--warmup", "0", "--blocks", "16,16,1,1", "16,32,1,1", "--mask", "padding",
                       "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    row = __import__("json").loads((tmp_path / "rows.json").read_text())["rows"][0]
    assert {"sdpa_ms", "kv_triton_ms", "k_triton_ms", "v_triton_ms", "kv_torch_ms", "blocks"} <= set(row)


@pytest.mark.triton
@pytest.mark.slow
def test_training_benchmark_trains_every_scheme_on_the_cpu_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    done = interpreted(sys.executable, "benchmarks/bench_gpu_train.py", "--device", "cpu", "--tiny", "--vocab", "100",
                       "--max-tokens", "120", "--updates", "1", "--warmup", "0", "--repeats", "1", "--precision",
                       "fp32", "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = __import__("json").loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["scheme"] for r in rows] == ["absolute", "relative-torch", "relative-triton"]
    assert all(r["tokens_per_s"] > 0 for r in rows)


@pytest.mark.slow
def test_ddp_worker_under_torchrun_on_the_cpu(tmp_path):
    """The torchrun part's worker, with gloo on two CPU processes instead of NCCL on GPUs: DDP keeps the ranks'
    parameters equal although every rank trains on its own data."""
    import json
    import os

    report = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "scripts/gpu_check.py", "--ddp-worker", "--ddp-device", "cpu", "--out", str(report)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["world"] == 2 and result["backend"] == "gloo" and result["agree"] is True


def test_training_benchmark_needs_a_timed_update():
    bench = load_script("benchmarks/bench_gpu_train.py")
    with pytest.raises(ValueError, match="at least one batch and one timed update"):
        bench.batch_order(n_batches=5, warmup=3, updates=0)


@pytest.mark.triton
def test_tile_tuner_runs_on_the_cpu_in_the_interpreter(tmp_path):
    """benchmarks/tune_gpu_attention.py end to end on tiny shapes (no GPU times: the profiler sees no kernels), so
    that a GPU session does not find a bug in it; with no GPU times it keeps the default tiles."""
    pytest.importorskip("triton")
    done = interpreted(sys.executable, "benchmarks/tune_gpu_attention.py", "--device", "cpu", "--lengths", "16",
                       "--tokens", "16", "--heads", "1", "--dim", "16", "--clip", "2", "--repeats", "1",
                       "--candidates", "16,16,1,1", "--masks", "padding", "causal",
                       "--json", str(tmp_path / "tune.json"),
                       "--tiles-out", str(tmp_path / "tiles.txt"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = __import__("json").loads((tmp_path / "tune.json").read_text())
    assert [(r["blocks"], r["mask"]) for r in result["sweep"]] == [("16,16,1,1", "padding"), ("16,16,1,1", "causal")]
    assert len(result["end_to_end"]) == 1 and set(result["host_us_per_call"]) >= {"sdpa", "triton kernels"}
    assert (tmp_path / "tiles.txt").read_text().strip() == result["chosen"]


def test_tile_tuner_chooses_each_kernel_by_its_own_time():
    tune = load_script("benchmarks/tune_gpu_attention.py")

    def row(L, mask, blocks, forward, dkdv, dq):
        return {"L": L, "mask": mask, "blocks": blocks,
                "parts": {"forward": forward, "pre": 0.01, "dkdv": dkdv, "dq": dq, "other": 0.2}}

    cases = [(L, mask) for L in (128, 256) for mask in ("padding", "causal")]
    sweep = [row(L, mask, "64,64,4,2", 1.0, 2.0, 1.0) for L, mask in cases]
    sweep += [row(L, mask, "32,64,4,3", 0.8, 2.5, 0.7) for L, mask in cases]
    sweep += [row(L, mask, "16,64,4,3", 0.1, 0.1, 0.1) for L, mask in cases[:3]]  # failed once: never chosen
    tiles = tune.choose(sweep)
    assert (tiles.forward.m, tiles.dkdv.m, tiles.dq.m) == (32, 64, 32)
    patchy = [row(128, "padding", "64,32,4,3", 0.1, 0.1, 0.1), row(256, "padding", "32,64,4,3", 0.1, 0.1, 0.1)]
    from rpr_mt.model.kernels.triton_shaw import Tiles

    assert tune.choose(patchy) == tune.choose([]) == Tiles()  # no candidate ran everywhere: the defaults


@pytest.mark.parametrize("arguments", [["--schemes", "relative-triton-tiles", "--tiles", "fwd=64,48,4,2"],
                                       ["--schemes", "relative-triton-tiles"], ["--tiles", "fwd=64,64,4,2"]],
                         ids=["bad", "scheme-without-tiles", "tiles-without-scheme"])
def test_training_benchmark_checks_its_tiles(arguments):
    done = run(sys.executable, "benchmarks/bench_gpu_train.py", "--dry-run", *arguments)
    assert done.returncode == 2 and "--tiles" in done.stderr and "Traceback" not in done.stderr


def test_tile_tuner_checks_its_candidates():
    done = run(sys.executable, "benchmarks/tune_gpu_attention.py", "--candidates", "64,64", "--device", "cpu")
    assert done.returncode == 2 and "four integers" in done.stderr and "Traceback" not in done.stderr


def test_training_benchmark_profiles_each_row_once(tmp_path):
    """--profile on the CPU (no GPU columns): one file per row of the first repeat, with the wall clock per update
    and the operators by host time."""
    done = run(sys.executable, "benchmarks/bench_gpu_train.py", "--device", "cpu", "--tiny", "--vocab", "100",
               "--max-tokens", "120", "--updates", "1", "--warmup", "0", "--repeats", "2", "--precision", "fp32",
               "--schemes", "absolute", "--profile", str(tmp_path / "prof"), "--profile-updates", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in (tmp_path / "prof").iterdir()] == ["tiny_120_absolute.txt"]
    text = (tmp_path / "prof" / "tiny_120_absolute.txt").read_text()
    assert "2 profiled updates" in text and "ms per update" in text and "## by self_cpu_time_total" in text


def test_training_benchmark_runs_the_serial_backward_only_in_its_own_scheme(monkeypatch):
    """relative-triton-serial sets RPR_MT_TRITON_BACKWARD=serial while it runs and gives the caller's value back;
    the other schemes leave the caller's value as it is."""
    import os

    bench = load_script("benchmarks/bench_gpu_train.py")
    monkeypatch.delenv("RPR_MT_TRITON_BACKWARD", raising=False)
    with bench.attention_impl("relative-triton-serial"):
        assert os.environ["RPR_MT_TRITON_BACKWARD"] == "serial"
    assert "RPR_MT_TRITON_BACKWARD" not in os.environ
    monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", "split")
    with bench.attention_impl("relative-triton-serial"):
        assert os.environ["RPR_MT_TRITON_BACKWARD"] == "serial"
    with bench.attention_impl("relative-triton"):
        assert os.environ["RPR_MT_TRITON_BACKWARD"] == "split"
    assert os.environ["RPR_MT_TRITON_BACKWARD"] == "split"
