"""The position-scheme study on tiny demo runs: long-set construction, the cap, decoding of the long sets with what
was cut, resumption, and table numbers equal to the runs' own metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpr_mt.config import config_from_dict, load_config, save_config
from rpr_mt.data.prepare import prepare, reference_files
from rpr_mt.lines import read_lines
from rpr_mt.errors import UserError
from rpr_mt.experiments.study import (evaluate_long, join_consecutive, long_sets, render_bucket_table,
                                      render_study_table, write_long_sets)
from rpr_mt.experiments.sweep import plan_runs, run_config, run_sweep
from rpr_mt.experiments.tables import load_sweep
from tests.scripts import load_script
from tests.train.test_trainer import tiny

RUNS = ["positions=absolute/seed1", "positions=alibi/seed1", "base/seed1"]


def test_join_consecutive_groups_in_order_and_drops_the_remainder():
    lines = ["a b", "c", " d ", "e f", "g"]
    assert join_consecutive(lines, 1) == ["a b", "c", "d", "e f", "g"]
    assert join_consecutive(lines, 2) == ["a b c", "d e f"]
    assert join_consecutive(lines, 3) == ["a b c d"]
    assert join_consecutive(lines, 6) == []
    sets = long_sets(["1", "2", "3", "4"], ["eins", "zwei", "drei", "vier"], (1, 2, 4))
    assert sets[2] == (["1 2", "3 4"], ["eins zwei", "drei vier"]) and sets[4] == (["1 2 3 4"], ["eins zwei drei vier"])


@pytest.fixture(scope="module")
def study_root(tmp_path_factory) -> tuple[Path, Path]:
    """Three tiny schemes (absolute sinusoidal, ALiBi, Shaw k = 4) trained through the study's sweep table, with a
    training cap below the longest demo sentences."""
    root = tmp_path_factory.mktemp("study")
    raw = tiny(root / "data", root / "unused", data={"max_train_tokens": 12}, train={"validate_every": 100})
    config = root / "study.yaml"
    save_config(config_from_dict(raw), config)
    prepare(load_config(config).data, progress=False)
    assert run_sweep(config, root / "runs", ["schemes"], [1], only=RUNS, log=lambda _: None) == "done"
    return config, root / "runs"


def configs(config, runs_root):
    return {r.directory: run_config(config, [], r, runs_root) for r in plan_runs(config, ["schemes"], [1], [])
            if r.directory in RUNS}


def test_the_training_cap_drops_long_pairs(study_root):
    config, runs_root = study_root
    run_log = json.loads((runs_root / "base/seed1/result.json").read_text())
    assert run_log["updates"] == 12
    cfg = load_config(config)
    from rpr_mt.data.binarize import load_split
    from rpr_mt.train.batching import usable_examples

    data = load_split(cfg.data.output_dir, "train")
    kept = usable_examples(data, cfg.model.max_positions, cfg.data.max_train_tokens)
    assert 0 < len(kept) < len(data)  # the study's cap binds (the log line: tests/train/test_trainer.py)


def test_long_sets_are_decoded_scored_and_resumed(study_root, monkeypatch):
    config, runs_root = study_root
    for run, cfg in configs(config, runs_root).items():
        record = evaluate_long(cfg, log=lambda _: None)
        result = json.loads((runs_root / run / "result.json").read_text())
        # x1 is the sweep's own test decoding: the same BLEU as the run's result
        assert record["sets"]["test.x1"]["bleu"] == pytest.approx(result["test_bleu"])
        assert record["sets"]["dev.x1"]["bleu"] == pytest.approx(result["dev_bleu"])
        src_path, ref_path = reference_files(cfg.data.output_dir, "test")
        n = len(read_lines(src_path))
        for factor in (2, 3, 4):
            hyps = read_lines(runs_root / run / f"long/test.x{factor}.hyp")
            assert len(hyps) == n // factor == record["sets"][f"test.x{factor}"]["lines"]
            assert record["sets"][f"test.x{factor}"]["truncated_sources"] == 0
        total = sum(b["sentences"] for b in record["buckets"]["test"])
        assert total == sum(n // f for f in (1, 2, 3, 4))
    # resumption: a finished run is not decoded again
    monkeypatch.setattr("rpr_mt.decode.translate.translate_lines", lambda *a, **k: pytest.fail("decoded again"))
    for cfg in configs(config, runs_root).values():
        evaluate_long(cfg, log=lambda _: None)


def test_hypotheses_are_reused_only_if_decoded_with_the_same_settings(study_root, monkeypatch):
    import dataclasses

    from rpr_mt.decode import translate

    config, runs_root = study_root
    cfg = configs(config, runs_root)["base/seed1"]
    run_dir = runs_root / "base/seed1"
    evaluate_long(cfg, log=lambda _: None)
    decoded: list[int] = []
    real = translate.translate_lines
    monkeypatch.setattr(translate, "translate_lines", lambda *a, **k: decoded.append(1) or real(*a, **k))

    # Other decode settings: nothing decoded with the old ones is reused (x1 from the sweep, x2-x4 from before).
    other = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, min_length=0))
    record = evaluate_long(other, log=lambda _: None)
    assert len(decoded) == 8 and record["decode"]["min_length"] == 0  # dev and test, x1 to x4
    assert json.loads((run_dir / "long/decode.json").read_text())["min_length"] == 0
    # Back to the run's own settings: its sweep decoding of x1 is theirs again; the joined sets are decoded anew.
    decoded.clear()
    record = evaluate_long(cfg, log=lambda _: None)
    assert len(decoded) == 6 and record["decode"]["min_length"] == 1
    assert json.loads((run_dir / "long/decode.json").read_text()) == record["decode"]
    # A result recorded before decode.min_length existed was decoded without it: its x1 files are not today's.
    result = json.loads((run_dir / "result.json").read_text())
    (run_dir / "result.json").write_text(json.dumps({k: v for k, v in result.items() if k != "decode"}))
    (run_dir / "long_results.json").unlink()
    decoded.clear()
    sweep_test = (run_dir / "test.hyp").read_text()
    try:
        record = evaluate_long(cfg, log=lambda _: None)
    finally:
        (run_dir / "result.json").write_text(json.dumps(result))
    assert len(decoded) == 2  # dev.x1 and test.x1; the joined sets were decoded with today's settings
    assert (run_dir / "test.hyp").read_text() == sweep_test  # what result.json scored stays as it was
    assert record["sets"]["test.x1"]["lines"] == len(read_lines(run_dir / "long/test.x1.hyp"))


def test_table_numbers_are_the_runs_own(study_root):
    config, runs_root = study_root
    for cfg in configs(config, runs_root).values():
        evaluate_long(cfg, log=lambda _: None)
    sweep = load_sweep(runs_root)
    table = render_study_table(sweep)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in table.splitlines()[2:]}
    for run, label in [("positions=absolute/seed1", "absolute sinusoidal"), ("positions=alibi/seed1", "ALiBi"),
                       ("base/seed1", "Shaw k=4")]:
        result = json.loads((runs_root / run / "result.json").read_text())
        long = json.loads((runs_root / run / "long_results.json").read_text())
        row = rows[label]
        assert row[2] == f"{result['dev_bleu']:.2f}" and row[3] == f"{result['test_bleu']:.2f}"
        assert row[6] == f"{long['sets']['test.x4']['bleu']:.2f}"
        assert row[9].rstrip(" |") == f"{result['parameters']:,}"
    assert rows["absolute sinusoidal"][8] == "1.000"
    assert "| T5 bias | 0/0" not in table  # unplanned schemes have no row

    # the tok/s column from a quiet benchmark (bench_train.py --study --json) instead of the runs' own rates
    speeds = {"ALiBi": {"ratio": 1.042, "range": [1.01, 1.07]}, "absolute sinusoidal": {"ratio": 1.0, "range": [1, 1]}}
    measured = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
                for line in render_study_table(sweep, speeds).splitlines()[2:]}
    assert measured["ALiBi"][8] == "1.042 (1.010-1.070)" and measured["Shaw k=4"][8] == ""

    # the numbers behind the plot: each run's BLEU per source-length bucket (one seed: its own), empty columns dropped
    lines = render_bucket_table(sweep).splitlines()
    buckets = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:] for line in lines[2:]}
    per_run = [json.loads((runs_root / r / "long_results.json").read_text())["buckets"]["test"] for r in RUNS]
    kept = [i for i in range(len(per_run[0])) if any(run[i]["bleu"] is not None for run in per_run)]
    shaw = per_run[RUNS.index("base/seed1")]
    assert lines[0] == "| scheme | " + " | ".join(f"test {shaw[i]['bucket']}" for i in kept) + " |"
    assert buckets["Shaw k=4"] == ["-" if shaw[i]["bleu"] is None else f"{shaw[i]['bleu']:.2f}" for i in kept]


def test_bootstrap_rows_are_the_runs_differences(study_root, tmp_path):
    from rpr_mt.experiments.study import render_bootstrap

    config, runs_root = study_root
    long = {}
    for run, cfg in configs(config, runs_root).items():
        long[run] = evaluate_long(cfg, log=lambda _: None)["sets"]
    table = render_bootstrap(load_sweep(runs_root))
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}
    assert set(rows) == {"ALiBi", "Shaw k=4"}  # every scheme but the baseline
    for run, label in [("positions=alibi/seed1", "ALiBi"), ("base/seed1", "Shaw k=4")]:
        for cell, name in zip(rows[label], ("test.x1", "test.x4")):
            delta = long[run][name]["bleu"] - long["positions=absolute/seed1"][name]["bleu"]
            assert cell.startswith(f"{delta:+.2f} (p="), (label, name, cell)
    # --baseline: another scheme as the reference (Shaw k=4 against k=64 tests clipping directly)
    table = render_bootstrap(load_sweep(runs_root), baseline="Shaw k=4")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}
    assert set(rows) == {"absolute sinusoidal", "ALiBi"}
    delta = long["positions=alibi/seed1"]["test.x4"]["bleu"] - long["base/seed1"]["test.x4"]["bleu"]
    assert rows["ALiBi"][1].startswith(f"{delta:+.2f} (p=")
    with pytest.raises(UserError, match="'Shaw k=5' is not a scheme of this study"):
        render_bootstrap(load_sweep(runs_root), baseline="Shaw k=5")
    # --data-dir (the runs' data.output_dir is relative to where the study ran) is where the references are read
    with pytest.raises(UserError, match="nowhere"):
        render_bootstrap(load_sweep(runs_root), data_dir=tmp_path / "nowhere")


def test_bootstrap_without_a_finished_baseline_says_so_instead_of_failing(study_root):
    """A study still training: `--report --bootstrap --lengths` stopped with an error after the tables, and the
    --lengths section after it was never printed."""
    from rpr_mt.experiments.study import render_bootstrap

    _, runs_root = study_root
    text = render_bootstrap(load_sweep(runs_root), baseline="RoPE")  # planned, not trained in this fixture
    assert text == "No paired bootstrap: no 'RoPE' run has finished yet to compare with.\n"


def test_long_set_files(study_root, tmp_path):
    config, _ = study_root
    cfg = load_config(config)
    written = write_long_sets(cfg.data.output_dir, tmp_path, "en", "de")
    assert sorted(p.name for p in written)[:2] == ["dev.x2.de", "dev.x2.en"] and len(written) == 12
    src = read_lines(tmp_path / "test.x2.en")
    original = read_lines(reference_files(cfg.data.output_dir, "test")[0])
    assert src[0] == f"{original[0]} {original[1]}"


def _script():
    return load_script("scripts/study_positions.py")


def test_the_script_decodes_each_runs_long_sets_after_it(study_root, capsys):
    import shutil

    config, runs_root = study_root
    run = "positions=alibi/seed1"
    evaluate_long(configs(config, runs_root)[run], log=lambda _: None)
    path = runs_root / run / "long_results.json"
    before = json.loads(path.read_text())
    path.unlink()
    shutil.rmtree(runs_root / run / "long")
    # The finished run is not trained again; its long sets are decoded again, to the same scores.
    assert _script().main([str(config), "--root", str(runs_root), "--seeds", "1", "--only", run]) == 0
    err = capsys.readouterr().err
    assert f"{run}: finished, skipped" in err and "training (" not in err
    assert f"{run}: decoding test.x4" in err and f"{run}: test x4 BLEU" in err
    assert json.loads(path.read_text())["sets"] == before["sets"]


def test_a_run_without_weights_is_rescored_or_said_to_be_incomplete(study_root, tmp_path, monkeypatch, capsys):
    """A run as results/ keeps it (no checkpoints): its hypotheses are rescored without the model; where one is
    missing, the script says so for that run and goes on."""
    import shutil

    config, runs_root = study_root
    run = "base/seed1"
    cfg = configs(config, runs_root)[run]
    record = evaluate_long(cfg, log=lambda _: None)
    kept = tmp_path / "results"
    shutil.copytree(runs_root, kept, ignore=shutil.ignore_patterns("checkpoints", "*.pt"))
    kept_cfg = run_config(config, [], next(r for r in plan_runs(config, ["schemes"], [1], []) if r.directory == run),
                          kept)
    monkeypatch.setattr("rpr_mt.decode.translate.translate_lines", lambda *a, **k: pytest.fail("decoded"))
    rescored = evaluate_long(kept_cfg, edges=(10, 20), log=lambda _: None)  # new edges: rescoring only
    assert rescored["sets"] == record["sets"] and rescored["checkpoint_file"] == record["checkpoint_file"]
    assert [b["bucket"] for b in rescored["buckets"]["test"]] != [b["bucket"] for b in record["buckets"]["test"]]
    monkeypatch.undo()

    for each in RUNS:
        (kept / each / "long_results.json").unlink()
    (kept / run / "long" / "test.x3.hyp").unlink()
    with pytest.raises(UserError, match="checkpoint"):
        evaluate_long(kept_cfg, log=lambda _: None)
    assert _script().main([str(config), "--root", str(kept), "--seeds", "1"] + sum((["--only", r] for r in RUNS), [])) == 1
    err = capsys.readouterr().err
    assert f"{kept / run}: long sets not evaluated" in err and "1 run(s) without long-set results" in err
    for other in RUNS:  # the others are rescored from their hypotheses, with no weights, whatever their order
        if other != run:
            assert (kept / other / "long_results.json").is_file()


def test_report_refuses_an_unreadable_speed_file(study_root, tmp_path, capsys):
    config, runs_root = study_root
    (tmp_path / "speed.json").write_text("{}")
    assert _script().main([str(config), "--root", str(runs_root), "--report", "--speed-json", str(tmp_path / "speed.json")]) == 2
    assert "--speed-json" in capsys.readouterr().err


def test_output_lengths_are_the_hypotheses_own(study_root):
    """The x4 length table: pieces of each run's own hypotheses, of the references and of the capped training
    targets, against the cap (12 pieces in the demo study)."""
    import statistics

    from rpr_mt.data.binarize import load_split
    from rpr_mt.data.vocab import Vocab
    from rpr_mt.experiments.study import render_output_lengths
    from rpr_mt.train.batching import usable_examples

    config, runs_root = study_root
    for cfg in configs(config, runs_root).values():
        evaluate_long(cfg, log=lambda _: None)
    cfg = load_config(config)
    table = render_output_lengths(load_sweep(runs_root))
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:] for line in table.splitlines()[2:]}
    assert table.splitlines()[0].endswith("| > 12 pieces (the training cap) |")
    vocab = Vocab.load(cfg.data.output_dir)
    pieces = [len(vocab.encode(line)) for line in read_lines(runs_root / "base/seed1/long/test.x4.hyp")]
    over = sum(n > 12 for n in pieces) / len(pieces)
    assert rows["Shaw k=4"] == ["1", f"{statistics.median(pieces):.1f}", f"{statistics.fmean(pieces):.1f}",
                                f"{100 * over:.0f}%"]
    train = load_split(cfg.data.output_dir, "train")
    seen = [train.tgt_lengths[i] for i in usable_examples(train, cfg.model.max_positions, 12)]
    assert rows["training targets the models saw"][1:] == [f"{statistics.median(seen):.1f}",
                                                           f"{statistics.fmean(seen):.1f}", "0%"]
    refs = long_sets(*(read_lines(p) for p in reference_files(cfg.data.output_dir, "test")), (4,))[4][1]
    assert rows["references"][1] == f"{statistics.median(len(vocab.encode(r)) for r in refs):.1f}"


def test_long_sets_decoded_sentence_by_sentence_go_beside_the_whole_line_ones(study_root, monkeypatch):
    """evaluate_long(split=True): the 'with splitting' row of docs/positions.md, without touching the study's own."""
    from rpr_mt.decode import translate

    config, runs_root = study_root
    cfg = configs(config, runs_root)["base/seed1"]
    run_dir = runs_root / "base/seed1"
    whole = evaluate_long(cfg, log=lambda _: None)
    before = (run_dir / "long_results.json").read_text()
    seen: list[bool] = []
    real = translate.translate_lines
    monkeypatch.setattr(translate, "translate_lines",
                        lambda *a, **k: seen.append(k["decode"].split_sentences) or real(*a, **k))
    record = evaluate_long(cfg, log=lambda _: None, split=True)
    assert seen == [True] * 8  # every set decoded anew, x1 too (the sweep's x1 was decoded whole)
    assert record["split_sentences"] is True and "split_sentences" not in whole
    assert json.loads((run_dir / "long_results_split.json").read_text()) == record
    assert len(list((run_dir / "long_split").glob("*.x4.hyp"))) == 2
    assert (run_dir / "long_results.json").read_text() == before


def test_long_results_recorded_while_the_multi30k_directory_counted_are_still_current(tmp_path):
    """results/study_positions' long_results.json were fingerprinted with data.multi30k_dir: ../shared/data/multi30k;
    the committed config names none now, and the records are read as they are, nothing decoded again."""
    import hashlib

    from rpr_mt.experiments.study import FACTORS, LENGTH_EDGES, sets_fingerprint
    from rpr_mt.experiments.sweep import comparable_config

    cfg = config_from_dict({"data": {"source": "multi30k", "multi30k_dir": "../shared/data/multi30k"},
                            "train": {"run_dir": str(tmp_path)}})
    old = comparable_config(cfg)
    old["data"]["multi30k_dir"] = "../shared/data/multi30k"
    old_print = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    record = {"fingerprint": sets_fingerprint(cfg, FACTORS, LENGTH_EDGES, old_print), "sets": {}}
    (tmp_path / "long_results.json").write_text(json.dumps(record))
    cfg.data.multi30k_dir = None
    assert evaluate_long(cfg) == record
    record["fingerprint"] = sets_fingerprint(cfg, FACTORS, LENGTH_EDGES, "0" * 16)  # another config's: not current
    (tmp_path / "long_results.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match="SentencePiece model not found"):  # made again, from the prepared data
        evaluate_long(cfg)
