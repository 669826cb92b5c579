"""What ``eval-bleu`` scores and says, beside rpr_mt.evaluate's metrics: the target language of a reference file,
which metrics apply to the data at hand, and the notes and warnings where the two sides of a score are in different
forms (raw text, Multi30k's lowercased tokenized text), whose scores would otherwise mislead without a word.

Scripts that score files reuse this policy through ``score_files``; ``split_paths`` finds and checks the prepared
split a checkpoint is scored on. The CLI only turns options into these calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from rpr_mt.errors import UserError
from rpr_mt.evaluate import recased_scores, score
from rpr_mt.languages import ISO_639_1
from rpr_mt.files import check_input, check_output
from rpr_mt.lines import count_lines, read_lines
from rpr_mt.text.casing import Casing
from rpr_mt.text.multi30k import raw_looking_lines, reads_as_raw, reads_as_tokenized

if TYPE_CHECKING:
    from rpr_mt.config import Config

Report = Callable[[str], None]

# The metrics that do not apply to a data source, and the one line that says why they are absent. Any other source
# (local files, which may hold any language or Multi30k itself) gets every metric.
_TOK_BLEU = ("tok_bleu_compound_split", "tok_bleu_description")
_LIT_BLEU = ("lc_tok_bleu", "lc_tok_bleu_signature", "lc_tok_bleu_description")
NOT_APPLYING = {
    "demo": (_TOK_BLEU + _LIT_BLEU,
             "the demo's target is a synthetic language, so the tokenized BLEU (a natural language's Moses rules and "
             "German compound splitting) and the Multi30k literature BLEU do not apply"),
    "wmt14": (_LIT_BLEU, "the data is WMT14, not Multi30k, so the Multi30k literature BLEU does not apply"),
}


def language_from_path(path: Union[str, Path]) -> Optional[str]:
    """The language code a file's name ends with (``test.de``, ``test.de.gz`` -> ``de``), or None when its last
    suffix (before ``.gz``) is not an ISO 639-1 code (``ref.txt``)."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix.lstrip(".")
    return suffix if suffix in ISO_639_1 else None


def check_language(lang: Optional[str], option: str = "--lang") -> None:
    """A given language must be an ISO 639-1 code: the tokenized BLEU's Moses rules fall back silently on others."""
    if lang is not None and lang not in ISO_639_1:
        raise UserError(f"{option} must be a two-letter ISO 639-1 language code such as en, de or fr (got {lang!r})")


def note_other_language(given: Optional[str], known: Optional[str], what: str, report: Report) -> None:
    """One line when a given language overrides one the input already names: the tokenizer's rules then change the
    score, which the user should see was asked for."""
    if given is not None and known is not None and given != known:
        report(f"note: --lang {given} overrides {what} ({known}): the hypotheses and references are tokenized "
               f"by {given}'s rules")


def data_source_of(reference: Path) -> Optional[str]:
    """The ``data.source`` that prepared ``reference``, where it is a file of a prepared data directory whose manifest
    records one; else None (a file of the user's own)."""
    from rpr_mt.data.prepare import read_manifest, written_by_prepare

    if not Path(reference).is_file() or not written_by_prepare(Path(reference)):
        return None
    try:
        source = read_manifest(Path(reference).parent).get("source")
    except UserError:
        return None
    return source if isinstance(source, str) else None


def applicable(scores: dict[str, Any], source: Optional[str]) -> dict[str, Any]:
    """``scores`` (``rpr_mt.evaluate.score``'s) with ``not_applicable`` added where some metrics do not apply to data
    from ``source`` (``NOT_APPLYING``): ``{"metrics": [their score keys], "reason": the line that says why}``. The
    table (``format_scores``) leaves those rows out and prints the reason; the JSON keeps every number, so that its
    keys stay the same for the scripts that read them."""
    keys, why = NOT_APPLYING.get(source or "", ((), ""))
    if not keys:
        return scores
    metrics = [key for key in keys if key in ("tok_bleu_compound_split", "lc_tok_bleu")]
    return {**scores, "not_applicable": {"metrics": metrics, "reason": why}}


def refuse_raw_as_pretokenized(path: Union[str, Path], lines: list[str]) -> None:
    """--pretokenized says both files are Multi30k's tokenized text: refuse one that reads as raw (``reads_as_raw``:
    a few lines of the tok/ files look raw, e.g. an abbreviation's full stop: ``ca. 120 cm``), naming its first such
    line. Scored as it is, raw text met tokenized text silently: a literature BLEU far below the right one."""
    if reads_as_raw(lines):
        raw = raw_looking_lines(lines)
        raise UserError(f"{path}: --pretokenized, but {len(raw)} of {len(lines)} lines look like raw text (line "
                        f"{raw[0]}: a capital letter, a bare quote or punctuation attached to a word); without "
                        "--pretokenized the literature's BLEU tokenizes it as Multi30k's script does")


def form_warnings(hyp: Union[str, Path], ref: Union[str, Path], hypotheses: list[str],
                  references: list[str]) -> list[str]:
    """The notes and warnings for files scored without --pretokenized whose forms differ or mislead: both
    Multi30k's tokenized text (scored as they are by the literature BLEU); tokenized hypotheses against raw
    references or the other way round (sacreBLEU, chrF and the tokenized BLEU then compare two forms and look like a
    failed model); all-lowercase hypotheses against cased references (a tok model's detokenized translations)."""
    said = []
    hyp_tokenized, ref_tokenized = reads_as_tokenized(hypotheses), reads_as_tokenized(references)
    if hyp_tokenized and ref_tokenized:
        said.append(f"note: {hyp} and {ref} both look like Multi30k's lowercased, Moses-tokenized text: the Multi30k "
                    "lit. BLEU scores them as they are; the tokenized BLEU tokenizes them again (--pretokenized: as "
                    "they are)")
    if reads_as_raw(references) and hyp_tokenized:
        said.append(f"warning: {hyp} looks like Multi30k's lowercased, Moses-tokenized text and {ref} like raw text: "
                    "sacreBLEU, chrF and the tokenized BLEU compare the two forms; the Multi30k lit. BLEU tokenizes "
                    "the references and is the comparable number (or score against the tok/ reference with "
                    "--pretokenized)")
    elif ref_tokenized and reads_as_raw(hypotheses):
        said.append(f"warning: {ref} looks like Multi30k's lowercased, Moses-tokenized text and {hyp} like raw text: "
                    "sacreBLEU, chrF and the tokenized BLEU compare the two forms; the Multi30k lit. BLEU tokenizes "
                    "the hypotheses and is the comparable number")
    elif _all_lowercase(hypotheses) and sum(1 for line in references if line != line.lower()) > len(references) / 2:
        said.append(f"warning: {hyp} is all lowercase and {ref} is cased: sacreBLEU, chrF and the tokenized BLEU are "
                    "case-sensitive and count a word that differs only in case as wrong; the Multi30k lit. BLEU "
                    "lowercases both and is the comparable number")
    return said


def _all_lowercase(lines: list[str]) -> bool:
    """Some line of ``lines`` has a letter, and none a capital."""
    return any(any(c.isalpha() for c in line) for line in lines) and all(line == line.lower() for line in lines)


def score_files(hyp: Path, ref: Path, lang: Optional[str], pretokenized: bool, report: Report) -> dict[str, Any]:
    """Score the file ``hyp`` against the file ``ref``: the target language from ``lang`` or ``ref``'s name, the
    files refused where --pretokenized meets raw text, the metrics that apply (``applicable``), and the notes and
    warnings of ``form_warnings`` given to ``report`` once scored (no warning before a one-line error)."""
    known = language_from_path(ref)
    note_other_language(lang, known, f"the language its name gives {ref.name}", report)
    lang = lang or known
    if lang is None and not pretokenized:  # pretokenized text is not tokenized again: no language needed
        # The Moses tokenizer of the paper's BLEU differs by language, so a guess would silently change the score.
        raise UserError(f"cannot tell the target language from the name {ref.name} (its suffix is not a language "
                        "code, as in test.de or test.de.gz); pass --lang, e.g. --lang de")
    hypotheses, references = read_lines(str(hyp)), read_lines(str(ref))
    if pretokenized:
        for path, lines in ((hyp, hypotheses), (ref, references)):
            refuse_raw_as_pretokenized(path, lines)
    scores = score(hypotheses, references, lang=lang or "", pretokenized=pretokenized, hyp_name=str(hyp),
                   ref_name=str(ref))
    if not pretokenized:
        for line in form_warnings(hyp, ref, hypotheses, references):
            report(line)
    return applicable(scores, data_source_of(ref))


def score_translations(hypotheses: list[str], ref: Path, lang: str, tokenized_model: bool, source: str,
                       hyp_name: str, report: Report, casing: Optional[Casing] = None) -> dict[str, Any]:
    """Score a model's translations against the reference file ``ref`` in target language ``lang``.
    ``tokenized_model``: the model translates into Multi30k's tokenized text (``is_pretokenized`` of its data), whose
    translations are scored as they are, against a reference in that form; a raw ``ref`` (the dataset's raw test
    file) is tokenized for the literature BLEU instead, said in one line, and with the model's ``casing`` model the
    cased sacreBLEU and chrF of the translations as translate gives them for raw text are added
    (``recased_scores``). Not decided by single lines: the tok/ dev reference has a few that look raw
    (``ca. 120 cm``), and tokenizing it again lowers the model's own score. ``source``: the model's ``data.source``,
    for the metrics that apply."""
    references = read_lines(str(ref))
    pretokenized = tokenized_model
    raw_reference = tokenized_model and reads_as_raw(references)
    if raw_reference:
        pretokenized = False
        report(f"note: {ref} is raw text and this model translates into Multi30k's tokenized text: the literature "
               "BLEU tokenizes the reference as the dataset's script does (prep:lc.norm.tok); sacreBLEU and chrF "
               "compare the tokenized translations with the raw reference")
    scores = score(hypotheses, references, lang=lang, pretokenized=pretokenized, hyp_name=hyp_name, ref_name=str(ref))
    if raw_reference and casing is not None:
        scores.update(recased_scores(hypotheses, references, lang, casing))  # the comparable sacreBLEU
    return applicable(scores, source)


def prepare_command(checkpoint: Path) -> str:
    """The command that prepares a model's data: with the config.yaml of its run directory (the checkpoint's, or the
    one holding it in checkpoints/), where there is one."""
    if checkpoint.is_dir():
        run_dir: Optional[Path] = checkpoint
    else:  # a file in a run's checkpoints/, or one alone (model.pt), whose parent is no run
        run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    config = run_dir / "config.yaml" if run_dir is not None else None
    if config is not None and config.is_file():
        return f"rpr-mt prepare --config {config}"
    return "rpr-mt prepare with the config it was trained by"


def split_paths(cfg: Config, vocab_sha256: str, checkpoint: Path, split: str, ref: Optional[Path],
                save_hyp: Optional[Path]) -> tuple[Path, Path]:
    """eval-bleu --checkpoint: the prepared source of ``split`` and its reference (``ref`` if given), checked, and
    --save-hyp checked against both. The data is the run's own, prepared with the model's vocabulary, from any
    directory (``prepared_data_of``)."""
    from rpr_mt.checkpoint_files import prepared_data_of  # deferred: scoring files needs no torch

    data_dir = prepared_data_of(cfg.data.output_dir, checkpoint, vocab_sha256)
    src_path, default_ref = data_dir / f"{split}.{cfg.data.src_lang}", data_dir / f"{split}.{cfg.data.tgt_lang}"
    if not src_path.is_file():
        with_text = sorted(p.name[: -len(f".{cfg.data.src_lang}")] for p in data_dir.glob(f"*.{cfg.data.src_lang}"))
        listed = _manifest_splits(data_dir)
        if split == "train" and split in listed:  # prepare keeps no training text: it can be large
            raise UserError(f"--split train: {data_dir} keeps the training pairs as token ids only, not as text; "
                            "score a file of your own with --hyp/--ref")
        if split in listed:  # prepared, and its text file removed since
            raise UserError(f"{src_path} is missing from the prepared data: prepare it again with --force "
                            f"({prepare_command(checkpoint)})")
        if with_text or listed:  # the data is there, the split is not: a prepare would not help
            raise UserError(f"--split {split}: {data_dir} has no such split (it has {', '.join(with_text or listed)}); "
                            "score a file of your own with --hyp/--ref")
        raise UserError(f"{src_path} not found: prepare the data first ({prepare_command(checkpoint)}) or pass "
                        "--hyp/--ref")
    if ref is None:
        ref = default_ref
        check_input(str(ref), "--ref (the split's reference)")
    if save_hyp is not None:  # the translations would replace the text they are translated from or scored on
        check_output(str(save_hyp), "--save-hyp", inputs=[src_path, ref])
    # before decoding (minutes of it), not after: each source line is translated into one line scored against ref's
    source_lines, ref_lines = count_lines(src_path), count_lines(ref)
    if source_lines != ref_lines:
        raise UserError(f"{ref} has {ref_lines} lines but {src_path}, which would be translated and scored against "
                        f"it, has {source_lines}; they must be line-aligned")
    return src_path, ref


def _manifest_splits(data_dir: Path) -> list[str]:
    """The splits a prepared data directory's manifest lists (none when it has no readable manifest)."""
    from rpr_mt.data.prepare import is_prepared, read_manifest

    if not is_prepared(data_dir):
        return []
    try:
        splits = read_manifest(data_dir).get("splits")
    except UserError:
        return []
    return list(splits) if isinstance(splits, dict) else []
