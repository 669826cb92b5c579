"""rpr_mt/checkpoint_files.py: what a checkpoint that does not fit says (the first mismatch, the checkpoint's name)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.checkpoint_files import vocab_from_payload, weights_mismatch
from rpr_mt.errors import UserError


def test_weights_mismatch_names_the_first_difference_and_counts_the_rest():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    weights = model.state_dict()
    assert weights_mismatch(model, weights) is None
    assert weights_mismatch(model, {**weights, "0.weight": torch.zeros(5, 3)}) == (
        "0.weight is [5, 3] in the checkpoint but [4, 3] in the model")
    missing = {k: v for k, v in weights.items() if k != "1.bias"}
    assert weights_mismatch(model, missing) == "1.bias is missing from the checkpoint"
    assert weights_mismatch(model, {**weights, "2.weight": torch.zeros(1)}) == (
        "the checkpoint has 2.weight, which the model lacks")
    both = {**missing, "0.weight": torch.zeros(5, 3), "2.weight": torch.zeros(1)}
    assert weights_mismatch(model, both) == "0.weight is [5, 3] in the checkpoint but [4, 3] in the model; 2 more differences"


def test_a_broken_vocabulary_names_the_checkpoint_not_a_temporary_file(tmp_path):
    broken = {"spm_model": torch.frombuffer(bytearray(b"no model"), dtype=torch.uint8)}
    with pytest.raises(UserError, match=r"^checkpoint old\.pt: its vocabulary is broken \(not a SentencePiece") as caught:
        vocab_from_payload(broken, "old.pt")
    assert "tmp" not in str(caught.value)
    with pytest.raises(UserError, match="^checkpoint old.pt: its vocabulary holds no SentencePiece model bytes"):
        vocab_from_payload({"size": 8}, "old.pt")


def test_a_folder_of_checkpoints_resolves_to_its_own_files_never_a_neighbours(tmp_path):
    """--which last / best of a folder that holds checkpoint files itself (no checkpoints/ inside): its newest
    numbered file. Before, 'last' looked in the parent's checkpoints/ (another run's model) and 'best' had no
    fallback there."""
    from rpr_mt.checkpoint_files import resolve_checkpoint

    nest = tmp_path / "nest"
    (nest / "checkpoints").mkdir(parents=True)
    (nest / "checkpoints" / "checkpoint_00000040.pt").write_bytes(b"x")  # a neighbouring run's
    flat = nest / "flat"
    flat.mkdir()
    for step in (900, 1150):
        (flat / f"checkpoint_{step:08d}.pt").write_bytes(b"x")
    assert resolve_checkpoint(flat, "last") == flat / "checkpoint_00001150.pt"
    assert resolve_checkpoint(flat, "best") == flat / "checkpoint_00001150.pt"
    assert resolve_checkpoint(nest, "last") == nest / "checkpoints" / "checkpoint_00000040.pt"  # a run directory
    assert resolve_checkpoint(nest / "checkpoints", "last") == nest / "checkpoints" / "checkpoint_00000040.pt"
    empty = nest / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no numbered checkpoints in"):
        resolve_checkpoint(empty, "last")
    with pytest.raises(UserError, match="--which must be best, last or average"):
        resolve_checkpoint(flat / "checkpoint_00000900.pt", "lats")  # a file ignores --which, but not its typo


def test_a_runs_relative_data_dir_is_found_from_any_directory(tmp_path, monkeypatch):
    """eval-bleu --checkpoint from outside the project: data.output_dir saved as 'data/x' (relative to where the
    run started) is found above the checkpoint; from inside the project, or absolute, it is taken as it is."""
    from rpr_mt.checkpoint_files import prepared_data_of

    project = tmp_path / "project"
    (project / "data" / "x").mkdir(parents=True)
    (project / "data" / "x" / "manifest.json").write_text("{}")
    checkpoint = project / "runs" / "r" / "checkpoints" / "checkpoint_best.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert prepared_data_of("data/x", checkpoint) == project / "data" / "x"
    assert prepared_data_of("data/y", checkpoint) == Path("data/y")  # nowhere: as saved, for the error to name
    monkeypatch.chdir(project)
    assert prepared_data_of("data/x", checkpoint).resolve() == (project / "data" / "x").resolve()


def test_the_run_s_own_data_with_the_model_s_vocabulary_is_taken_over_a_copy_here(tmp_path, monkeypatch):
    """A data directory of the same name in the working directory (a 50-line copy, another preparation) was
    scored instead of the run's: the project above the checkpoint comes first, and only data prepared with the
    checkpoint's SentencePiece model counts; data of another vocabulary is an error, not a silent score."""
    import json

    from rpr_mt.checkpoint_files import prepared_data_of
    from rpr_mt.errors import UserError

    def prepare(root: Path, sha: str) -> Path:
        (root / "data" / "x").mkdir(parents=True)
        (root / "data" / "x" / "manifest.json").write_text(json.dumps({"sentencepiece": {"model_sha256": sha}}))
        return root / "data" / "x"

    project, here = prepare(tmp_path / "project", "aaa"), prepare(tmp_path / "here", "bbb")
    checkpoint = tmp_path / "project" / "runs" / "r" / "checkpoint_best.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")
    monkeypatch.chdir(tmp_path / "here")
    assert prepared_data_of("data/x", checkpoint) == project  # the run's project, not the copy here
    assert prepared_data_of("data/x", checkpoint, "aaa") == project
    assert prepared_data_of("data/x", checkpoint, "bbb").resolve() == here.resolve()  # only this one fits the model
    with pytest.raises(UserError, match="another SentencePiece vocabulary than the model"):
        prepared_data_of("data/x", checkpoint, "ccc")
    assert prepared_data_of("data/y", checkpoint, "aaa") == Path("data/y")  # nothing prepared: as saved


# -- averaging ------------------------------------------------------------------------------------------------------


def _saved(directory: Path, step: int, weights: dict[str, torch.Tensor] | None = None, name: str | None = None,
           dev: dict | None = None, model: dict | None = None) -> Path:
    """A minimal checkpoint of update ``step`` (its config records the step, so the one an average takes is seen)."""
    from rpr_mt import checkpoint_files as ckpt

    payload = {"format": ckpt.FORMAT, "step": step,
               "config": {"model": model or {"d_model": 4}, "train": {"max_steps": step}},
               "vocab": {"fingerprint": "x" * 64, "size": 10, "spm_model": torch.zeros(1, dtype=torch.uint8)},
               "model": weights if weights is not None else {"w": torch.full((3,), float(step))}, "dev": dev}
    path = directory / (name or f"checkpoint_{step:08d}.pt")
    ckpt.save_checkpoint(payload, path)
    return path


def test_the_newest_update_gives_the_average_its_config_and_step_whatever_the_order_listed(tmp_path):
    """Listed newest first (as a shell glob sorted backwards, or by hand), the last file listed gave the average
    its config and update: `translate` said 'updates 6000..5750' and the average claimed update 5750."""
    from rpr_mt.checkpoint_files import average_checkpoints, describe_checkpoint

    old, new, mid = _saved(tmp_path, 5750), _saved(tmp_path, 6000), _saved(tmp_path, 5875)
    averaged = average_checkpoints([new, old, mid])
    assert averaged["step"] == 6000 and averaged["config"]["train"]["max_steps"] == 6000
    assert averaged["averaged_steps"] == [5750, 5875, 6000]
    assert averaged["averaged_from"] == [str(old), str(mid), str(new)]
    assert describe_checkpoint(averaged) == "average of 3 checkpoints, updates 5750..6000; no dev score recorded"
    in_order = average_checkpoints([old, mid, new])
    assert torch.equal(averaged["model"]["w"], in_order["model"]["w"])  # the same sum, in the same order
    assert torch.allclose(averaged["model"]["w"], torch.full((3,), 5875.0))


def test_checkpoints_either_side_of_a_resume_that_changed_an_ignored_setting_average(tmp_path):
    """A run may resume with another model.clip when its scheme ignores it; its train.average_last then averaged
    checkpoints from before and after, and was refused as two different models. A setting the scheme reads still
    is one."""
    from rpr_mt.checkpoint_files import average_checkpoints

    before = _saved(tmp_path, 100, model={"positions": "absolute", "clip": 4, "t5": {"num_buckets": 32}})
    after = _saved(tmp_path, 200, model={"positions": "absolute", "clip": 2, "t5": {"num_buckets": 8}})
    assert average_checkpoints([before, after])["averaged_steps"] == [100, 200]
    shaw = _saved(tmp_path, 300, model={"positions": "relative", "clip": 2})
    with pytest.raises(UserError, match="has a different model config"):
        average_checkpoints([_saved(tmp_path, 250, model={"positions": "relative", "clip": 4}), shaw])


def test_refusing_to_average_two_models_says_what_differs(tmp_path):
    """'has a different model config or vocabulary' left the user to diff two configs of ~20 keys each (two lit_search
    runs differed only in model.dropout): the message names the keys, or the vocabulary."""
    from rpr_mt.checkpoint_files import average_checkpoints

    base = _saved(tmp_path, 200, model={"d_model": 4, "dropout": 0.3})
    other = _saved(tmp_path, 100, model={"d_model": 4, "dropout": 0.2})
    with pytest.raises(UserError, match=r"\(model\.dropout 0\.2 against 0\.3\); cannot average$"):
        average_checkpoints([other, base])
    payload = ckpt.load_checkpoint(other)
    payload["config"]["model"]["dropout"] = 0.3
    payload["vocab"]["fingerprint"] = "y" * 64
    ckpt.save_checkpoint(payload, other)
    with pytest.raises(UserError, match=r"\(another SentencePiece vocabulary\); cannot average$"):
        average_checkpoints([other, base])


def test_a_checkpoint_listed_twice_is_refused(tmp_path):
    """The same file twice was averaged as two ('average of 2 checkpoints, updates 6000..6000'): it weighed twice."""
    from rpr_mt.checkpoint_files import average_checkpoints

    first, second = _saved(tmp_path, 5750), _saved(tmp_path, 6000)
    with pytest.raises(UserError, match=r"^.*checkpoint_00006000\.pt is listed twice: list each checkpoint once$"):
        average_checkpoints([first, second, second])
    (tmp_path / "sub").mkdir()
    respelled = tmp_path / "sub" / ".." / second.name  # the same file under another name
    with pytest.raises(UserError, match=rf"listed twice \(also as {re.escape(str(second))}\)"):
        average_checkpoints([second, first, respelled])
    copy = _saved(tmp_path, 6000, name="checkpoint_best.pt")  # the best checkpoint beside its numbered twin
    with pytest.raises(UserError, match=r"checkpoint_00006000\.pt and .*checkpoint_best\.pt are the same checkpoint "
                                        r"\(update 6000, identical weights\)"):
        average_checkpoints([first, second, copy])


def test_an_average_among_the_inputs_is_refused(tmp_path):
    """checkpoint_avg.pt listed with numbered checkpoints was averaged in silently, its checkpoints counted again
    (an average of 4 and 8, with 4 and 8, weighed them twice; with 12, gave 4 and 8 half the weight of 12). Its
    payload records what it averages; alone, it would only be copied."""
    from rpr_mt.checkpoint_files import average_checkpoints

    first, second, third = _saved(tmp_path, 4), _saved(tmp_path, 8), _saved(tmp_path, 12)
    average = tmp_path / "checkpoint_avg.pt"
    ckpt.save_checkpoint(average_checkpoints([first, second]), average)
    for inputs in ([average, third], [first, second, average], [average]):
        with pytest.raises(UserError, match=r"^\S*checkpoint_avg\.pt is already an average \(2 checkpoints: "
                                            r"checkpoint_00000004\.pt \.\. checkpoint_00000008\.pt\): average the "
                                            r"numbered checkpoints themselves, each once$"):
            average_checkpoints(inputs)


def test_the_same_update_with_other_weights_is_refused_as_not_one_trainings(tmp_path):
    from rpr_mt.checkpoint_files import average_checkpoints

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours, theirs = _saved(tmp_path / "a", 6000), _saved(tmp_path / "b", 6000, {"w": torch.zeros(3)})
    with pytest.raises(UserError, match=r"a/checkpoint_00006000\.pt and .*b/checkpoint_00006000\.pt both hold update "
                                        r"6000 but different weights"):
        average_checkpoints([ours, theirs])


def test_the_average_carries_the_dev_length_floor_of_its_newest_validated_input_and_no_dev_score(tmp_path):
    """translate warns about outputs shorter than the model's dev outputs (``length_ratio_p01``); the average had no
    statistic, so `--which average` never warned. Its dev scores belong to other weights and stay unclaimed."""
    from rpr_mt.checkpoint_files import average_checkpoints, describe_checkpoint

    def dev(step: int, floor: float) -> dict:
        return {"step": step, "nll": 1.0, "bleu": 40.0, "sentences": 300, "beam_size": 1, "length_ratio_p01": floor}

    paths = [_saved(tmp_path, 4000, dev=dev(4000, 0.5)), _saved(tmp_path, 5000, dev=dev(5000, 0.6)),
             _saved(tmp_path, 5250)]  # the newest was not validated
    averaged = average_checkpoints(list(reversed(paths)))
    assert averaged.get("dev") is None  # no BLEU or nll is claimed for the average's weights
    assert averaged["dev_lengths"] == {"step": 5000, "length_ratio_p01": 0.6}
    assert describe_checkpoint(averaged).endswith("no dev score recorded")
    assert "dev_lengths" not in average_checkpoints(paths[2:])  # no validated input: no statistic, as for its input


def test_an_average_of_one_checkpoint_is_said_in_the_singular(tmp_path):
    from rpr_mt.checkpoint_files import average_checkpoints, describe_checkpoint

    averaged = average_checkpoints([_saved(tmp_path, 5750)])
    assert describe_checkpoint(averaged) == "average of 1 checkpoint, update 5750; no dev score recorded"


def test_a_truncated_checkpoint_is_named_with_torch_s_reason_and_not_its_advice(tmp_path):
    """torch's message is a reason and then a paragraph of advice; the error once ended mid-sentence in the advice."""
    from rpr_mt.checkpoint_files import FORMAT, load_checkpoint, save_checkpoint

    whole = tmp_path / "whole.pt"
    save_checkpoint({"format": FORMAT, "config": {}, "vocab": {}, "model": {"w": torch.zeros(4096)}}, whole)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[:3000])
    with pytest.raises(UserError) as error:
        load_checkpoint(cut)
    message = str(error.value)
    assert message.startswith(f"checkpoint {cut} is corrupt or truncated (") and message.endswith(")")
    assert "likelihood" not in message and "central directory" in message


@pytest.mark.parametrize("given", ["dir", "model.bin"])
@pytest.mark.parametrize("with_info", [True, False])
def test_a_ctranslate2_export_is_named_as_such(tmp_path, given, with_info):
    """`translate --checkpoint EXPORT` said "no checkpoint_best.pt in EXPORT" (or failed to load model.bin): the
    export is CTranslate2's model, and the error says so and where its checkpoint is."""
    export = tmp_path / "demo_ct2"
    export.mkdir()
    (export / "model.bin").write_bytes(b"\0" * 16)
    (export / "config.json").write_text("{}")
    if with_info:
        (export / "rpr_mt.json").write_text(json.dumps({"checkpoint": "runs/demo/checkpoints/checkpoint_best.pt"}))
    path = export if given == "dir" else export / "model.bin"
    expected = ("the checkpoint it was exported from, runs/demo/checkpoints/checkpoint_best.pt" if with_info
                else "the run it was exported from")
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))} is a CTranslate2 model, not an rpr-mt checkpoint: "
                                        rf"decode it with CTranslate2 .* or pass {re.escape(expected)}$"):
        ckpt.resolve_checkpoint(path)
    (export / "other.pt").write_bytes(b"x")  # another file of that folder is not the export
    assert ckpt.resolve_checkpoint(export / "other.pt") == export / "other.pt"


@pytest.mark.parametrize("failure, reason", [
    (OSError(28, "No space left on device"), r"\(No space left on device\)"),
    # torch's zip writer reports a short write as its own RuntimeError, without the OS's reason
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
     r"\(torch's writer failed: .*unexpected pos 704 vs 598; .* MiB free there: a full disk or a file size limit\?\)"),
])
def test_a_failed_write_is_one_line_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch, failure, reason):
    """A full disk ended a run in a traceback (OSError, or torch's RuntimeError) in the middle of training."""
    path = tmp_path / "checkpoint_00000004.pt"
    ckpt.save_checkpoint({"w": torch.ones(2)}, path)
    before = path.read_bytes()

    def full_disk(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04partial")
        raise failure

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    with pytest.raises(UserError, match=rf"^cannot write {re.escape(str(path))} {reason}; the file there is unchanged$"):
        ckpt.save_checkpoint({"w": torch.zeros(2)}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_an_error_of_torch_save_that_is_not_a_write_is_not_hidden(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        ckpt.save_checkpoint({"w": torch.zeros(2)}, tmp_path / "c.pt")


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_checkpoints_get_the_mode_the_umask_gives_new_files(tmp_path):
    """mkstemp (the atomic write's temporary) makes 0o600 whatever the umask: every checkpoint was unreadable to
    others on a shared machine, beside a config.yaml they could read."""
    old = os.umask(0o022)
    try:
        ckpt.save_checkpoint({"model": {"w": torch.zeros(2)}}, tmp_path / "a.pt")
        assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        ckpt.save_checkpoint({"model": {"w": torch.zeros(2)}}, tmp_path / "b.pt")
        assert (tmp_path / "b.pt").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_the_casing_model_of_the_data_travels_with_the_vocabulary_and_its_checksum(tmp_path):
    """A checkpoint carries the casing model of lowercased data as it carries the SentencePiece model: bytes in its
    vocabulary, covered by its checksum, rebuilt on loading with no need of the data directory."""
    from rpr_mt.text import casing

    fixture = ckpt.load_checkpoint(Path(__file__).parent / "model" / "fixtures" / "old_shaw_per_head.pt")
    data = tmp_path / "data"
    data.mkdir()
    (data / "spm.model").write_bytes(fixture["vocab"]["spm_model"].numpy().tobytes())
    assert "casing_model" not in ckpt.vocab_payload(data / "spm.model")  # data that keeps its case: none
    assert vocab_from_payload(fixture["vocab"], "old.pt").casing is None
    model = casing.Casing("de", {"mann": "Mann"})
    casing.save(model, data / casing.FILE_NAME)
    payload = ckpt.vocab_payload(data / "spm.model")
    assert payload["casing_model"].numpy().tobytes() == (data / casing.FILE_NAME).read_bytes()
    saved = tmp_path / "with_casing.pt"
    ckpt.save_checkpoint({**fixture, "vocab": payload}, saved)
    (data / casing.FILE_NAME).unlink()
    assert vocab_from_payload(ckpt.load_checkpoint(saved)["vocab"], saved).casing == model
    assert ckpt.content_checksum({**fixture, "vocab": payload}) != ckpt.content_checksum(fixture)

    broken = {**payload, "casing_model": torch.frombuffer(bytearray(b"{not json"), dtype=torch.uint8)}
    with pytest.raises(UserError, match=r"^checkpoint old\.pt: its casing model is broken \(casing\.json: not a "):
        vocab_from_payload(broken, "old.pt")


def test_average_inputs_take_a_run_s_last_numbered_checkpoints_into_its_average_or_listed_files(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for step in (100, 20, 300, 4000):  # numbered order, not name order
        (folder / f"checkpoint_{step:08d}.pt").write_bytes(b"")
    (folder / "checkpoint_best.pt").write_bytes(b"")
    said: list[str] = []
    paths, output = ckpt.average_inputs([tmp_path / "run"], 2, None, said.append)
    assert [p.name for p in paths] == ["checkpoint_00000300.pt", "checkpoint_00004000.pt"] and not said
    assert output == folder / "checkpoint_avg.pt"
    paths, _ = ckpt.average_inputs([tmp_path / "run"], 9, tmp_path / "avg.pt", said.append)
    assert len(paths) == 4 and said == [said[0]] and "--last 9, but" in said[0] and "averaging 4" in said[0]
    files = [folder / "checkpoint_00000020.pt", folder / "checkpoint_00000100.pt"]
    assert ckpt.average_inputs(files, 20, tmp_path / "two.pt", said.append) == (files, tmp_path / "two.pt")
    with pytest.raises(UserError, match="--output is required when averaging listed checkpoint files"):
        ckpt.average_inputs(files, 20, None, said.append)


@pytest.mark.parametrize("name, reserved", [("checkpoint_00000500.pt", "a numbered name"),
                                            ("checkpoint_best.pt", "checkpoint_best.pt is reserved")])
def test_average_inputs_refuse_an_output_name_training_reserves(tmp_path, name, reserved):
    (tmp_path / "a.pt").write_bytes(b"")
    with pytest.raises(UserError, match=reserved):
        ckpt.average_inputs([tmp_path / "a.pt"], 20, tmp_path / name, print)


def test_average_inputs_say_a_missing_input_or_a_directory_among_several_first(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"")
    with pytest.raises(UserError, match="nope.pt does not exist"):
        ckpt.average_inputs([tmp_path / "a.pt", tmp_path / "nope.pt"], 20, None, print)
    with pytest.raises(UserError, match="is a directory: give one run directory, or checkpoint files"):
        ckpt.average_inputs([tmp_path / "a.pt", tmp_path], 20, tmp_path / "avg.pt", print)
    with pytest.raises(UserError, match="--last must be >= 1"):
        ckpt.average_inputs([tmp_path / "a.pt"], 0, tmp_path / "avg.pt", print)


def test_choose_which_says_where_the_choice_may_surprise(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "checkpoint_00000100.pt").write_bytes(b"")
    said: list[str] = []
    assert ckpt.choose_which(tmp_path / "run", None, said.append, resolve=True) == "best"
    assert len(said) == 1 and "has no checkpoint_best.pt" in said[0] and "as --which last" in said[0]
    best, average = folder / "checkpoint_best.pt", folder / "checkpoint_avg.pt"
    best.write_bytes(b"")
    average.write_bytes(b"")
    os.utime(best, (1_000, 1_000))
    said.clear()
    assert ckpt.choose_which(tmp_path / "run", None, said.append) == "best"
    assert len(said) == 1 and "averaged checkpoint newer than its best one" in said[0]
    said.clear()
    assert ckpt.choose_which(tmp_path / "run", "average", said.append) == "average" and not said
    assert ckpt.choose_which(best, "last", said.append) == "last"
    assert len(said) == 1 and "is a checkpoint file and is used as it is" in said[0]
    with pytest.raises(UserError):
        ckpt.choose_which(tmp_path / "nope", None, said.append, resolve=True)
