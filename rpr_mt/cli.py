"""The `rpr-mt` command line: thin commands that parse options and call importable functions.

Every command turns a ``UserError`` into one line on stderr and exit code 2 (no traceback), and Ctrl-C into
exit code 130; ``prepare``, ``train`` and ``translate`` stopped by SIGTERM or SIGHUP exit 128 + the signal's number,
as a shell reports them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
import typing
from pathlib import Path, PurePath
from typing import Callable, Iterator, List, Optional, TypeVar

from rpr_mt.host import sleep_waiting_openmp_threads

sleep_waiting_openmp_threads()  # before any command imports torch (rpr_mt/host.py says why); a user's own value wins

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

import rpr_mt  # noqa: E402
from rpr_mt.config import Config, load_config  # noqa: E402
from rpr_mt.errors import UserError  # noqa: E402
from rpr_mt.files import check_input, check_output, write_lines  # noqa: E402
from rpr_mt.progress import outlive_readers, show_progress  # noqa: E402
from rpr_mt.train.signals import exit_status, interruption, signal_exit_status  # noqa: E402


def _help_type_column(params: list) -> list:
    # Typer's help shows every option's type, flags included (`--dry-run <bool>`), though a flag takes no value;
    # an empty metavar leaves that column blank for flags, --help and --version among them. An argument's column
    # ignores its metavar and shows the Python annotation (`<list[Path]>`): a list of paths shows as `<path>...`.
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and param.nargs != 1 and _takes_a_path(param):
            param.display_type_rich = lambda ctx: "<path>..."
    return params


# click's UsageError, whether typer uses click itself or (newer typer) a copy of it inside typer
_UsageError = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")


def _echo_of_another_process() -> bool:
    """Under torchrun every process of a machine runs the same command, loads the same config and stops on the same
    bad input (or signal): only its first process (LOCAL_RANK 0) says so, not one identical line per GPU; each other
    machine's first process still says its own."""
    world = os.environ.get("WORLD_SIZE", "1")
    return world.isdigit() and int(world) > 1 and os.environ.get("LOCAL_RANK", "0") != "0"


def _say(text: str) -> None:
    """An error or stop line on stderr (see ``_echo_of_another_process``)."""
    if not _echo_of_another_process():
        typer.echo(text, err=True)


def _one_line_usage_error(exc: Exception, command: str = "rpr-mt") -> typer.Exit:
    """A usage error (an unknown option, a value of the wrong type, a missing argument) as the one `error:` line and
    exit code 2 that every other bad input gets, instead of click's framed usage block. ``command``: the command
    being parsed, for errors that carry no context (an option missing its value)."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # `rpr-mt` alone: the help, as before
        raise exc
    command = exc.ctx.command_path if exc.ctx is not None else command
    _say(f"error: {command}: {' '.join(exc.format_message().split())} (see {command} --help)")
    return typer.Exit(exc.exit_code)


def _takes_a_path(param) -> bool:  # noqa: ANN001 (a click or typer parameter)
    """Whether a parameter is declared as a Path (a list's or an Optional's items too)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:  # typer before 0.2x: click's own types
        return type(getattr(param, "type", None)).__name__ == "Path"
    annotation = descriptor.annotation
    annotation = next(iter(typing.get_args(annotation)), annotation)
    return isinstance(annotation, type) and issubclass(annotation, PurePath)


def _refuse_empty_paths(params: list, opts: dict) -> None:
    """An empty string given for a Path parameter, as one `error:` line and exit code 2. Path("") is ".", so it was
    taken for the current directory: "no checkpoint_best.pt in .", "--output . is a directory"."""
    for param in params:
        value = opts.get(param.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        if "" in values and _takes_a_path(param):
            name = (next((o for o in param.opts if o.startswith("--")), param.opts[0])
                    if param.param_type_name == "option" else param.metavar or param.name.upper())
            _say(f"error: {name}: an empty path; give a file or directory name")
            raise typer.Exit(2)


class _Parsing:
    """Shared by the group and its commands: no type column for flags in --help, one-line usage errors, and empty
    paths refused as such."""

    def make_parser(self, ctx):  # noqa: ANN001, ANN201 (click's signature)
        parser = super().make_parser(ctx)
        parse, params = parser.parse_args, self.get_params(ctx)

        def parse_args(args):  # noqa: ANN001, ANN202 (click's parser)
            opts, rest, order = parse(args=args)
            if not ctx.resilient_parsing:  # (shell completion parses half-typed lines)
                _refuse_empty_paths(params, opts)  # before typer makes "" into Path(".")
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    def get_params(self, ctx):  # noqa: ANN001, ANN201 (click's signature)
        return _help_type_column(super().get_params(ctx))

    def collect_usage_pieces(self, ctx):  # noqa: ANN001, ANN201 (click's signature)
        # typer 0.29 writes a required argument as {NAME} in the usage line, which reads like a template or a set;
        # click, --help's argument list and the README write NAME (an optional one stays [NAME])
        return [re.sub(r"^\{(.+)\}(\.\.\.)?$", r"\1\2", piece) for piece in super().collect_usage_pieces(ctx)]

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: ANN001, ANN003, ANN201 (click's)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageError as exc:
            command = " ".join(filter(None, [parent.command_path if parent is not None else "", info_name or ""]))
            raise _one_line_usage_error(exc, command or "rpr-mt") from None


class _Command(_Parsing, TyperCommand):
    pass


class _Group(_Parsing, TyperGroup):
    def resolve_command(self, ctx, args):  # noqa: ANN001, ANN201 (an unknown command name)
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as exc:
            raise _one_line_usage_error(exc) from None


def _examples(*lines: str) -> str:
    """A command's --help epilog: example command lines, one a line. Rich's help keeps single line breaks (it does
    not refill the epilog); square brackets would be read as markup, so examples use none."""
    assert not any("[" in line for line in lines), lines
    return "Examples:\n\n" + "\n".join(f"  {line}" for line in lines)


app = typer.Typer(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},  # the commands inherit it
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train and evaluate Transformers with relative position representations (Shaw et al., 2018).",
    epilog=_examples(
        "rpr-mt train --config configs/demo.yaml       # prepares the data, trains into runs/demo",
        "echo \"the old farmer sees the small red bird\" | rpr-mt translate --checkpoint runs/demo",
        "rpr-mt eval-bleu --checkpoint runs/demo --split test",
        "rpr-mt config keys train                      # every train key, its default and meaning",
        "rpr-mt COMMAND --help                         # a command's options and examples"),
)

F = TypeVar("F", bound=Callable[..., object])

ConfigOption = typer.Option(
    None, "--config", "-c",
    help="Experiment YAML (sections data, model, train, decode), e.g. configs/demo.yaml. Optional: without it every "
         "setting has its default.")
SetOption = typer.Option(
    None, "--set", metavar="SECTION.KEY=VALUE",
    help="Override a config value, after --config (repeatable), e.g. --set train.max_steps=100. The keys are the "
         "fields of rpr_mt/config.py: `rpr-mt config keys` and docs/configuration.md list each with its default and "
         "meaning.")
# No "[default: best]": typer's rich help reads square brackets as markup and drops them, and the default with them
WHICH_METAVAR = "<best|last|average>"
DEVICE_METAVAR = "<auto|cpu|cuda[:N]>"
WHICH_HELP = ("For a run directory: best (the default), last or average (the averaged checkpoint). While a run has no "
              "best checkpoint yet, best loads its newest numbered one.")
ProgressOption = typer.Option(
    None, "--progress/--no-progress", help="Progress bar on stderr (default: only when stderr is a terminal).")


def user_errors(fn: F) -> F:
    """Report UserError as `error: ...` + exit 2, and Ctrl-C as exit 130, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            _say(f"error: {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            # rpr_mt.train.signals.Terminated: SIGTERM, SIGHUP (and SIGINT before training) say which
            _say(interruption(exc))
            raise typer.Exit(exit_status(exc)) from None
        except BrokenPipeError:  # `rpr-mt translate ... | head` is not an error
            sys.stderr.close()
            raise typer.Exit(0) from None

    return wrapper  # type: ignore[return-value]


def _config(path: Optional[Path], overrides: Optional[List[str]]) -> Config:
    return load_config(path, overrides or [])


@app.command(cls=_Command, epilog=_examples(
    "rpr-mt prepare --config configs/demo.yaml",
    "rpr-mt prepare --config configs/multi30k_en_de_lit.yaml --force     # rebuild"))
@user_errors
def prepare(
    config: Optional[Path] = ConfigOption,
    set_: Optional[List[str]] = SetOption,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the prepared data is up to date."),
    progress: Optional[bool] = ProgressOption,
) -> None:
    """Download or read parallel text, clean it, train SentencePiece and write token-id arrays."""
    from rpr_mt.data.prepare import prepare as prepare_data
    from rpr_mt.train.signals import interrupt_on_stop_signals

    cfg = _config(config, set_)
    with interrupt_on_stop_signals():  # `timeout`, a scheduler: its temporary directory removed, as on Ctrl-C
        prepare_data(cfg.data, force=force, progress=show_progress(progress))


@app.command(cls=_Command, epilog=_examples(
    "rpr-mt train --config configs/demo.yaml",
    "rpr-mt train --config configs/demo.yaml --set model.clip=0 --set train.run_dir=runs/demo_k0",
    "rpr-mt train --config configs/demo.yaml --dry-run          # the model and its size only",
    "rpr-mt train --config configs/demo.yaml --more-steps 400   # continue a finished run",
    "rpr-mt config keys train                  # each train.KEY for --set: default, meaning"))
@user_errors
def train(
    config: Optional[Path] = ConfigOption,
    set_: Optional[List[str]] = SetOption,
    overwrite: bool = typer.Option(
        False, "--overwrite",
        help="Delete the run in run_dir (checkpoints, metrics, TensorBoard events) and start over, whatever its "
        "config; deleted once the new config's data and model are made, so an input error leaves it as it was."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the model, parameter count and tokens per update."),
    progress: Optional[bool] = typer.Option(
        None, "--progress/--no-progress",
        help="Progress bar with the time left (default: only when stderr is a terminal; else plain log lines)."),
    more_steps: Optional[int] = typer.Option(
        None, "--more-steps", metavar="N",
        help="Continue a finished run's latest checkpoint for N more updates (max_steps becomes its update + N; "
             "max_epochs, max_time and patience are lifted); an unfinished run resumes without it."),
) -> None:
    """Train a model; re-running the same command into the same run directory resumes it."""
    from rpr_mt.train.trainer import train as run_training

    cfg = _config(config, set_)
    _check_config_outside_new_run(config, cfg.train.run_dir, dry_run)
    with outlive_readers():  # a log reader that goes away must not end the run between checkpoints, nor its exit code
        result = run_training(cfg, overwrite=overwrite, dry_run=dry_run, progress=show_progress(progress),
                              more_steps=more_steps)
        if result.stopped_by == "signal":
            # --more-steps counts from the latest checkpoint: the same command again would move the target
            how = ("run the same command again to resume" if more_steps is None else
                   f"to go on to update {result.max_steps}, run it again with --set train.max_steps={result.max_steps} "
                   "instead of --more-steps")
            _say(f"interrupted: saved {result.last_checkpoint}; {how}")
            # 128 + the signal's number, as a shell reports it (and as translate exits): 143 for a scheduler's
            # SIGTERM, 130 for Ctrl-C and for a DDP rank that stopped because another received the signal
            raise typer.Exit(signal_exit_status(result.signal))


def _check_config_outside_new_run(config: Optional[Path], run_dir: str, dry_run: bool) -> None:
    """A config kept as the run directory's config.yaml, for a run not yet trained there: the run writes its resolved
    config to that file, so it was refused as 'a run with a different config' (its defaults filled in), and under
    --overwrite the user's file, comments and all, was replaced. (A trained run's own config.yaml given back as
    --config resumes it: that is the file the run wrote.)"""
    from rpr_mt.checkpoint_files import list_step_checkpoints

    if config is None or dry_run:
        return
    saved = Path(run_dir) / "config.yaml"
    if saved.is_file() and os.path.samefile(config, saved) and not list_step_checkpoints(run_dir):
        raise UserError(f"--config {config} is train.run_dir's config.yaml, where the run writes its resolved config: "
                        "keep your config outside the run directory (e.g. configs/) or choose another train.run_dir")


@app.command(cls=_Command, epilog=_examples(
    "echo \"the old farmer sees the small red bird\" | rpr-mt translate --checkpoint runs/demo",
    "rpr-mt translate --checkpoint runs/demo --which average -i input.en -o output.de --beam-size 5",
    "rpr-mt translate --checkpoint runs/demo/checkpoints/checkpoint_best.pt --no-split < input.en"))
@user_errors
def translate(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A checkpoint file or a run directory."),
    which: Optional[str] = typer.Option(None, "--which", metavar=WHICH_METAVAR, help=WHICH_HELP, show_default=False),
    input: str = typer.Option("-", "--input", "-i",
                              help="Source text file, one segment a line (a sentence, or several: they are split and "
                                   "their translations joined); '-' = stdin."),
    output: str = typer.Option("-", "--output", "-o", help="Output file ('-' = stdout)."),
    beam_size: Optional[int] = typer.Option(None, "--beam-size", help="Beam size (1 = greedy); default from config."),
    length_penalty: Optional[float] = typer.Option(
        None, "--length-penalty", help="GNMT alpha; default from config (decode.length_penalty)."),
    nbest: Optional[int] = typer.Option(
        None, "--nbest", help="Print the N best (N <= beam size) as index<TAB>score<TAB>text; default from config: 1."),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", help="Source tokens per batch; default from config (decode.max_tokens)."),
    min_length: Optional[int] = typer.Option(
        None, "--min-length", help="No eos before this many output tokens (default from config: 1; 0 allows an "
        "empty translation)."),
    buffer_lines: Optional[int] = typer.Option(
        None, "--buffer-lines", help="Input lines decoded and written at a time (default from config: 2000); an "
        "interrupted -o FILE keeps the finished ones in FILE.partial."),
    device: str = typer.Option("auto", "--device", metavar=DEVICE_METAVAR,
                               help="Where the model runs (auto: cuda when available)."),
    progress: Optional[bool] = ProgressOption,
    split_sentences: Optional[bool] = typer.Option(
        None, "--split-sentences/--no-split",
        help="Translate sentence by sentence, or each line whole; default from config (decode.split_sentences: true)."),
    no_tokenize: bool = typer.Option(
        False, "--no-tokenize",
        help="Give a model trained on Multi30k's tokenized text (data.multi30k_text: tok) the lines as they are; "
        "without it, lines that look raw are lowercased, normalized and tokenized as that text was."),
    detokenize: bool = typer.Option(
        True, "--detokenize/--no-detokenize",
        help="The translations of the lines tokenized for such a model detokenized back to plain text, or left in "
        "the model's tokenized form (the form the Multi30k literature scores)."),
    recase: bool = typer.Option(
        True, "--recase/--no-recase",
        help="Those detokenized translations recased with the casing model that `rpr-mt prepare` learned from the "
        "training data's raw target text (German nouns capitalised, each sentence's first letter), or left "
        "lowercase."),
) -> None:
    """Translate text with a trained model."""
    from rpr_mt.config import is_pretokenized
    from rpr_mt.decode import pretokenize
    from rpr_mt.decode.arriving import open_input
    from rpr_mt.decode.translate import iter_translations

    check_input(input, "--input")
    check_output(output, "--output", inputs=[input, checkpoint])
    options = _given(beam_size=beam_size, length_penalty=length_penalty, nbest=nbest, max_tokens=max_tokens,
                     min_length=min_length, buffer_lines=buffer_lines, split_sentences=split_sentences)
    _check_decode_options(options)
    _device(device)
    which = _which(checkpoint, which, resolve=True)  # a wrong path or --which first: cheap, and said even with no input
    lines, total = open_input(input)  # checked (bad bytes, empty) before the model loads
    loaded = _load_model(checkpoint, which, device)
    model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
    decode = _decode_config(cfg, options)
    raw = pretokenize.RawLines()  # the input lines that looked raw and were tokenized, of all lines read
    if is_pretokenized(cfg.data) and not no_tokenize:
        lines = pretokenize.TokenizedAsMulti30k(lines, cfg.data.src_lang, decode.buffer_lines, raw)
    outputs = iter_translations(model, vocab, lines, decode=decode, device=_device(device),
                                progress=show_progress(progress), src_lang=cfg.data.src_lang,
                                tgt_lang=cfg.data.tgt_lang, min_length_ratio=loaded.length_ratio_floor, total=total)
    casing = vocab.casing if detokenize and recase else None
    if detokenize:  # raw text in, plain (cased) text out
        outputs = pretokenize.detokenize_outputs(outputs, raw.plain, decode.nbest, cfg.data.tgt_lang, casing)
    _write_translations(output, outputs, raw, detokenize, recase, casing is not None)


def _write_translations(output: str, outputs: Iterator[str], raw, detokenized: bool, recase: bool,  # noqa: ANN001
                        recased: bool) -> None:
    """Write translate's ``outputs`` (``write_lines``), then say how many input lines were tokenized for the model
    (``raw``, a ``pretokenize.RawLines``) and whether their translations were recased: at the end, or at an
    interrupt of the lines read until then."""
    from rpr_mt.decode.pretokenize import note_tokenized
    from rpr_mt.train.signals import interrupt_on_stop_signals

    try:
        with interrupt_on_stop_signals():  # `timeout`, a scheduler, a closed terminal: FILE.partial kept, as on Ctrl-C
            write_lines(output, outputs, report=_stderr)
    except KeyboardInterrupt:  # the lines kept (in FILE.partial, or already printed) were tokenized all the same
        note_tokenized(raw, detokenized, _stderr, " read so far", recase=recase, recased=recased)
        raise
    note_tokenized(raw, detokenized, _stderr, recase=recase, recased=recased)


@app.command("eval-bleu", cls=_Command, epilog=_examples(
    "rpr-mt eval-bleu --checkpoint runs/demo --split test      # translate the split, then score it",
    "rpr-mt eval-bleu --checkpoint runs/demo --which average --save-hyp test.hyp",
    "rpr-mt eval-bleu --hyp output.de --ref reference.de --json"))
@user_errors
def eval_bleu(
    hyp: Optional[Path] = typer.Option(None, "--hyp", help="Hypothesis file (detokenized, unless --pretokenized)."),
    ref: Optional[Path] = typer.Option(
        None, "--ref", help="Reference file (detokenized, unless --pretokenized); a name like test.de or test.de.gz "
        "gives the language. With --checkpoint: default, the split's prepared reference."),
    lang: Optional[str] = typer.Option(
        None, "--lang",
        help="Target language for tokenized BLEU (default: the --ref file's suffix, or the checkpoint's data)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Translate a split with this model first."),
    which: Optional[str] = typer.Option(None, "--which", metavar=WHICH_METAVAR, help=WHICH_HELP, show_default=False),
    split: str = typer.Option("test", "--split", help="With --checkpoint: the prepared split to translate."),
    beam_size: Optional[int] = typer.Option(
        None, "--beam-size", help="With --checkpoint: beam size (1 = greedy); default from the model's config."),
    length_penalty: Optional[float] = typer.Option(
        None, "--length-penalty", help="With --checkpoint: GNMT alpha; default from the model's config."),
    min_length: Optional[int] = typer.Option(
        None, "--min-length", help="With --checkpoint: no eos before this many output tokens; default from the model's "
        "config (1; 0 allows an empty translation)."),
    save_hyp: Optional[Path] = typer.Option(None, "--save-hyp", help="With --checkpoint: write the translations here."),
    pretokenized: bool = typer.Option(
        False, "--pretokenized",
        help="--hyp and --ref are already Multi30k's lowercased, normalized, tokenized text (its tok/ files): score "
        "the literature's BLEU on them as they are; a file that reads as raw (10% or more of its lines look raw) is "
        "refused (with --checkpoint: decided by the model's data.multi30k_text; a raw --ref is tokenized)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    device: str = typer.Option("auto", "--device", metavar=DEVICE_METAVAR,
                               help="With --checkpoint: where the model runs (auto: cuda when available)."),
    progress: Optional[bool] = ProgressOption,
    split_sentences: Optional[bool] = typer.Option(
        None, "--split-sentences/--no-split",
        help="With --checkpoint: translate sentence by sentence, or each line whole; default from the model's config "
        "(decode.split_sentences: true)."),
) -> None:
    """Score translations, given or made by a checkpoint, with BLEU and chrF.

    sacreBLEU (+ signature), chrF, the paper's tokenized BLEU with compound splitting, and the Multi30k literature's
    BLEU (lowercased, punctuation-normalized, Moses-tokenized text); only those that apply to the data."""
    from rpr_mt.evaluate import format_scores
    from rpr_mt.scoring import check_language, score_files

    check_language(lang)
    # Path problems first (exists, is a file, readable), naming conventions after: a --ref that is a directory is
    # not a question of its suffix.
    if hyp is not None and ref is not None and str(hyp) == str(ref) == "-":  # the second read found stdin empty
        raise UserError("--hyp and --ref cannot both be stdin (-): give at least one of them as a file")
    for path, option in ((hyp, "--hyp"), (ref, "--ref")):
        if path is not None:
            check_input(str(path), option)
    options = _given(beam_size=beam_size, length_penalty=length_penalty, min_length=min_length,
                     split_sentences=split_sentences)
    if checkpoint is not None:
        scores = _score_checkpoint(checkpoint, which, split, hyp, ref, save_hyp, lang, options, device, progress)
    else:
        _refuse_checkpoint_options(hyp, ref, save_hyp, split=split, which=which, device=device, **options)
        scores = score_files(hyp, ref, lang, pretokenized, report=_stderr)  # type: ignore[arg-type]
    typer.echo(format_scores(scores, as_json=as_json))


def _refuse_checkpoint_options(hyp: Optional[Path], ref: Optional[Path], save_hyp: Optional[Path], *, split: str,
                               which: Optional[str], device: str, **options: object) -> None:
    """eval-bleu --hyp/--ref: both given, and none of the options that only change how a checkpoint translates
    (given with --hyp they would silently do nothing)."""
    if hyp is None or ref is None:
        raise UserError("give --hyp and --ref, or --checkpoint (and --split)")
    unused = [name for name, value, default in (
        ("--split", split, "test"), ("--which", which, None), ("--beam-size", options.get("beam_size"), None),
        ("--length-penalty", options.get("length_penalty"), None), ("--min-length", options.get("min_length"), None),
        ("--device", device, "auto")) if value != default]
    if unused:
        raise UserError(f"{unused[0]} goes with --checkpoint (it changes what that model translates or how); "
                        "--hyp is scored as it is")
    if save_hyp is not None:  # nothing is translated, so nothing would be saved
        raise UserError("--save-hyp goes with --checkpoint (it saves that model's translations)")
    if "split_sentences" in options:  # nothing is translated, so nothing would be split
        flag = "--split-sentences" if options["split_sentences"] else "--no-split"
        raise UserError(f"{flag} goes with --checkpoint (it changes how that model translates)")


def _score_checkpoint(checkpoint: Path, which: Optional[str], split: str, hyp: Optional[Path], ref: Optional[Path],
                      save_hyp: Optional[Path], lang: Optional[str], options: dict, device: str,
                      progress: Optional[bool]) -> dict:
    """eval-bleu --checkpoint: translate the prepared ``split`` (checked, with --save-hyp, before the weights load)
    and score the translations against its reference or ``ref``."""
    from rpr_mt.checkpoint_files import peek_checkpoint, resolve_checkpoint
    from rpr_mt.config import is_pretokenized
    from rpr_mt.decode.translate import translate_lines
    from rpr_mt.lines import read_lines
    from rpr_mt.scoring import note_other_language, score_translations, split_paths

    if hyp is not None:
        raise UserError("--hyp goes with --ref, not with --checkpoint (which translates --split and scores its own "
                        "translations; --ref with it replaces the split's reference)")
    if save_hyp is not None:
        check_output(str(save_hyp), "--save-hyp")
    _check_decode_options(options)  # before the model loads
    _device(device)
    which = _which(checkpoint, which)
    # The split and --save-hyp are checked before the weights load, from the checkpoint's config and vocabulary
    # fingerprint read without its tensors (where torch can map the file; else after loading, below).
    peeked = peek_checkpoint(resolve_checkpoint(checkpoint, which))
    if peeked is not None:
        src_path, ref = split_paths(peeked[0], peeked[1], checkpoint, split, ref, save_hyp)
    loaded = _load_model(checkpoint, which, device)
    model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
    if peeked is None:
        src_path, ref = split_paths(cfg, vocab.fingerprint, checkpoint, split, ref, save_hyp)
    note_other_language(lang, cfg.data.tgt_lang, "the target language of the checkpoint's data", _stderr)
    decode = _decode_config(cfg, {**options, "nbest": 1})
    _stderr(f"translating {src_path}, scoring against {ref}")  # which copy of the data, when there are several
    hypotheses = translate_lines(model, vocab, read_lines(str(src_path)), decode=decode, device=_device(device),
                                 progress=show_progress(progress), src_lang=cfg.data.src_lang,
                                 tgt_lang=cfg.data.tgt_lang, min_length_ratio=loaded.length_ratio_floor)
    if save_hyp is not None:
        write_lines(str(save_hyp), hypotheses, report=_stderr)
    return score_translations(hypotheses, ref, lang or cfg.data.tgt_lang, is_pretokenized(cfg.data), cfg.data.source,
                              f"translations of {src_path}", _stderr, casing=vocab.casing)


@app.command("average-checkpoints", cls=_Command, epilog=_examples(
    "rpr-mt average-checkpoints runs/demo --last 5   # into runs/demo/checkpoints/checkpoint_avg.pt",
    "rpr-mt average-checkpoints a.pt b.pt c.pt -o averaged.pt"))
@user_errors
def average_checkpoints_command(
    inputs: List[Path] = typer.Argument(..., metavar="INPUTS", help="A run directory, or checkpoint files to average."),
    last: int = typer.Option(20, "--last", help="With a run directory: average its last N numbered checkpoints."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o",
        help="The averaged checkpoint; with a run directory, default RUN/checkpoints/checkpoint_avg.pt (required with "
        "checkpoint files)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output checkpoint (no other file)."),
) -> None:
    """Average model parameters of several checkpoints (the paper averages the last 20 for big models)."""
    from rpr_mt import checkpoint_files as ckpt

    paths, output = ckpt.average_inputs(inputs, last, output, _stderr)
    check_output(str(output), "--output", inputs=paths, text=False)
    if output.exists() or output.is_symlink():  # in a finished run, checkpoint_avg.pt is the one result.json scored
        # what it is first: "pass --force" for a file that --force then refuses to replace would mislead
        if not ckpt.is_checkpoint_file(output):
            raise UserError(f"--output {output} exists and is not an rpr-mt checkpoint; refusing to replace it "
                            "(even with --force): give another file name")
        if not force:
            raise UserError(f"--output {output} already exists; pass --force to replace it")
    averaged = ckpt.average_checkpoints(paths, report=_stderr)
    ckpt.save_checkpoint(averaged, output)
    names = [Path(path).name for path in averaged["averaged_from"]]  # by update, as averaged
    span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    typer.echo(f"averaged {len(names)} checkpoint{'' if len(names) == 1 else 's'} ({span}) into {output}", err=True)


@app.command(cls=_Command, epilog=_examples(
    "rpr-mt plot runs/demo                   # runs/demo/curves.png",
    "rpr-mt plot runs/demo -o curves.pdf"))
@user_errors
def plot(
    run: Path = typer.Argument(..., metavar="RUN", help="A training run directory, or its metrics.jsonl."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Image file, its format by its suffix (.png, .pdf, .svg, ...: any that matplotlib "
        "writes); default: RUN/curves.png."),
) -> None:
    """Draw one run's learning curves (loss, dev BLEU, learning rate, tokens/s) as an image; needs matplotlib."""
    from rpr_mt.curves import plot_run

    if output is not None:
        check_output(str(output), "--output", text=False)
    typer.echo(f"wrote {plot_run(run, output)}", err=True)


@app.command("export", cls=_Command, epilog=_examples(
    "rpr-mt export runs/demo_shared --output runs/demo_ct2",
    "rpr-mt export runs/demo_shared --which average --output runs/demo_ct2_int8 --quantization int8"))
@user_errors
def export_command(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT", help="A run directory or a checkpoint file."),
    output: Path = typer.Option(..., "--output", "-o", help="The CTranslate2 model directory to write."),
    which: Optional[str] = typer.Option(None, "--which", metavar=WHICH_METAVAR, help=WHICH_HELP, show_default=False),
    quantization: Optional[str] = typer.Option(
        None, "--quantization", help="CTranslate2 weight type (int8, int8_float32, int16, float16, ...); "
                                     "default: float32, as trained."),
    force: bool = typer.Option(False, "--force", help="Replace an existing CTranslate2 model directory."),
) -> None:
    """Export a trained model to CTranslate2 (with its SentencePiece model) for fast inference."""
    from rpr_mt.export.ctranslate2 import export_ctranslate2

    which = _which(checkpoint, which)
    result = export_ctranslate2(checkpoint, output, which=which, quantization=quantization, force=force)
    typer.echo(f"exported the {result.positions_label} model {result.checkpoint} to {result.output} "
               f"({result.quantization or 'float32'} weights)", err=True)


config_app = typer.Typer(
    cls=_Group, no_args_is_help=True,
    help="List the config keys with their defaults and meanings, or print a resolved config.")
app.add_typer(config_app, name="config")


@config_app.command("keys", cls=_Command, epilog=_examples(
    "rpr-mt config keys                      # every key",
    "rpr-mt config keys decode               # one section",
    "rpr-mt config keys train.max_steps      # one key",
    "rpr-mt config keys | grep -i warmup"))
@user_errors
def config_keys_command(
    section: Optional[str] = typer.Argument(
        None, metavar="SECTION", show_default=False,
        help="A section (data, model, model.t5, train, decode, ...) or a key (train.max_steps); default: all."),
) -> None:
    """List config keys, each with its default, type and meaning (the comments of rpr_mt/config.py)."""
    from rpr_mt.config_reference import render_text, select_keys

    typer.echo(render_text(select_keys(section)))


@config_app.command("show", cls=_Command, epilog=_examples(
    "rpr-mt config show                                     # every default",
    "rpr-mt config show --config configs/demo.yaml --set train.max_steps=100"))
@user_errors
def config_show_command(
    config: Optional[Path] = ConfigOption,
    set_: Optional[List[str]] = SetOption,
) -> None:
    """Print a config as the commands resolve it (file, --set overrides, presets, defaults), validated, as YAML."""
    import yaml

    from rpr_mt.config import config_to_dict

    typer.echo(yaml.safe_dump(config_to_dict(_config(config, set_)), sort_keys=False), nl=False)


# -- helpers -----------------------------------------------------------------------------------------------------------


def _stderr(text: str) -> None:
    typer.echo(text, err=True)


def _device(name: str):
    from rpr_mt.device import resolve_device

    return resolve_device(name, "--device")


def _which(checkpoint: Path, which: Optional[str], resolve: bool = False) -> str:
    from rpr_mt.checkpoint_files import choose_which

    return choose_which(checkpoint, which, _stderr, resolve=resolve)


def _load_model(checkpoint: Path, which: str, device: str):
    from rpr_mt.checkpoint_files import load_for_inference

    # Say which file a run directory resolved to and what it holds: best, last and average differ.
    return load_for_inference(checkpoint, which, _device(device), report=_stderr)


def _given(**options: object) -> dict:
    """The decode options given on the command line (those not None), by their decode key."""
    return {key: value for key, value in options.items() if value is not None}


def _check_decode_options(options: dict) -> None:
    """The decoding options given on the command line, checked before a model is loaded, as far as they can be
    without it (--nbest against the beam size of the model's config waits for ``_decode_config``)."""
    from rpr_mt.config import DecodeConfig, check_decode, option_or_key

    nbest = options.get("nbest")
    if nbest is not None and nbest < 1:  # the upper bound is the model's beam size, known once its config is read
        raise UserError(f"--nbest must be >= 1 (got {nbest})")
    without_model = DecodeConfig(beam_size=max(DecodeConfig().beam_size, nbest or 1))
    check_decode(dataclasses.replace(without_model, **options), option_or_key)


def _decode_config(cfg: Config, options: dict):  # noqa: ANN202 (a DecodeConfig, imported lazily)
    """The model's decode settings with the command line's ``options`` over them, checked."""
    from rpr_mt.config import check_decode, option_or_key

    return check_decode(dataclasses.replace(cfg.decode, **options), option_or_key)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rpr-mt {rpr_mt.__version__}")
        raise typer.Exit()


@app.callback()
def _setup(
    version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    # rpr_mt's modules report progress through `logging`; the CLI shows their INFO messages as plain lines on stderr.
    # Only theirs: an INFO root logger also showed other libraries' INFO lines, e.g. torch's "FakeTensor cache stats"
    # at exit after a Ctrl-C had interrupted torch's own logging set-up.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("rpr_mt").setLevel(logging.ERROR if _echo_of_another_process() else logging.INFO)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
