"""The `rpr-mt` command line: thin commands that parse options and call importable functions.

Every command turns a ``UserError`` into one line on stderr and exit code 2 (no traceback), and Ctrl-C into
exit code 130; ``prepare``, ``train`` and ``translate`` stopped by SIGTERM or SIGHUP exit 128 + the signal's number,
as a shell reports them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import sys
import typing
from pathlib import Path, PurePath
from typing import Callable, Iterable, Iterator, List, Optional, TypeVar

from rpr_mt.host import sleep_waiting_openmp_threads

sleep_waiting_openmp_threads()  # before any command imports torch (rpr_mt/host.py says why); a user's own value wins

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

import rpr_mt  # noqa: E402
from rpr_mt.config import Config, load_config  # noqa: E402
from rpr_mt.errors import UserError  # noqa: E402
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
    import itertools

    from rpr_mt.decode.translate import count_lines, iter_lines, iter_translations

    _check_input(input, "--input")
    if buffer_lines is not None and buffer_lines < 1:
        raise UserError(f"--buffer-lines must be >= 1 (got {buffer_lines})")
    _check_output(output, "--output", inputs=[input, checkpoint])
    _check_decode_options(beam_size, length_penalty, nbest, max_tokens, min_length)
    _device(device)
    from rpr_mt.checkpoint_files import resolve_checkpoint

    which = _which(checkpoint, which)
    resolve_checkpoint(checkpoint, which)  # a wrong path or --which first: cheap, and said even with no input
    # The input is checked before the model loads (which can take a minute), and then read window by window as it
    # is translated. A file is read twice: whole first for bad bytes and its line count (the progress bar's total).
    # stdin or a pipe (-i <(zcat x.gz)) can be read once only: its first line is waited for (an empty pipe is said
    # before the model loads), and bad bytes further on stop the run when they are reached.
    # Its lines are read on a thread (ArrivingLines), so that a line typed at a terminal, or written by a program that
    # waits for its translation, is translated when it is in, not when 2,000 more have come.
    source = "stdin" if input == "-" else input
    is_file = input != "-" and Path(input).is_file()
    total = count_lines(input) if is_file else None
    lines: Iterator[str]
    if is_file:
        lines = iter_lines(input)
        first = next(lines, None)
        empty = first is None
        lines = itertools.chain([] if empty else [first], lines)
    else:
        from rpr_mt.decode.arriving import ArrivingLines

        lines = ArrivingLines(iter_lines(input))
        empty = lines.empty()
    if empty:  # a wrong file or an empty pipe: say so instead of writing nothing and exiting 0
        raise UserError(f"{source}: no lines to translate (empty input)")
    loaded = _load_model(checkpoint, which, device)
    model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
    decode = _decode_config(cfg, beam_size, length_penalty, nbest, max_tokens, min_length, split_sentences)
    if buffer_lines is not None:
        decode = dataclasses.replace(decode, buffer_lines=buffer_lines)
    from rpr_mt.config import is_pretokenized

    raw = _RawLines()  # the input lines that looked raw and were tokenized, of all lines read
    if is_pretokenized(cfg.data) and not no_tokenize:
        lines = _TokenizedAsMulti30k(lines, cfg.data.src_lang, decode.buffer_lines, raw)
    outputs = iter_translations(model, vocab, lines, decode=decode, device=_device(device),
                                progress=show_progress(progress), src_lang=cfg.data.src_lang,
                                tgt_lang=cfg.data.tgt_lang, min_length_ratio=loaded.length_ratio_floor, total=total)
    casing = vocab.casing if detokenize and recase else None
    if detokenize:  # raw text in, plain (cased) text out
        from rpr_mt.decode.pretokenize import detokenize_outputs

        outputs = detokenize_outputs(outputs, raw.plain, decode.nbest, cfg.data.tgt_lang, casing)
    from rpr_mt.train.signals import interrupt_on_stop_signals

    try:
        with interrupt_on_stop_signals():  # `timeout`, a scheduler, a closed terminal: FILE.partial kept, as on Ctrl-C
            _write_lines(output, outputs)
    except KeyboardInterrupt:  # the lines kept (in FILE.partial, or already printed) were tokenized all the same
        _note_tokenized(raw, detokenize, " read so far", recase=recase, recased=casing is not None)
        raise
    _note_tokenized(raw, detokenize, recase=recase, recased=casing is not None)


@dataclasses.dataclass
class _RawLines:
    """What ``_TokenizedAsMulti30k`` did, counted as the windows go by: the (0-based) numbers of the input lines it
    tokenized, of those whose translations are plain text (``plain_text_lines``), and how many lines it has read."""

    tokenized: set[int] = dataclasses.field(default_factory=set)
    plain: set[int] = dataclasses.field(default_factory=set)
    read: int = 0


def _note_tokenized(raw: _RawLines, detokenized: bool, so_far: str = "", recase: bool = True,
                    recased: bool = False) -> None:
    """Say how many input lines ``_TokenizedAsMulti30k`` tokenized: said at the end (or at an interrupt, of the
    lines read until then), and whether their translations were recased (``recase``: asked to; ``recased``: done)."""
    if raw.tokenized:
        if not detokenized:
            form = "their translations are in that form ("
        elif recased:
            form = ("their translations detokenized back and recased with the casing model learned from the training "
                    "data's raw text (--no-recase: lowercase; --no-detokenize: in the tokenized form; ")
        elif recase:
            form = ("their translations detokenized back, still lowercase: neither the checkpoint nor its prepared "
                    "data has a casing model (`rpr-mt prepare` with the run's config adds one to the data) "
                    "(--no-detokenize: in the tokenized form; ")
        else:
            form = "their translations detokenized back, lowercase (--no-detokenize: in the tokenized form; "
        _stderr(f"note: {len(raw.tokenized)} of {raw.read} input lines{so_far} looked like raw text; this model was "
                "trained on Multi30k's lowercased, Moses-tokenized text, so they were lowercased, normalized and "
                f"tokenized as that text was, and {form}--no-tokenize: lines as given)")


class _TokenizedAsMulti30k:
    """``lines`` with those that look raw tokenized as Multi30k's tok/ text (``tokenize_untokenized``), a window at a
    time (``take_window``, as translation takes them), so translation still reads one window before it writes; what
    it did is recorded in ``raw``. Says when its next line arrives as its input does (``more_within``), so that
    arriving input still ends translation's windows early."""

    def __init__(self, lines: Iterator[str], lang: str, window: int, raw: _RawLines) -> None:
        from rpr_mt.decode import arriving, pretokenize  # once, not per line

        self._arriving, self._tokenize = arriving, pretokenize.tokenize_untokenized
        self._plain, self._tokenized_text = pretokenize.plain_text_lines, False
        self._lines, self._lang, self._window, self._raw = lines, lang, window, raw
        self._chunk: list[str] = []

    def __iter__(self) -> "_TokenizedAsMulti30k":
        return self

    def __next__(self) -> str:
        if not self._chunk:
            chunk = self._arriving.take_window(self._lines, self._window)
            if not chunk:
                raise StopIteration
            given = chunk
            chunk, changed = self._tokenize(given, self._lang)
            self._raw.tokenized.update(self._raw.read + i for i in changed)
            plain, self._tokenized_text = self._plain(given, changed, self._tokenized_text)
            self._raw.plain.update(self._raw.read + i for i in plain)
            self._raw.read += len(chunk)
            self._chunk = chunk[::-1]
        return self._chunk.pop()

    def arrives_within(self, seconds: Optional[float]) -> bool:
        return bool(self._chunk) or self._arriving.more_within(self._lines, seconds)


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
    BLEU (lowercased, punctuation-normalized, Moses-tokenized text)."""
    from rpr_mt.decode.translate import read_lines, translate_lines
    from rpr_mt.config import is_pretokenized
    from rpr_mt.evaluate import format_scores, language_from_path, recased_scores, score
    from rpr_mt.languages import ISO_639_1

    if lang is not None and lang not in ISO_639_1:  # the tokenized BLEU's Moses rules fall back silently on unknown codes
        raise UserError(f"--lang must be a two-letter ISO 639-1 language code such as en, de or fr (got {lang!r})")
    # Path problems first (exists, is a file, readable), naming conventions after: a --ref that is a directory is
    # not a question of its suffix.
    if hyp is not None and ref is not None and str(hyp) == str(ref) == "-":  # the second read found stdin empty
        raise UserError("--hyp and --ref cannot both be stdin (-): give at least one of them as a file")
    for path, option in ((hyp, "--hyp"), (ref, "--ref")):
        if path is not None:
            _check_input(str(path), option)
    if checkpoint is not None:
        if hyp is not None:
            raise UserError("--hyp goes with --ref, not with --checkpoint (which translates --split and scores its own "
                            "translations; --ref with it replaces the split's reference)")
        if save_hyp is not None:
            _check_output(str(save_hyp), "--save-hyp")
        _check_decode_options(beam_size, length_penalty, None, None, min_length)  # before the model loads
        _device(device)
        from rpr_mt.checkpoint_files import peek_checkpoint, resolve_checkpoint

        which = _which(checkpoint, which)
        resolved = resolve_checkpoint(checkpoint, which)
        # The split and --save-hyp are checked before the weights load, from the checkpoint's config and vocabulary
        # fingerprint read without its tensors (where torch can map the file; else after loading, below).
        peeked = peek_checkpoint(resolved)
        if peeked is not None:
            src_path, ref = _split_paths(peeked[0], peeked[1], checkpoint, split, ref, save_hyp)
        loaded = _load_model(checkpoint, which, device)
        model, cfg, vocab = loaded.model, loaded.config, loaded.vocab
        pretokenized = is_pretokenized(cfg.data)
        if peeked is None:
            src_path, ref = _split_paths(cfg, vocab.fingerprint, checkpoint, split, ref, save_hyp)
        _note_other_lang(lang, cfg.data.tgt_lang, "the target language of the checkpoint's data")
        lang = lang or cfg.data.tgt_lang
        decode = _decode_config(cfg, beam_size, length_penalty, 1, None, min_length, split_sentences)
        _stderr(f"translating {src_path}, scoring against {ref}")  # which copy of the data, when there are several
        hypotheses = list(
            translate_lines(model, vocab, read_lines(str(src_path)), decode=decode, device=_device(device),
                            progress=show_progress(progress), src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang,
                            min_length_ratio=loaded.length_ratio_floor)
        )
        if save_hyp is not None:
            _write_lines(str(save_hyp), hypotheses)
        hyp_name = f"translations of {src_path}"
    else:
        if hyp is None or ref is None:
            raise UserError("give --hyp and --ref, or --checkpoint (and --split)")
        # options that only change how a checkpoint translates: given with --hyp/--ref they would do nothing
        unused = [name for name, value, default in (
            ("--split", split, "test"), ("--which", which, None), ("--beam-size", beam_size, None),
            ("--length-penalty", length_penalty, None), ("--min-length", min_length, None),
            ("--device", device, "auto")) if value != default]
        if unused:
            raise UserError(f"{unused[0]} goes with --checkpoint (it changes what that model translates or how); "
                            "--hyp is scored as it is")
        if save_hyp is not None:  # nothing is translated, so nothing would be saved
            raise UserError("--save-hyp goes with --checkpoint (it saves that model's translations)")
        if split_sentences is not None:  # nothing is translated, so nothing would be split
            flag = "--split-sentences" if split_sentences else "--no-split"
            raise UserError(f"{flag} goes with --checkpoint (it changes how that model translates)")
        # The Moses tokenizer of the paper's BLEU differs by language, so a guess would silently change the score.
        _note_other_lang(lang, language_from_path(ref), f"the language its name gives {ref.name}")
        lang = lang or language_from_path(ref)
        if lang is None and not pretokenized:  # pretokenized text is not tokenized again: no language needed
            raise UserError(f"cannot tell the target language from the name {ref.name} (its suffix is not a language "
                            "code, as in test.de or test.de.gz); pass --lang, e.g. --lang de")
        hypotheses = read_lines(str(hyp))
        hyp_name = str(hyp)
    references = read_lines(str(ref))
    if checkpoint is None and pretokenized:
        # scored as it is, raw text met tokenized text: a literature BLEU of 36 where the right one was 62, silently
        for path, lines in ((hyp, hypotheses), (ref, references)):
            _refuse_raw_as_pretokenized(path, lines)
    from rpr_mt.evaluate import reads_as_raw

    if checkpoint is not None and pretokenized:
        # a raw --ref, e.g. Multi30k's test.de.gz, judged on all its lines: a tokenized reference has a few lines that
        # look raw (the tok/ dev reference has 3, such as "ca. 120 cm"), and tokenizing it again would change it
        if reads_as_raw(references):
            # scored as it is, it met the model's tokenized text: literature BLEU 0 instead of the model's score
            pretokenized = False
            _stderr(f"note: {ref} is raw text and this model translates into Multi30k's tokenized text: the "
                    "literature BLEU tokenizes the reference as the dataset's script does (prep:lc.norm.tok); "
                    "sacreBLEU and chrF compare the tokenized translations with the raw reference")
    scores = score(hypotheses, references, lang=lang or "", pretokenized=pretokenized, hyp_name=hyp_name,
                   ref_name=str(ref))
    if checkpoint is not None and is_pretokenized(cfg.data) and vocab.casing is not None and reads_as_raw(references):
        scores.update(recased_scores(hypotheses, references, lang or "", vocab.casing))  # the comparable sacreBLEU
    from rpr_mt.evaluate import reads_as_tokenized

    if checkpoint is None and not pretokenized and reads_as_tokenized(hypotheses) and reads_as_tokenized(references):
        # (sacreBLEU said so in three lines, advising to detokenize: the literature scores this text as it is)
        _stderr(f"note: {hyp} and {ref} both look like Multi30k's lowercased, Moses-tokenized text: the Multi30k lit. "
                "BLEU scores them as they are; the tokenized BLEU tokenizes them again (--pretokenized: as they are)")
    if checkpoint is None and not pretokenized:  # once scored: no warning before a one-line error
        # a tok model's translations (translate writes them tokenized) against raw references: sacreBLEU, chrF and
        # the tokenized BLEU compare lowercased, tokenized text with cased, raw text, and look like a failed model
        if reads_as_raw(references) and reads_as_tokenized(hypotheses):
            _stderr(f"warning: {hyp} looks like Multi30k's lowercased, Moses-tokenized text and {ref} like raw text: "
                    "sacreBLEU, chrF and the tokenized BLEU compare the two forms; the Multi30k lit. BLEU tokenizes "
                    "the references and is the comparable number (or score against the tok/ reference with "
                    "--pretokenized)")
        elif reads_as_tokenized(references) and reads_as_raw(hypotheses):
            # the other way round: raw (e.g. detokenized) translations against Multi30k's tok/ reference
            _stderr(f"warning: {ref} looks like Multi30k's lowercased, Moses-tokenized text and {hyp} like raw text: "
                    "sacreBLEU, chrF and the tokenized BLEU compare the two forms; the Multi30k lit. BLEU tokenizes "
                    "the hypotheses and is the comparable number")
        elif _all_lowercase(hypotheses) and sum(1 for line in references if line != line.lower()) > len(references) / 2:
            # a tok model's translations of raw text, detokenized by translate: plain text, but lowercase
            _stderr(f"warning: {hyp} is all lowercase and {ref} is cased: sacreBLEU, chrF and the tokenized BLEU are "
                    "case-sensitive and count a word that differs only in case as wrong; the Multi30k lit. BLEU lowercases both and "
                    "is the comparable number")
    typer.echo(format_scores(scores, as_json=as_json))


def _refuse_raw_as_pretokenized(path: Path, lines: List[str]) -> None:
    """--pretokenized says both files are Multi30k's tokenized text: refuse one that reads as raw (``reads_as_raw``:
    a few lines of the tok/ files look raw, e.g. an abbreviation's full stop: ``ca. 120 cm``), naming its first such
    line."""
    from rpr_mt.evaluate import reads_as_raw, raw_looking_lines

    if reads_as_raw(lines):
        raw = raw_looking_lines(lines)
        raise UserError(f"{path}: --pretokenized, but {len(raw)} of {len(lines)} lines look like raw text (line "
                        f"{raw[0]}: a capital letter, a bare quote or punctuation attached to a word); without "
                        "--pretokenized the literature's BLEU tokenizes it as Multi30k's script does")


def _all_lowercase(lines: List[str]) -> bool:
    """Some line of ``lines`` has a letter, and none a capital."""
    return any(any(c.isalpha() for c in line) for line in lines) and all(line == line.lower() for line in lines)


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

    if last < 1:
        raise UserError("--last must be >= 1")
    # What the inputs are decides what else is needed (--output for files), so a missing input is said first.
    for path in inputs:
        if not path.exists():
            raise UserError(f"{path} does not exist (give a run directory or checkpoint files)")
    if len(inputs) > 1 and any(path.is_dir() for path in inputs):
        directory = next(path for path in inputs if path.is_dir())
        raise UserError(f"{directory} is a directory: give one run directory, or checkpoint files")
    if len(inputs) == 1 and inputs[0].is_dir():
        folder = ckpt.checkpoint_folder(inputs[0])  # RUN/checkpoints, or a folder of checkpoint files
        paths = ckpt.numbered_checkpoints_in(folder)[-last:]
        if not paths:
            raise UserError(f"no numbered checkpoints in {folder}")
        if len(paths) < last:
            typer.echo(f"warning: --last {last}, but {inputs[0]} has only {len(paths)} numbered checkpoint(s) "
                       f"(a run keeps the last train.keep_last of those it writes every train.save_every updates); "
                       f"averaging {len(paths)}", err=True)
        output = output or folder / "checkpoint_avg.pt"
    else:
        paths = list(inputs)
        if output is None:
            raise UserError("--output is required when averaging listed checkpoint files")
    if ckpt.STEP_PATTERN.search(output.name):  # resume and pruning would take it for a training checkpoint
        raise UserError(f"--output {output}: a numbered name (checkpoint_NNNNNNNN.pt) is reserved for training "
                        "checkpoints; choose another name, e.g. checkpoint_avg.pt")
    if output.name == "checkpoint_best.pt":  # training writes it, and --which best would load the average
        raise UserError(f"--output {output}: checkpoint_best.pt is reserved for the training's best checkpoint; "
                        "choose another name, e.g. checkpoint_avg.pt")
    _check_output(str(output), "--output", inputs=paths, text=False)
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
        _check_output(str(output), "--output", text=False)
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


def _prepare_command(checkpoint: Path) -> str:
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


def _split_paths(cfg: Config, vocab_sha256: str, checkpoint: Path, split: str, ref: Optional[Path],
                 save_hyp: Optional[Path]) -> tuple[Path, Path]:
    """eval-bleu --checkpoint: the prepared source of ``split`` and its reference (``ref`` if given), checked, and
    --save-hyp checked against both. The data is the run's own, prepared with the model's vocabulary, from any
    directory (``prepared_data_of``)."""
    from rpr_mt.checkpoint_files import prepared_data_of

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
                            f"({_prepare_command(checkpoint)})")
        if with_text or listed:  # the data is there, the split is not: a prepare would not help
            raise UserError(f"--split {split}: {data_dir} has no such split (it has {', '.join(with_text or listed)}); "
                            "score a file of your own with --hyp/--ref")
        raise UserError(f"{src_path} not found: prepare the data first ({_prepare_command(checkpoint)}) or pass "
                        "--hyp/--ref")
    if ref is None:
        ref = default_ref
        _check_input(str(ref), "--ref (the split's reference)")
    if save_hyp is not None:  # the translations would replace the text they are translated from or scored on
        _check_output(str(save_hyp), "--save-hyp", inputs=[src_path, ref])
    from rpr_mt.decode.translate import count_lines

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


def _stderr(text: str) -> None:
    typer.echo(text, err=True)


def _note_other_lang(given: Optional[str], known: Optional[str], what: str) -> None:
    """One line when --lang overrides a language the input already names: the tokenizer's rules then change the
    score, which the user should see was asked for."""
    if given is not None and known is not None and given != known:
        _stderr(f"note: --lang {given} overrides {what} ({known}): the hypotheses and references are tokenized "
                f"by {given}'s rules")


def _device(name: str):
    from rpr_mt.device import resolve_device

    return resolve_device(name, "--device")


def _which(checkpoint: Path, which: Optional[str]) -> str:
    """The --which to use (best when not given), with a word on stderr where the choice may surprise: a value given
    with a checkpoint file, where it is not used; best asked of a run directory without one (its newest numbered
    checkpoint is loaded); or a run directory's best checkpoint loaded by default while the run also has an averaged
    one that is not older (train.average_last writes it at the end of training, and the run's scores in result.json
    and the docs are of that average)."""
    from rpr_mt import checkpoint_files as ckpt

    path = Path(checkpoint)
    if which is not None and path.is_file():
        _stderr(f"warning: --which {which} chooses within a run directory; {checkpoint} is a checkpoint file and is "
                "used as it is")
    if which in (None, "best") and path.is_dir():
        folder = ckpt.checkpoint_folder(path)
        best, average = folder / "checkpoint_best.pt", folder / "checkpoint_avg.pt"
        if not best.is_file() and ckpt.numbered_checkpoints_in(folder):  # resolve_checkpoint's fallback, said
            _stderr(f"note: {folder} has no checkpoint_best.pt (no validation has saved one yet); loading its newest "
                    "numbered checkpoint, as --which last")
        elif which is None and best.is_file() and average.is_file() \
                and average.stat().st_mtime >= best.stat().st_mtime:
            _stderr(f"note: {checkpoint} has an averaged checkpoint newer than its best one; loading the best one "
                    "(the default), --which average loads the average")
    return which or "best"


def _load_model(checkpoint: Path, which: str, device: str):
    from rpr_mt.checkpoint_files import load_for_inference

    # Say which file a run directory resolved to and what it holds: best, last and average differ.
    return load_for_inference(checkpoint, which, _device(device), report=_stderr)


def _check_decode_options(beam_size, length_penalty, nbest, max_tokens, min_length) -> None:
    """The decoding options given on the command line, checked before a model is loaded, as far as they can be
    without it (--nbest against the beam size of the model's config waits for ``_decode_config``)."""
    from rpr_mt.config import DecodeConfig

    if nbest is not None and nbest < 1:  # the upper bound is the model's beam size, known once its config is read
        raise UserError(f"--nbest must be >= 1 (got {nbest})")
    defaults = DecodeConfig()
    _decode_config(Config(decode=DecodeConfig(beam_size=max(defaults.beam_size, nbest or 1))), beam_size,
                   length_penalty, nbest, max_tokens, min_length)


def _decode_config(cfg: Config, beam_size, length_penalty, nbest, max_tokens, min_length=None, split_sentences=None):
    import dataclasses

    options = dict(beam_size=beam_size, length_penalty=length_penalty, nbest=nbest, max_tokens=max_tokens,
                   min_length=min_length, split_sentences=split_sentences)
    changes = {k: v for k, v in options.items() if v is not None}
    decode = dataclasses.replace(cfg.decode, **changes)
    if decode.beam_size < 1:
        raise UserError(f"--beam-size must be >= 1 (got {decode.beam_size})")
    if not math.isfinite(decode.length_penalty) or decode.length_penalty < 0:
        raise UserError(f"--length-penalty must be a finite number >= 0 (got {decode.length_penalty})")
    if decode.nbest < 1 or decode.nbest > decode.beam_size:
        raise UserError(f"--nbest must be between 1 and the beam size {decode.beam_size} (got {decode.nbest})")
    if decode.max_tokens < 1:
        raise UserError("--max-tokens must be >= 1")
    if decode.min_length < 0:
        raise UserError(f"--min-length must be >= 0 (got {decode.min_length})")
    return decode


def _check_input(path: str, option: str) -> None:
    """Before any work, in this order: an input file must exist, not be a directory (a pipe such as ``-i <(zcat
    x.gz)`` is fine) and be readable (``-`` is stdin). The message names the option and the path, so a wrong path
    is not reported as something else (a language the name does not tell, after a model took a minute to load)."""
    if path == "-":
        return
    if not path:  # Path("") is ".", which would be reported as a directory
        raise UserError(f"{option}: an empty path; give a file name (or - for stdin)")
    target = Path(path)
    if not target.exists():
        raise UserError(f"{option} {path}: file not found")
    if target.is_dir():
        raise UserError(f"{option} {path} is a directory; give a text file")
    if not os.access(target, os.R_OK):
        raise UserError(f"{option} {path}: not readable (permission denied)")


def _check_output(path: str, option: str, inputs=(), text: bool = True) -> None:
    """Before any work: an output file's directory must exist and be writable, and the path must not be a directory
    (a failed write after decoding would lose the translations). Nor may the output replace one of the command's
    ``inputs`` or, for a ``text`` output, a checkpoint (``*.pt``): a typo must not destroy the source text, the
    references or a model. A symlink is checked as the file it points to, and a device or FIFO (``/dev/null``, a
    named pipe) only for being writable itself: ``_write_lines`` writes through them, nothing beside them."""
    if not path:  # Path("") is ".", a directory: the message would name neither the option's value nor its problem
        raise UserError(f"{option}: an empty path; give a file name (or - for stdout)")
    if path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{option} {path} is a directory; give a file name")
    if _written_through(target):
        if not os.access(target, os.W_OK):
            raise UserError(f"{option} {path}: not writable")
        return
    target = _link_target(target)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"{option} {path}: not writable")
    if target.is_file():
        if any(str(source) != "-" and Path(source).is_file() and target.samefile(source) for source in inputs):
            raise UserError(f"{option} {path} is also an input of this command; writing it would destroy that "
                            "input: give another file name")
        if text and target.suffix == ".pt":
            raise UserError(f"{option} {path} is a checkpoint; text is never written over one: give another file name")
        record = _record_of_a_run_or_data(target)  # (nor a checkpoint over one: average-checkpoints -o metrics.jsonl)
        if record:
            raise UserError(f"{option} {path} is {record}; it is never written over: give another file name")


# What a run directory (one with checkpoints/) keeps of its run: the trainer's config and learning curves, the sweep's
# result and invocations. Translations written over metrics.jsonl took the run's curves (plot: "no records yet").
RUN_RECORDS = ("config.yaml", "metrics.jsonl", "invocations.jsonl", "result.json")


def _record_of_a_run_or_data(target: Path) -> str:
    """What the existing file ``target`` is, if it is a run's record or a file that prepare wrote; else ""."""
    from rpr_mt.data.prepare import written_by_prepare

    folder = target.parent
    if target.name in RUN_RECORDS and (folder / "checkpoints").is_dir():
        return f"the {target.name} of the run in {folder}"
    if written_by_prepare(target):
        return f"a file of the prepared data in {folder}"
    return ""


def _written_through(target: Path) -> bool:
    """Whether an output is written in place rather than through a temporary renamed over it: an existing target
    (links followed) that is not a regular file, such as a device (/dev/null), a FIFO or a socket, which a rename
    would replace by a regular file; and the paths of streams already open, /dev/stdout, /dev/fd/N and
    /proc/self/fd/N, which may lead to a regular file that a rename would take away from that stream."""
    absolute = os.path.abspath(target)
    if absolute.startswith(("/dev/std", "/dev/fd/", "/proc/")):
        return True
    return target.exists() and not target.is_file() and not target.is_dir()


def _link_target(target: Path) -> Path:
    """The file a symlink leads to (through every link; it may not exist yet), else ``target``: the file that is
    written, with its temporary beside it, while the link stays."""
    return target.resolve() if target.is_symlink() else target


def _text_writer(raw: typing.BinaryIO, target: Path) -> typing.TextIO:
    """UTF-8 text into ``raw``, gzip-compressed when ``target`` is named .gz. gzip's header keeps a file name (what
    ``gunzip -N`` restores): the target's, not the name of the temporary file that ``raw`` writes."""
    import gzip
    import io

    if target.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(filename=target.name, mode="wb", fileobj=raw), encoding="utf-8")
    return io.TextIOWrapper(raw, encoding="utf-8")  # type: ignore[arg-type]


def _write_lines(path: str, lines: Iterable[str]) -> None:
    """Write ``lines`` as they come (a generator's translations, window by window): to stdout, flushed as they come;
    to a file through a temporary beside it, moved into place when complete, so an existing file is never left
    half-written. If the lines stop with an error or an interrupt, those written so far are kept in
    ``PATH.partial`` (said on stderr) and the error goes on; once ``PATH`` is complete, a ``PATH.partial`` left by an
    earlier interrupted run is removed (said on stderr). A symlink is followed (the file it points to is written,
    the link stays); a device, FIFO or open stream (``_written_through``) is written in place, flushed as stdout is.
    """
    import gzip

    # a .gz name is gzip, as it is for the inputs (read_lines)
    opener = gzip.open if path.endswith(".gz") else open
    if path == "-" or _written_through(Path(path)):
        # appending, not truncating: /dev/stdout led to a file the shell opened (`>> log` must stay appended to)
        handle = sys.stdout if path == "-" else opener(path, "at", encoding="utf-8")
        try:
            for line in lines:
                handle.write(line + "\n")
                if opener is open:  # a pipe is block-buffered: a reader sees each window when it is done
                    handle.flush()
        finally:
            if handle is not sys.stdout:
                handle.close()
        return

    target = _link_target(Path(path))
    tmp = target.with_name(f".{target.name}.tmp")
    written = 0
    try:
        with open(tmp, "wb") as raw, _text_writer(raw, target) as handle:
            for line in lines:
                handle.write(line + "\n")
                written += 1
    except BaseException:
        if written:
            partial = target.with_name(f"{target.name}.partial")
            tmp.replace(partial)
            _stderr(f"stopped: the {written:,} output lines written so far are in {partial}")
        else:
            tmp.unlink(missing_ok=True)
        raise
    tmp.replace(target)
    # the complete file supersedes an earlier run's finished lines: left beside it, they look like this run's
    stale = target.with_name(f"{target.name}.partial")
    if stale.is_file():
        stale.unlink()
        _stderr(f"note: removed {stale}, left by an earlier interrupted run; {target} is complete")


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
