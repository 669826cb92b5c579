"""Commands that load a model say which file they loaded and what it holds; `rpr-mt plot` draws a run's curves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.cli import app
from rpr_mt.config import config_from_dict
from rpr_mt.curves import read_curves
from rpr_mt.scoring import split_paths
from rpr_mt.train.trainer import train
from tests.test_cli import assert_one_line_error
from tests.train.test_trainer import demo_data, tiny  # noqa: F401 (demo_data is a fixture)

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, demo_data) -> Path:
    """12 updates, validated at 6 and 12 (dev BLEU on 5 sentences, greedy), checkpoints at 4, 8 and 12."""
    path = tmp_path_factory.mktemp("cli") / "run"
    train(config_from_dict(tiny(demo_data, path)), progress=False)
    return path


def loaded_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("loaded ")]


def expected(path: Path) -> str:
    """What the command should say about ``path``, from the checkpoint itself."""
    state = ckpt.load_checkpoint(path)
    dev = state["dev"]
    if dev is None:
        return f"loaded {path} (update {state['step']}, no dev score recorded)"
    return (f"loaded {path} (update {state['step']}, dev BLEU {dev['bleu']:.2f} (5 sentences, beam 1), "
            f"dev nll {dev['nll']:.3f})")


@pytest.mark.parametrize("which", ["best", "last"])
def test_translate_names_the_checkpoint_a_run_directory_resolved_to(run_dir, which):
    result = runner.invoke(app, ["translate", "--checkpoint", str(run_dir), "--which", which, "--beam-size", "1"],
                           input="the old farmer sees the small red bird\n")
    assert result.exit_code == 0, result.output
    path = ckpt.resolve_checkpoint(run_dir, which)
    assert loaded_lines(result) == [expected(path)]
    assert "dev BLEU" in expected(path)  # both were validated
    assert len(result.stdout.splitlines()) == 1 and "loaded" not in result.stdout  # stdout stays the translation


def test_a_run_with_a_newer_average_says_the_default_loads_the_best_one(run_dir, tmp_path):
    """train.average_last writes checkpoint_avg.pt after the best one, and a run's scores are of it: loading the best
    by default is said, with the option that loads the average; an older average (training went on) is not."""
    import os
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    folder = ckpt.checkpoint_dir(run)
    average = folder / "checkpoint_avg.pt"
    shutil.copy(ckpt.step_checkpoint_path(run, 12), average)
    best_time = (folder / "checkpoint_best.pt").stat().st_mtime
    note = "has an averaged checkpoint newer than its best one; loading the best one (the default), --which average"
    for command in (["translate", "--checkpoint", str(run), "--beam-size", "1"],
                    ["eval-bleu", "--checkpoint", str(run), "--split", "test", "--beam-size", "1"]):
        os.utime(average, (best_time + 1, best_time + 1))
        result = runner.invoke(app, command, input="a bird\n")
        assert result.exit_code == 0, result.output
        assert note in result.stderr
        assert loaded_lines(result) == [expected(folder / "checkpoint_best.pt")]
        for chosen in (["--which", "best"], ["--which", "average"]):  # a choice made is not questioned
            assert note not in runner.invoke(app, command + chosen, input="a bird\n").stderr
        os.utime(average, (best_time - 1, best_time - 1))
        assert note not in runner.invoke(app, command, input="a bird\n").stderr


def test_a_checkpoint_without_validation_says_so(run_dir):
    path = ckpt.step_checkpoint_path(run_dir, 8)
    result = runner.invoke(app, ["translate", "--checkpoint", str(path), "--beam-size", "1"], input="a bird\n")
    assert result.exit_code == 0, result.output
    assert loaded_lines(result) == [f"loaded {path} (update 8, no dev score recorded)"]


def test_eval_bleu_with_a_checkpoint_names_it(run_dir):
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(run_dir), "--split", "test", "--beam-size", "1",
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert loaded_lines(result) == [expected(ckpt.checkpoint_dir(run_dir) / "checkpoint_best.pt")]
    assert json.loads(result.stdout)["lines"] == 20


def test_eval_bleu_of_a_demo_model_reports_only_the_metrics_that_apply(run_dir):
    """The demo translates into a synthetic language: no Moses-tokenized, compound-split BLEU and no Multi30k
    literature BLEU, and one line that says why."""
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(run_dir), "--split", "test", "--beam-size", "1"])
    assert result.exit_code == 0, result.output
    assert "sacreBLEU" in result.stdout and "chrF" in result.stdout
    assert "Multi30k lit. BLEU" not in result.stdout and "tok. BLEU, compound split" not in result.stdout
    assert "(not reported: the demo's target is a synthetic language" in result.stdout


def test_eval_bleu_says_when_lang_overrides_the_checkpoints_language(run_dir):
    tgt_lang = ckpt.load_for_inference(run_dir).config.data.tgt_lang
    other = "cs" if tgt_lang != "cs" else "fr"
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(run_dir), "--split", "test", "--beam-size", "1",
                                 "--lang", other, "--json"])
    assert result.exit_code == 0, result.output
    assert (f"note: --lang {other} overrides the target language of the checkpoint's data ({tgt_lang})"
            in result.stderr)


def test_average_checkpoints_lists_its_inputs_and_warns_when_fewer_than_last(run_dir, tmp_path):
    steps = [ckpt.step_checkpoint_path(run_dir, s) for s in (4, 8, 12)]
    output = tmp_path / "avg.pt"
    result = runner.invoke(app, ["average-checkpoints", str(run_dir), "--last", "5", "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert f"warning: --last 5, but {run_dir} has only 3 numbered checkpoint(s)" in result.stderr
    assert loaded_lines(result) == [expected(p) for p in steps]
    result = runner.invoke(app, ["translate", "--checkpoint", str(output), "--beam-size", "1"], input="a bird\n")
    assert loaded_lines(result) == [f"loaded {output} (average of 3 checkpoints, updates 4..12; no dev score recorded)"]
    result = runner.invoke(app, ["average-checkpoints", str(run_dir), "--last", "2", "-o", str(output), "--force"])
    assert result.exit_code == 0 and "warning" not in result.stderr
    assert loaded_lines(result) == [expected(p) for p in steps[1:]]


def test_an_average_warns_of_short_translations_as_its_newest_validated_input_does(run_dir, tmp_path):
    """translate's short-output warning reads the dev length statistic of the checkpoint; an average had none, so
    `--which average` never warned. It takes its newest validated input's (update 12); a checkpoint, or an average,
    of weights never validated has none, and translate says nothing about short outputs then."""
    validated = ckpt.load_checkpoint(ckpt.step_checkpoint_path(run_dir, 12))["dev"]
    output = tmp_path / "avg.pt"
    assert runner.invoke(app, ["average-checkpoints", str(run_dir), "--last", "3", "-o", str(output)]).exit_code == 0
    assert ckpt.load_for_inference(output).length_ratio_floor == validated["length_ratio_p01"] is not None
    unvalidated = tmp_path / "avg_4_8.pt"
    paths = [str(ckpt.step_checkpoint_path(run_dir, s)) for s in (4, 8)]  # validated at 6 and 12 only
    assert runner.invoke(app, ["average-checkpoints", *paths, "-o", str(unvalidated)]).exit_code == 0
    assert ckpt.load_for_inference(unvalidated).length_ratio_floor is None
    for path in (unvalidated, ckpt.step_checkpoint_path(run_dir, 8)):
        result = runner.invoke(app, ["translate", "--checkpoint", str(path), "--beam-size", "1"], input="a bird\n")
        assert result.exit_code == 0 and "shorter than" not in result.stderr, result.output


# -- rpr-mt plot ----------------------------------------------------------------------------------------------------


def test_plot_draws_a_png_of_the_run(run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    output = tmp_path / "curves.png"
    result = runner.invoke(app, ["plot", str(run_dir), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image  # a matplotlib dependency

    assert Image.open(output).size == (1100, 700)  # 11 x 7 inches at 100 dpi: the four panels


def test_plot_takes_a_metrics_file_as_well_as_its_run_and_writes_any_matplotlib_format(tmp_path):
    """`rpr-mt plot RUN/metrics.jsonl` said "no metrics.jsonl in RUN/metrics.jsonl": the file is taken as its run,
    the default image beside it. The help said PNG, while .pdf, .svg (any suffix matplotlib writes) work too."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": 1, "loss": 3.0, "nll": 2.9, "lr": 0.1, "tgt_tok_s": 100.0},
               {"step": 2, "loss": 2.5, "nll": 2.4, "lr": 0.1, "tgt_tok_s": 110.0},
               {"step": 2, "dev_nll": 2.6, "dev_bleu": 1.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = runner.invoke(app, ["plot", str(run / "metrics.jsonl")])
    assert result.exit_code == 0, result.output
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for suffix, magic in ((".pdf", b"%PDF"), (".svg", b"<?xml")):
        output = tmp_path / f"curves{suffix}"
        assert runner.invoke(app, ["plot", str(run), "-o", str(output)]).exit_code == 0
        assert output.read_bytes().startswith(magic), suffix
    help_text = " ".join(runner.invoke(app, ["plot", "--help"], env={"COLUMNS": "200"}).output.split())
    assert ".pdf, .svg" in help_text and "its metrics.jsonl" in help_text


def test_plot_and_average_write_through_a_symlink_and_keep_it(run_dir, tmp_path):
    """The temporary-then-rename writes replaced a symlink given as the output with a file (the link's own file
    kept its old contents): they now write the file the link points to, and the link stays."""
    pytest.importorskip("matplotlib")
    for name, command in (("curves.png", ["plot", str(run_dir)]),
                          ("avg.pt", ["average-checkpoints", str(run_dir), "--last", "2", "--force"])):
        real = tmp_path / "real" / name
        real.parent.mkdir(exist_ok=True)
        # an existing average is replaced with --force (anything else is refused: not a checkpoint)
        old = (run_dir / "checkpoints" / "checkpoint_00000004.pt").read_bytes() if name.endswith(".pt") else b"old"
        real.write_bytes(old)
        link = tmp_path / f"link_{name}"
        link.symlink_to(real)
        result = runner.invoke(app, [*command, "-o", str(link)])
        assert result.exit_code == 0, result.output
        assert link.is_symlink() and real.read_bytes() != old, name
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_plot_errors_are_one_line(run_dir, tmp_path, monkeypatch):
    assert_one_line_error(runner.invoke(app, ["plot", str(tmp_path)]), "no metrics.jsonl in")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the optional extra were not installed
    assert_one_line_error(runner.invoke(app, ["plot", str(run_dir), "-o", str(tmp_path / "x.png")]),
                          "pip install 'matplotlib>=3.7'")


def test_curves_of_a_resumed_run_keep_the_resumed_updates_once(tmp_path):
    records = [{"step": 1, "loss": 5.0}, {"step": 50, "loss": 4.0}, {"step": 100, "loss": 3.0},
               {"step": 100, "dev_nll": 3.5, "dev_bleu": 1.0}, {"step": 150, "loss": 2.9},  # killed after 150
               {"step": 150, "loss": 2.5}, {"step": 200, "loss": 2.0},  # resumed from the checkpoint at 100
               {"step": 200, "dev_nll": 2.2, "dev_bleu": 9.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    train_records, dev_records = read_curves(tmp_path)
    assert [(r["step"], r["loss"]) for r in train_records] == [(1, 5.0), (50, 4.0), (100, 3.0), (150, 2.5), (200, 2.0)]
    assert [r["step"] for r in dev_records] == [100, 200]


def _killed_run(directory: Path, cut_off: bool = True) -> Path:
    """A run killed while it wrote its fourth record: the last line is cut off (unless not ``cut_off``)."""
    records = [{"step": s, "loss": 5.0 - s / 100, "lr": 1e-3, "tgt_tok_s": 900.0 if s == 1 else 5000.0 + s}
               for s in (1, 50, 100)]
    directory.mkdir()
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + ('{"step": 150, "lo' if cut_off else ""))
    return directory


def test_plot_of_a_killed_run_skips_its_cut_off_last_line_and_says_so_once(tmp_path):
    pytest.importorskip("matplotlib")
    import os
    import subprocess

    run = _killed_run(tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "rpr_mt.cli", "plot", str(run)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "metrics.jsonl: line 4" in warnings[0] and "cut off" in warnings[0], done.stderr
    assert (run / "curves.png").is_file()


def test_plot_leaves_the_start_up_window_out_of_the_speed_panel(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from rpr_mt.curves import plot_run

    drawn: dict = {}
    plot = Axes.plot

    def spy(self, *args, **kwargs):
        drawn[kwargs.get("label")] = list(args[0])
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", spy)
    plot_run(_killed_run(tmp_path / "run", cut_off=False), tmp_path / "curves.png")
    assert drawn["target tokens/s"] == [50, 100]  # not update 1's window, which includes start-up
    assert drawn["learning rate"] == [1, 50, 100]  # the other panels keep every window


# -- progress bars: like train, only on a terminal unless --progress/--no-progress says -----------------------------


@pytest.mark.parametrize("command", [
    lambda run, src: ["translate", "--checkpoint", str(run), "--beam-size", "1", "-i", str(src), "-o", str(src) + ".out"],
    lambda run, src: ["eval-bleu", "--checkpoint", str(run), "--beam-size", "1", "--split", "dev"],
], ids=["translate", "eval-bleu"])
def test_no_progress_bar_into_a_pipe_unless_asked(run_dir, tmp_path, command):
    src = tmp_path / "src.en"
    src.write_text("a bird\nthe old farmer\n", encoding="utf-8")
    plain = runner.invoke(app, command(run_dir, src))  # CliRunner's stderr is not a terminal
    assert plain.exit_code == 0, plain.output
    assert "\r" not in plain.stderr and "sent/s" not in plain.stderr
    forced = runner.invoke(app, [*command(run_dir, src), "--progress"])
    assert forced.exit_code == 0, forced.output
    assert "\r" in forced.stderr and "translate" in forced.stderr  # tqdm's frames, as on a terminal
    assert "\r" not in runner.invoke(app, [*command(run_dir, src), "--no-progress"]).stderr


def test_eval_bleu_of_a_split_that_train_only_data_lacks_says_so(run_dir, tmp_path):
    """Data prepared with a train split alone holds no text files (train is kept as ids): --split dev was told to
    prepare the data first, which cannot help."""
    payload = ckpt.load_checkpoint(ckpt.resolve_checkpoint(run_dir, "best"))
    source = Path(payload["config"]["data"]["output_dir"])
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["splits"] = {"train": manifest["splits"]["train"]}
    (tmp_path / "train_only").mkdir()
    (tmp_path / "train_only" / "manifest.json").write_text(json.dumps(manifest))
    payload["config"]["data"]["output_dir"] = str(tmp_path / "train_only")
    ckpt.save_checkpoint(payload, tmp_path / "model.pt")
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(tmp_path / "model.pt"), "--split", "dev"])
    assert result.exit_code == 2 and "--split dev: " in result.output, result.output
    assert "has no such split (it has train); score a file of your own with --hyp/--ref" in result.output
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(tmp_path / "model.pt"), "--split", "train"])
    assert result.exit_code == 2 and "keeps the training pairs as token ids only, not as text" in result.output
    manifest["splits"]["dev"] = {"read": 5}  # prepared, and its text removed since
    (tmp_path / "train_only" / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(tmp_path / "model.pt"), "--split", "dev"])
    assert result.exit_code == 2 and "dev.en is missing from the prepared data: prepare it again with --force" \
        in result.output


def test_eval_bleu_checks_the_split_and_save_hyp_before_loading_the_weights(run_dir, monkeypatch):
    """A wrong --split or a --save-hyp over the references is said before the model loads (which can take a
    minute); the config and vocabulary are read from the checkpoint with its tensors only mapped."""
    from rpr_mt import cli

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(cli, "_load_model", no_load)
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(run_dir), "--split", "nope"])
    assert result.exit_code == 2 and "--split nope:" in result.output and "has no such split" in result.output
    config, sha = ckpt.peek_checkpoint(ckpt.resolve_checkpoint(run_dir, "best"))
    _, reference = split_paths(config, sha, run_dir, "test", None, None)  # the run's test reference
    result = runner.invoke(app, ["eval-bleu", "--checkpoint", str(run_dir), "--save-hyp", str(reference)])
    # (the reference of a prepared split: refused as a file of the prepared data, before it is known as an input)
    assert result.exit_code == 2 and "is a file of the prepared data in" in result.output
