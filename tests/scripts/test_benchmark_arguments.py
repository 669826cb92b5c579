"""Every benchmark refuses a size or count it cannot use (0, negative) and the project's UserError (a missing config,
checkpoint or input) with one line on stderr and exit code 2, before it measures anything. Argument handling only:
each case stops before the first measurement, so none of these runs a benchmark."""

from __future__ import annotations

import pytest
import torch

from . import REPO, load_script

BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if p.name != "arguments.py")

CASES = [
    ("bench_attention.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("bench_attention.py", ["--lengths", "64", "-1"], "argument --lengths: must be >= 1 (got -1)"),
    ("bench_attention.py", ["--clip", "-1"], "argument --clip: must be >= 0 (got -1)"),
    ("bench_compile.py", ["--shapes", "0x4x20"], "argument --shapes: '0x4x20': expected BATCHxHEADSxLENGTH"),
    ("bench_compile.py", ["--shapes", "100x4"], "argument --shapes: '100x4': expected BATCHxHEADSxLENGTH"),
    ("bench_compile.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("bench_content_attention.py", ["--tokens", "0"], "argument --tokens: must be >= 1 (got 0)"),
    ("bench_content_attention.py", ["--dropout", "1.5"], "argument --dropout: must be in [0, 1) (got 1.5)"),
    ("bench_ctranslate2.py", ["--lines", "0"], "argument --lines: must be >= 1 (got 0)"),
    ("bench_ctranslate2.py", ["--beam-size", "0"], "argument --beam-size: must be >= 1 (got 0)"),
    ("bench_decode.py", ["--beam-sizes", "1", "0"], "argument --beam-sizes: must be >= 1 (got 0)"),
    ("bench_decode.py", ["--max-tokens", "0"], "argument --max-tokens: must be >= 1 (got 0)"),
    ("bench_decode.py", ["--positions", "nonsense"], "argument --positions: invalid choice: 'nonsense'"),
    ("bench_decode.py", ["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    ("bench_gpu_attention.py", ["--tokens", "0"], "argument --tokens: must be >= 1 (got 0)"),
    ("bench_gpu_attention.py", ["--warmup", "-1"], "argument --warmup: must be >= 0 (got -1)"),
    ("bench_gpu_train.py", ["--max-tokens", "0"], "argument --max-tokens: must be >= 1 (got 0)"),
    ("bench_gpu_train.py", ["--updates", "0"], "argument --updates: must be >= 1 (got 0)"),
    ("bench_gpu_train.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("bench_gpu_train.py", ["--vocab", "4"], "argument --vocab: must be >= 16 (got 4)"),
    ("bench_loss.py", ["--vocab", "0"], "argument --vocab: must be >= 2 (got 0)"),
    ("bench_loss.py", ["--rounds", "0"], "argument --rounds: must be >= 1 (got 0)"),
    ("bench_peers.py", ["--toolkit", "onmt", "--minutes", "0"], "argument --minutes: must be a finite number > 0 (got 0)"),
    ("bench_peers.py", ["--toolkit", "moses"], "argument --toolkit: invalid choice: 'moses'"),
    ("bench_peers.py", ["--toolkit", "fairseq", "--max-updates", "0"], "argument --max-updates: must be >= 1 (got 0)"),
    ("bench_roofline.py", ["--updates", "0"], "argument --updates: must be >= 1 (got 0)"),
    ("bench_roofline.py", ["--max-tokens", "-5"], "argument --max-tokens: must be >= 1 (got -5)"),
    ("bench_roofline.py", ["--goal", "0"], "argument --goal: must be a finite number > 0 (got 0)"),
    ("bench_split.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("bench_split.py", ["--lines", "-1"], "argument --lines: must be >= 1 (got -1)"),
    ("bench_threads.py", ["--threads", "0"], "argument --threads: must be >= 1 (got 0)"),
    ("bench_threads.py", ["--log-every", "0"], "argument --log-every: must be >= 1 (got 0)"),
    ("bench_train.py", ["--max-tokens", "0"], "argument --max-tokens: must be >= 1 (got 0)"),
    ("bench_train.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("bench_train.py", ["--updates", "0"], "argument --updates: must be >= 1 (got 0)"),
    ("bench_train.py", ["--attention-dropout", "1"], "argument --attention-dropout: must be in [0, 1) (got 1)"),
    ("bench_train.py", ["--regimes", "wmt19"], "argument --regimes: invalid choice: 'wmt19'"),
    ("bench_train.py", ["--precisions", "fp8"], "argument --precisions: invalid choice: 'fp8'"),
    ("bench_triton_compiles.py", ["--calls", "0"], "argument --calls: must be >= 1 (got 0)"),
    ("bench_triton_launch.py", ["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
    ("make_wmt_standin.py", ["--pairs", "0", "--out", "{tmp}/x"], "argument --pairs: must be >= 1 (got 0)"),
    ("make_wmt_standin.py", ["--pairs", "10", "--out", "{tmp}/x", "--multi30k-dir", "{tmp}/none"],
     "error: Multi30k file not found: {tmp}/none/train.en.gz"),
    ("bench_prepare_scale.py", ["--batch", "0"], "argument --batch: must be >= 1 (got 0)"),
    ("bench_prepare_scale.py", ["--config", "{tmp}/missing.yaml"], "error: config file not found: {tmp}/missing.yaml"),
    ("bench_prepare_scale.py", ["--make-pairs", "10"], "error: --make-pairs needs --dir"),
    ("bench_trainer_startup.py", ["--config", "x.yaml", "--max-tokens", "0"], "argument --max-tokens: must be >= 1"),
    ("check_ddp_batches.py", ["--config", "x.yaml", "--nproc", "0"], "argument --nproc: must be >= 1 (got 0)"),
    ("check_ddp_batches.py", ["--config", "{tmp}/missing.yaml"], "error: config file not found: {tmp}/missing.yaml"),
    ("bench_trainer_startup.py", ["--config", "{tmp}/missing.yaml"], "error: config file not found: {tmp}/missing.yaml"),
    ("profile_attention.py", ["--steps", "0"], "argument --steps: must be >= 1 (got 0)"),
    ("profile_gpu_host.py", ["--calls", "-3"], "argument --calls: must be >= 1 (got -3)"),
    ("tune_gpu_attention.py", ["--lengths", "0"], "argument --lengths: must be >= 1 (got 0)"),
    # the project's UserError, raised inside: one line, as rpr-mt prints it
    ("bench_train.py", ["--study", "{tmp}/missing.yaml"], "error: config file not found: {tmp}/missing.yaml"),
    ("bench_threads.py", ["--config", "{tmp}/missing.yaml"], "error: config file not found: {tmp}/missing.yaml"),
    ("bench_decode.py", ["--input", "{tmp}/missing.txt", "--threads", "1"], "error: {tmp}/missing.txt: file not found"),
    ("bench_ctranslate2.py", ["--checkpoint", "{tmp}/missing.pt", "--threads", "1"],
     "error: checkpoint not found: {tmp}/missing.pt"),
    ("bench_split.py", ["--checkpoint", "{tmp}/missing.pt", "--input", "{tmp}/in.txt", "--threads", "1"],
     "error: checkpoint not found: {tmp}/missing.pt"),
    ("bench_recase.py", ["--multi30k-dir", "{tmp}", "--langs", "de"], "error: {tmp}/train.de.gz not found"),
    ("bench_recase.py", ["--langs", "xx"], "argument --langs: invalid choice: 'xx'"),
    ("bench_recase.py", ["--hyp", "xx:test.hyp"], "argument --hyp: expected LANG:FILE with LANG one of en, de, fr"),
    ("bench_recase.py", ["--multi30k-dir", "{tmp}", "--langs", "fr", "--hyp", "de:{tmp}/t.hyp"],
     "error: {tmp}/train.fr.gz not found"),
    ("bench_peers.py", ["--toolkit", "onmt", "--venv", "{tmp}/venv", "--out", "{tmp}/out"],
     "error: {tmp}/venv/bin/python not found: install the peer in {tmp}/venv"),
    ("probe_heap.py", ["--every", "0", "--", "--version"], "argument --every: must be a finite number > 0 (got 0)"),
    ("probe_heap.py", ["--trim"], "give the rpr-mt command to run after --"),
]


@pytest.mark.parametrize("script, argv, fragment", CASES,
                         ids=[f"{s.removesuffix('.py')}{'-'.join([''] + a[:2]).replace('{tmp}/', '')}"
                              for s, a, _ in CASES])
def test_bad_value_is_one_line_and_exit_2_before_any_work(script, argv, fragment, tmp_path, capsys):
    module = load_script(f"benchmarks/{script}")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as stop:
        module.main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2, err
    assert fragment.replace("{tmp}", str(tmp_path)) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert out == ""  # nothing started: no table header, no setup line


@pytest.mark.parametrize("script", BENCHMARKS)
def test_every_benchmark_parses_with_the_shared_one_line_parser(script, capsys):
    """--help still works everywhere, and no benchmark builds its own parser (whose errors would be the usage block
    and a second line)."""
    source = (REPO / "benchmarks" / script).read_text()
    assert "argparse.ArgumentParser(" not in source and "from arguments import" in source
    module = load_script(f"benchmarks/{script}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_decoding_on_cuda_without_a_gpu_is_one_line_and_exit_2(capsys):
    module = load_script("benchmarks/bench_decode.py")
    with pytest.raises(SystemExit) as stop:
        module.main(["--device", "cuda", "--threads", "1"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and err.strip() == "error: --device cuda: no CUDA device is available", err
    assert out == ""
