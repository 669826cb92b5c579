"""`rpr-mt export`: what CTranslate2 can hold is exported exactly, the rest is refused with a reason; the model
directory is complete (SentencePiece model included) and written atomically."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import rpr_mt.export.ctranslate2 as export
from rpr_mt import checkpoint_files as ckpt
from rpr_mt.cli import app
from rpr_mt.config import config_to_dict
from rpr_mt.data.vocab import Vocab
from rpr_mt.lines import read_lines
from rpr_mt.errors import UserError
from rpr_mt.export.ctranslate2 import export_ctranslate2, unsupported_reason
from rpr_mt.model.transformer import Seq2Seq

from .conftest import tiny_config

# Every kind of model CTranslate2 can hold, pre-norm and post-norm among them.
EXPRESSIBLE = {
    "absolute": dict(positions="absolute"),
    "absolute-learned-prenorm": dict(positions="absolute", absolute_kind="learned", norm="pre"),
    "none": dict(positions="none"),
    "relative-shared": dict(positions="relative", share_across_heads=True),
    "relative-shared-prenorm": dict(positions="relative", share_across_heads=True, norm="pre"),
    "relative-shared-keys-only": dict(positions="relative", share_across_heads=True, use_value=False),
    "relative-shared-values-only": dict(positions="relative", share_across_heads=True, use_key=False),
    "relative-per-head-one-head": dict(positions="relative", n_heads=1),
    "relative-k0-per-head": dict(positions="relative", clip=0),
    "absolute+relative-k0": dict(positions="absolute+relative", clip=0, norm="pre"),
    "t5": dict(positions="t5"),
    "t5-prenorm": dict(positions="t5", norm="pre"),
    "rope": dict(positions="rope"),
    "rope-prenorm-base": dict(positions="rope", norm="pre", rope={"base": 500.0}),
    "alibi": dict(positions="alibi"),
}

REFUSED = {
    "relative-per-head": (dict(positions="relative"), "--set model.share_across_heads=true"),
    "absolute+relative": (dict(positions="absolute+relative", share_across_heads=True),
                          "--set model.positions=relative"),
    "t5-per-layer": (dict(positions="t5", t5={"per_layer": True}), "--set model.t5.per_layer=false"),
    "xl": (dict(positions="xl"), "--set model.positions=relative --set model.share_across_heads=true"),
}

runner = CliRunner()


def random_checkpoint(data_dir: Path, path: Path, seed: int = 0, **model_settings) -> Path:
    """A checkpoint of a random 2+2-layer model whose every parameter (zero-initialised T5 tables and biases too)
    is moved off its initial value, so that each one matters to the outputs."""
    cfg = tiny_config(data_dir, path.parent / "run", **{"encoder_layers": 2, "decoder_layers": 2, **model_settings})
    vocab = Vocab.load(data_dir)
    torch.manual_seed(seed)
    model = Seq2Seq(cfg.model, vocab.size, vocab.pad_id, vocab.bos_id, vocab.eos_id)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    payload = {"format": ckpt.FORMAT, "step": 0, "config": config_to_dict(cfg),
               "vocab": ckpt.vocab_payload(data_dir / "spm.model"), "model": model.state_dict()}
    ckpt.save_checkpoint(payload, path)
    return path


def test_unsupported_models_are_refused_with_why_and_what_to_train(export_data):
    for name, (settings, advice) in REFUSED.items():
        reason = unsupported_reason(tiny_config(export_data, export_data, **settings).model)
        assert reason is not None and "cannot" in reason and advice in reason, name
        assert "\n" not in reason
    for name, settings in EXPRESSIBLE.items():
        assert unsupported_reason(tiny_config(export_data, export_data, **settings).model) is None, name


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
def test_exported_model_gives_rpr_mt_log_probabilities(tmp_path, export_data, name):
    """Teacher-forced log-probabilities of CTranslate2's float32 model equal rpr-mt's, a padded batch of sentences
    longer than the Shaw clip and the T5 exact buckets."""
    path = random_checkpoint(export_data, tmp_path / "random.pt", **EXPRESSIBLE[name])
    loaded = ckpt.load_for_inference(path)
    model, vocab = loaded.model, loaded.vocab
    export_ctranslate2(path, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    sources = read_lines(str(export_data / "dev.en"))[:3]
    targets = read_lines(str(export_data / "dev.de"))[:3]
    results = translator.score_batch([vocab.pieces(s) for s in sources], [vocab.pieces(t) for t in targets])
    for source, target, result in zip(sources, targets, results):
        src = torch.tensor([vocab.encode(source) + [vocab.eos_id]])
        tgt = vocab.encode(target)
        with torch.no_grad():
            lprobs = model(src, torch.tensor([[vocab.bos_id] + tgt])).log_softmax(-1)[0]  # [T + 1, V]
        ours = lprobs[torch.arange(len(tgt) + 1), torch.tensor(tgt + [vocab.eos_id])].numpy()
        np.testing.assert_allclose(np.array(result.log_probs), ours, atol=1e-4, rtol=0)


def test_export_is_sensitive_to_the_position_table(tmp_path, export_data, monkeypatch):
    """The check above can fail: CTranslate2's own sinusoids (concatenated halves) instead of rpr-mt's interleaved
    ones change the log-probabilities."""
    path = random_checkpoint(export_data, tmp_path / "random.pt", positions="absolute")
    loaded = ckpt.load_for_inference(path)
    model, vocab = loaded.model, loaded.vocab
    monkeypatch.setattr(export, "_position_encodings", lambda model: "__optional")  # the spec's OPTIONAL marker
    export_ctranslate2(path, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    source, target = "the old farmer sees the small red bird", "the bird"
    result = translator.score_batch([vocab.pieces(source)], [vocab.pieces(target)])[0]
    tgt = vocab.encode(target)
    with torch.no_grad():
        lprobs = model(torch.tensor([vocab.encode(source) + [3]]), torch.tensor([[2] + tgt])).log_softmax(-1)[0]
    ours = lprobs[torch.arange(len(tgt) + 1), torch.tensor(tgt + [3])].numpy()
    assert np.abs(np.array(result.log_probs) - ours).max() > 1e-2


def test_cli_export_writes_a_complete_model_directory(tmp_path, export_data):
    run_dir = tmp_path / "run"
    random_checkpoint(export_data, ckpt.step_checkpoint_path(run_dir, 7), positions="relative",
                      share_across_heads=True)
    out = tmp_path / "exported" / "ct2"
    result = runner.invoke(app, ["export", str(run_dir), "--output", str(out), "--which", "last"])
    assert result.exit_code == 0, result.output
    assert "exported the relative model" in result.output
    names = {p.name for p in out.iterdir()}
    assert names == {"model.bin", "config.json", "shared_vocabulary.json", "spm.model", "rpr_mt.json"}
    learned = random_checkpoint(export_data, tmp_path / "learned.pt", positions="absolute", absolute_kind="learned")
    said = runner.invoke(app, ["export", str(learned), "--output", str(tmp_path / "ct2_learned")])
    assert said.exit_code == 0 and "exported the learned absolute model" in said.output, said.output
    assert (out / "spm.model").read_bytes() == (export_data / "spm.model").read_bytes()
    info = json.loads((out / "rpr_mt.json").read_text())
    assert info["positions"] == "relative" and info["step"] == 0 and info["decode"]["beam_size"] == 4
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"
    assert json.loads((out / "shared_vocabulary.json").read_text())[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert [p.name for p in out.parent.iterdir()] == ["ct2"]  # no temporary directory left behind


def test_a_tok_multi30k_model_is_given_raw_lines_tokenized_as_translate_gives_them(tmp_path, export_data):
    """`rpr-mt translate` gives a model trained on Multi30k's tok/ text the lines that look raw lowercased and
    tokenized; ExportedTranslator.translate_lines, documented as translate's output, searched them as they were (9
    of 25 raw test lines translated as translate does on such a model). The export now records it."""
    path = random_checkpoint(export_data, tmp_path / "tok.pt", positions="rope")
    payload = ckpt.load_checkpoint(path)
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de")
    ckpt.save_checkpoint(payload, path)
    export_ctranslate2(path, tmp_path / "ct2")
    from rpr_mt.decode.ctranslate2 import ExportedTranslator

    translator = ExportedTranslator(tmp_path / "ct2")
    searched: list[list[list[int]]] = []
    real = translator.search
    translator.search = lambda sources, decode=None: searched.append(list(sources)) or real(sources, decode)
    lines = ["A small Dog.", "a small dog ."]
    translator.translate_lines(lines)
    assert searched[-1][0] == searched[-1][1] == translator.vocab.encode("a small dog .")
    translator.translate_lines(lines, tokenize=False)  # as --no-tokenize
    assert searched[-1][0] == translator.vocab.encode("A small Dog.")
    # and the raw line's translation detokenized back, as translate does (the tokenized line's as the model wrote it)
    translator.search = real
    translator.vocab.decode = lambda ids: "ein &quot; hund &quot; ."  # a random model's text would not show it
    assert translator.translate_lines(lines) == ['ein "hund".', "ein &quot; hund &quot; ."]
    assert translator.translate_lines(lines, detokenize=False) == ["ein &quot; hund &quot; ."] * 2


def test_a_tok_multi30k_model_exports_its_casing_model_and_recases_as_translate_does(tmp_path, export_data):
    """The casing model a checkpoint carries goes into the export (casing.json, named by rpr_mt.json), and
    translate_lines recases the raw lines' translations with it, as `rpr-mt translate` does; recase=False is
    --no-recase. A model of cased text exports none."""
    from rpr_mt.decode.ctranslate2 import ExportedTranslator
    from rpr_mt.text.casing import Casing

    path = random_checkpoint(export_data, tmp_path / "tok.pt", positions="rope")
    payload = ckpt.load_checkpoint(path)
    payload["config"]["data"].update(source="multi30k", multi30k_text="tok", multi30k_dir=str(tmp_path),
                                      src_lang="en", tgt_lang="de")
    casing = Casing("de", {"hund": "Hund"})
    payload["vocab"]["casing_model"] = torch.frombuffer(bytearray(casing.to_json().encode()), dtype=torch.uint8)
    ckpt.save_checkpoint(payload, path)
    export_ctranslate2(path, tmp_path / "ct2")
    assert json.loads((tmp_path / "ct2" / "rpr_mt.json").read_text())["casing_model"] == "casing.json"
    assert (tmp_path / "ct2" / "casing.json").read_text() == casing.to_json()

    translator = ExportedTranslator(tmp_path / "ct2")
    assert translator.casing == casing
    translator.vocab.decode = lambda ids: "ein &quot; hund &quot; ."
    lines = ["A small Dog.", "a small dog ."]  # raw, and already tokenized (kept as the model wrote it)
    assert translator.translate_lines(lines) == ['Ein "Hund".', "ein &quot; hund &quot; ."]
    assert translator.translate_lines(lines, recase=False) == ['ein "hund".', "ein &quot; hund &quot; ."]

    cased = random_checkpoint(export_data, tmp_path / "cased.pt", positions="rope")
    export_ctranslate2(cased, tmp_path / "ct2_cased")
    assert json.loads((tmp_path / "ct2_cased" / "rpr_mt.json").read_text())["casing_model"] is None
    assert not (tmp_path / "ct2_cased" / "casing.json").exists()
    assert ExportedTranslator(tmp_path / "ct2_cased").casing is None


def test_a_broken_casing_model_in_an_export_is_one_line_error(tmp_path, export_data):
    from rpr_mt.decode.ctranslate2 import ExportedTranslator
    from rpr_mt.text.casing import Casing

    path = random_checkpoint(export_data, tmp_path / "tok.pt", positions="rope")
    payload = ckpt.load_checkpoint(path)
    payload["vocab"]["casing_model"] = torch.frombuffer(bytearray(Casing("de", {}).to_json().encode()),
                                                        dtype=torch.uint8)
    ckpt.save_checkpoint(payload, path)
    export_ctranslate2(path, tmp_path / "ct2")
    (tmp_path / "ct2" / "casing.json").write_text("{not json")
    with pytest.raises(UserError, match="casing.json: not a casing model"):
        ExportedTranslator(tmp_path / "ct2")


def test_int8_export_translates(tmp_path, export_data):
    path = random_checkpoint(export_data, tmp_path / "random.pt", positions="t5")
    export_ctranslate2(path, tmp_path / "int8", quantization="int8")
    export_ctranslate2(path, tmp_path / "f32")
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.6 * (tmp_path / "f32" / "model.bin").stat().st_size
    translator = ctranslate2.Translator(str(tmp_path / "int8"), device="cpu", intra_threads=1)
    vocab = Vocab.load(tmp_path / "int8" / "spm.model")
    result = translator.translate_batch([vocab.pieces("a small dog")], beam_size=2, max_decoding_length=5)[0]
    assert 1 <= len(result.hypotheses[0]) <= 5


def test_refused_model_is_one_line_error_and_writes_nothing(tmp_path, export_data):
    path = random_checkpoint(export_data, tmp_path / "per_head.pt", positions="relative")
    result = runner.invoke(app, ["export", str(path), "--output", str(tmp_path / "ct2")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: relative position tables per head")
    assert "--set model.share_across_heads=true" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["per_head.pt"]


def test_existing_output_is_replaced_only_with_force_and_only_if_a_model(tmp_path, export_data):
    first = random_checkpoint(export_data, tmp_path / "a.pt", seed=1, positions="absolute")
    second = random_checkpoint(export_data, tmp_path / "b.pt", seed=2, positions="rope")
    out = tmp_path / "ct2"
    export_ctranslate2(first, out)
    with pytest.raises(UserError, match="already exists; pass --force"):
        export_ctranslate2(second, out)
    assert json.loads((out / "rpr_mt.json").read_text())["positions"] == "absolute"
    export_ctranslate2(second, out, force=True)
    assert json.loads((out / "rpr_mt.json").read_text())["positions"] == "rope"
    with pytest.raises(UserError, match="not a CTranslate2 model directory; refusing"):
        export_ctranslate2(second, tmp_path, force=True)  # a directory of other things is never replaced
    with pytest.raises(UserError, match="--quantization must be one of"):
        export_ctranslate2(second, tmp_path / "other", quantization="int3")


def test_an_output_that_cannot_be_created_is_one_error(tmp_path, export_data, monkeypatch):
    """The output's directory cannot be made (a read-only or virtual file system, e.g. /proc): a traceback from
    mkdir before."""
    path = random_checkpoint(export_data, tmp_path / "m.pt", positions="none")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(export, "tempfile", type("NoTempDirs", (), {"mkdtemp": staticmethod(refuse)}))
    with pytest.raises(UserError, match=r"--output .*ct2: cannot create it there \(Permission denied\)"):
        export_ctranslate2(path, tmp_path / "out" / "ct2")


def test_failed_export_leaves_the_previous_model_and_no_partial_one(tmp_path, export_data, monkeypatch):
    path = random_checkpoint(export_data, tmp_path / "m.pt", positions="none")
    out = tmp_path / "out" / "ct2"

    def crash(staged):
        raise OSError("disk full")

    monkeypatch.setattr(export, "_fsync_tree", crash)  # fails after the model files are written
    with pytest.raises(OSError, match="disk full"):
        export_ctranslate2(path, out)
    assert list(out.parent.iterdir()) == []
    monkeypatch.undo()
    export_ctranslate2(path, out)
    before = (out / "model.bin").read_bytes()
    monkeypatch.setattr(export, "_fsync_tree", crash)
    with pytest.raises(OSError):
        export_ctranslate2(path, out, force=True)
    assert [p.name for p in out.parent.iterdir()] == ["ct2"] and (out / "model.bin").read_bytes() == before


def test_missing_ctranslate2_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'ctranslate2>=4.7'"):
        export_ctranslate2(tmp_path / "missing.pt", tmp_path / "out")
