"""Bad input to every command, table-driven: exit code 2, exactly one `error:` line naming the file, line or key, no
traceback, and nothing written or changed on disk (issue #18). The valid checkpoint is a tiny fixture model."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

from rpr_mt.cli import app

FIXTURE = Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt"
OTHER = Path(__file__).parent / "model" / "fixtures" / "old_abs_sinusoidal.pt"


def setup(root: Path) -> dict[str, str]:
    """Files the cases refer to, by name."""
    (root / "run" / "checkpoints").mkdir(parents=True)
    shutil.copy(FIXTURE, root / "run" / "checkpoints" / "checkpoint_00000004.pt")
    shutil.copy(FIXTURE, root / "model.pt")
    shutil.copy(OTHER, root / "other.pt")
    (root / "truncated.pt").write_bytes(FIXTURE.read_bytes()[:5000])
    raw = torch.load(FIXTURE, weights_only=True)
    first = next(iter(raw["model"]))
    raw["model"][first] = raw["model"][first] + 1.0  # weights changed after the checksum... (none in old files)
    raw["checksum"] = "0" * 64
    torch.save(raw, root / "flipped.pt")
    (root / "empty_run").mkdir()
    (root / "src.en").write_text("a b c\nd e\n", encoding="utf-8")
    (root / "bad.en").write_bytes(b"fine\nbroken \xff\n")
    (root / "hyp.txt").write_text("x y\n", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "ref.de").write_text("x y\nz\n", encoding="utf-8")
    (root / "ref.txt").write_text("x y\n", encoding="utf-8")
    (root / "outdir").mkdir()
    good = gzip.compress(("ein Satz\n" * 100).encode())
    (root / "corrupt.en.gz").write_bytes(good[: len(good) // 2])
    (root / "unknown.yaml").write_text("model:\n  d_modle: 8\n", encoding="utf-8")
    (root / "dup.yaml").write_text("train:\n  seed: 1\n  seed: 2\n", encoding="utf-8")
    (root / "eps.yaml").write_text("train:\n  adam_eps: -1.0e-9\n", encoding="utf-8")
    (root / "nan.yaml").write_text("train:\n  peak_lr: .nan\n", encoding="utf-8")
    (root / "notyaml.yaml").write_text("model: [\n", encoding="utf-8")
    (root / "files.yaml").write_text(f"data:\n  source: files\n  output_dir: {root / 'prepared'}\n  splits:\n"
                                     f"    train: {{src: {root / 'src.en'}, tgt: {root / 'missing.de'}}}\n",
                                     encoding="utf-8")
    return {}


CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    # translate
    ("translate: missing checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/nope.pt"], "checkpoint not found"),
    ("translate: truncated checkpoint", lambda r: ["translate", "--checkpoint", f"{r}/truncated.pt", "-i",
                                                   f"{r}/src.en"], "truncated.pt is corrupt or truncated"),
    ("translate: checksum mismatch", lambda r: ["translate", "--checkpoint", f"{r}/flipped.pt", "-i", f"{r}/src.en"],
     "flipped.pt is corrupt: its tensors differ"),
    ("translate: output is a directory", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                                    "-o", f"{r}/outdir"], "outdir is a directory"),
    ("translate: output directory missing", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i",
                                                       f"{r}/src.en", "-o", f"{r}/no/out.de"], "does not exist"),
    ("translate: input missing", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/nope.en"],
     "nope.en: file not found"),
    ("translate: invalid UTF-8", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/bad.en"],
     "bad.en: line 2: invalid UTF-8"),
    ("translate: corrupt gzip", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/corrupt.en.gz"],
     "corrupt.en.gz: cannot read"),
    ("translate: bad --which", lambda r: ["translate", "--checkpoint", f"{r}/run", "--which", "newest"], "--which"),
    ("translate: nbest above beam", lambda r: ["translate", "--checkpoint", f"{r}/model.pt", "-i", f"{r}/src.en",
                                               "--beam-size", "2", "--nbest", "3"], "nbest"),
    ("translate: run without checkpoints", lambda r: ["translate", "--checkpoint", f"{r}/empty_run"], "empty_run"),
    # eval-bleu
    ("eval-bleu: mismatched lines", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/ref.de"],
     "line-aligned"),
    ("eval-bleu: missing reference", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/nope.de"],
     "nope.de: file not found"),
    ("eval-bleu: no language", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--ref", f"{r}/ref.txt"],
     "pass --lang"),
    ("eval-bleu: empty hypotheses", lambda r: ["eval-bleu", "--hyp", f"{r}/empty.txt", "--ref", f"{r}/ref.txt",
                                               "--lang", "de"], "empty"),
    ("eval-bleu: both modes", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt", "--checkpoint", f"{r}/model.pt"],
     "not both"),
    ("eval-bleu: --save-hyp is a directory", lambda r: ["eval-bleu", "--checkpoint", f"{r}/model.pt", "--save-hyp",
                                                        f"{r}/outdir"], "outdir is a directory"),
    ("eval-bleu: neither mode", lambda r: ["eval-bleu", "--hyp", f"{r}/hyp.txt"], "give --hyp and --ref"),
    # average-checkpoints
    ("average: numbered output name", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                 f"{r}/run/checkpoints/checkpoint_00000008.pt"], "reserved"),
    ("average: no numbered checkpoints", lambda r: ["average-checkpoints", f"{r}/empty_run"], "no numbered checkpoints"),
    ("average: --last 0", lambda r: ["average-checkpoints", f"{r}/run", "--last", "0"], "--last must be >= 1"),
    ("average: files without --output", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/model.pt"],
     "--output is required"),
    ("average: different models", lambda r: ["average-checkpoints", f"{r}/model.pt", f"{r}/other.pt", "-o",
                                             f"{r}/avg.pt"], "different model config"),
    ("average: output in a missing directory", lambda r: ["average-checkpoints", f"{r}/run", "--last", "1", "-o",
                                                          f"{r}/no/avg.pt"], "does not exist"),
    # train and prepare: the config
    ("train: missing config", lambda r: ["train", "--config", f"{r}/nope.yaml"], "config file not found"),
    ("train: unknown key", lambda r: ["train", "--config", f"{r}/unknown.yaml"], "did you mean 'model.d_model'"),
    ("train: duplicate key", lambda r: ["train", "--config", f"{r}/dup.yaml"], "duplicate key 'seed'"),
    ("train: negative epsilon", lambda r: ["train", "--config", f"{r}/eps.yaml"], "train.adam_eps must be positive"),
    ("train: NaN learning rate", lambda r: ["train", "--config", f"{r}/nan.yaml"], "train.peak_lr"),
    ("train: invalid YAML", lambda r: ["train", "--config", f"{r}/notyaml.yaml"], "invalid YAML"),
    ("train: bad --set", lambda r: ["train", "--set", "train.max_steps"], "section.key=value"),
    ("train: mistyped --set", lambda r: ["train", "--set", "train.max_step=3"], "did you mean 'train.max_steps'"),
    ("train: wrong type", lambda r: ["train", "--set", "model.d_model=big"], "model.d_model must be an integer"),
    ("train: negative weight decay", lambda r: ["train", "--set", "train.weight_decay=-1"], "train.weight_decay"),
    ("train: odd rope head", lambda r: ["train", "--set", "model.positions=rope", "--set", "model.d_model=12",
                                       "--set", "model.n_heads=4"], "even head dimension"),
    ("prepare: missing input file", lambda r: ["prepare", "--config", f"{r}/files.yaml"], "missing.de"),
    # export
    ("export: per-head Shaw tables", lambda r: ["export", f"{r}/model.pt", "--output", f"{r}/ct2"],
     "share_across_heads=true"),
    ("export: missing checkpoint", lambda r: ["export", f"{r}/nope.pt", "--output", f"{r}/ct2"], "checkpoint not found"),
]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("name, args, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, monkeypatch, name, args, fragment):
    setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, args(tmp_path))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith(("loaded ", "warning"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert snapshot(tmp_path) == before, "a failed command changed the disk"
