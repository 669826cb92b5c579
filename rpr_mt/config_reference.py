"""The configuration reference, read from the config dataclasses themselves (``rpr_mt/config.py``).

Every config key is a dataclass field, and the comment beside it (or on the lines just above it) is its
documentation. ``config_keys`` reads those comments from the source with ``ast`` and ``tokenize`` and pairs them
with each field's type and default; ``render_markdown`` makes docs/configuration.md of them (written by
``scripts/config_reference.py --write docs/configuration.md``, checked by a test) and ``render_text`` the listing of
``rpr-mt config keys``. Importing this module imports no more than ``rpr_mt.config``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from rpr_mt.config import PRESETS, SCHEME_SETTINGS, Config, yaml_value
from rpr_mt.errors import UserError

# The page's fixed text before the tables. The resumable keys are written out here (the trainer's module, which
# holds them, imports torch); tests/test_config.py checks them against rpr_mt.train.run_dir.RESUMABLE_TRAIN_KEYS.
_INTRO = """\
One YAML file per experiment with four sections: `data`, `model`, `train`, `decode` (`configs/demo.yaml` is a small
complete example). Every key below is a field of a dataclass in `rpr_mt/config.py` (a position scheme's own section:
in `rpr_mt/model/positions/schemes.py`), with the default it has when the file leaves it out; a file may leave out any key, and `rpr-mt` commands without `--config` use every default.
`rpr-mt config keys [SECTION]` lists the same keys on the command line, and `rpr-mt config show --config FILE
[--set ...]` prints a config as the commands resolve it.

- `--set section.key=value` overrides a key after the file is read (repeatable; `--set model.t5.num_buckets=64`
  reaches a nested one). Values are YAML scalars: `null`, `true`/`false` (not `yes`/`no`), numbers (`1e-9` too),
  lists (`[0.9, 0.98]`). An entry of a mapping (`data.demo_sizes`, `data.splits`) is set on its own and the other
  entries stay, the defaults' too (`--set data.demo_sizes.train=1000` keeps dev and test); `null` removes an entry
  (`--set data.splits.test=null` prepares no test split).
- An unknown or mistyped key, a value of the wrong type and an impossible combination are one-line errors naming the
  key and the file line or `--set` that gave it (with a "did you mean" for a near miss or another toolkit's name:
  `lr` -> `train.peak_lr`).
- {presets}; keys given next to it override it (`--set model.preset=big` over a file that sets some of those keys
  warns, naming the ones the file kept).
- Settings that only some position schemes read ({scheme_settings}) get a one-line warning when set to a
  non-default value for a scheme that ignores them.
- Resuming a run (the same `rpr-mt train` command again) refuses a changed config, except these `train` keys:
  `max_steps`, `max_epochs`, `max_time`, `patience`, `log_every`, `save_every`, `validate_every`, `keep_last`,
  `num_threads`, `valid_bleu`, `valid_max_sentences`, `valid_beam_size`, `average_last`, `max_bad_updates`,
  `device`, `tensorboard`; the `decode` section; and the model settings the position scheme ignores.
- The fully resolved config is saved as `RUN/config.yaml` and inside every checkpoint.
"""

# What the page says of itself, after the introduction.
_GENERATED = ("This page is generated from the config dataclasses by `python3 scripts/config_reference.py --write "
              "docs/configuration.md`; a test fails when it is out of date.")


@dataclass(frozen=True)
class ConfigKey:
    """One config key: where it is (``section``: ``train``, ``model.t5``, ``data.splits.NAME``), its type and
    default as a config file spells them, and its field's comment."""

    section: str
    name: str
    type: str
    default: str
    meaning: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` -> its comment: the comment lines just above the field (no blank line
    between) followed by the comments on the field's own lines, joined into one line."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether the comment is the whole line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string.lstrip("#").strip(), token.line.lstrip().startswith("#"))
    classdef = ast.parse(source).body[0]
    found: dict[str, str] = {}
    for node in getattr(classdef, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        beside = [comments[n][0] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        found[node.target.id] = " ".join(part for part in above + beside if part)
    return found


def type_name(tp: Any) -> str:
    """A field's annotation as a config file's reader thinks of it: ``int | null``, ``post | pre``, ``[float,
    float]``, ``mapping: name -> int``, ``section``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "section"
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is Literal:
        return " | ".join(yaml_value(arg) for arg in args)
    if origin is tuple:
        return f"[{', '.join(type_name(arg) for arg in args)}]"
    if origin is list:
        return f"[{type_name(args[0])}, ...]"
    if origin is dict:
        return f"mapping: name -> {type_name(args[1])}"
    return {bool: "bool", int: "int", float: "float", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def _sections(cls: type, name: str) -> list[tuple[str, type]]:
    """``cls``'s section and the sections nested in it, each after its parent: ("model", ModelConfig),
    ("model.t5", T5Settings), ...; the entries of a mapping of sections are one section named NAME."""
    found = [(name, cls)]
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            found += _sections(tp, f"{name}.{field.name}")
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            found += _sections(typing.get_args(tp)[1], f"{name}.{field.name}.NAME")
    return found


def config_sections() -> list[tuple[str, type]]:
    """Every section of a config, in the order of the dataclasses: data, data.splits.NAME, model, model.t5, ..."""
    hints = typing.get_type_hints(Config)
    return [section for field in dataclasses.fields(Config) for section in _sections(hints[field.name], field.name)]


def config_keys() -> list[ConfigKey]:
    """Every config key, section by section, each section's keys in its dataclass's order. A field without a
    comment is a ``ValueError``: every field's comment is its documentation."""
    keys = []
    for section, cls in config_sections():
        comments, hints = field_comments(cls), typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            meaning = comments.get(field.name, "")
            if not meaning:
                raise ValueError(f"{cls.__name__}.{field.name} ({section}.{field.name}) has no comment")
            tp = hints[field.name]
            default = "(section)" if dataclasses.is_dataclass(tp) else yaml_value(_default(field))
            kind = type_name(tp)
            if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
                kind = f"mapping: name -> section {section}.{field.name}.NAME"
            elif dataclasses.is_dataclass(tp):
                kind = f"section {section}.{field.name}"
            keys.append(ConfigKey(section, field.name, kind, default, meaning))
    return keys


def section_help(cls: type) -> str:
    """A section's one-line description: its dataclass's docstring, or "" (a dataclass without one gets its
    generated signature as ``__doc__``, which is no description)."""
    doc = cls.__doc__ or ""
    return "" if doc.startswith(cls.__name__ + "(") else " ".join(doc.split()).replace("``", "`")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe, even in a code span, ends a table cell


def _prose(text: str) -> str:
    """Plain text as Markdown shows it: ``<TAB>`` is not an HTML tag."""
    return text.replace("<", "\\<")


def _wrap(text: str, width: int = 118) -> str:
    """Markdown paragraphs and list items (``- ``) refilled to ``width`` columns, a list item's lines indented."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            blocks.append([])
        elif line.startswith("- ") or not blocks or not blocks[-1]:
            blocks.append([line.strip()])
        else:
            blocks[-1].append(line.strip())
    filled = [textwrap.fill(" ".join(block), width, subsequent_indent="  " if block[0].startswith("- ") else "",
                            break_long_words=False, break_on_hyphens=False) if block else "" for block in blocks]
    return "\n".join(filled).strip() + "\n"


def render_markdown() -> str:
    """docs/configuration.md: the fixed introduction, then a table of each section's keys."""
    presets = "; ".join(f"`{name}` = " + ", ".join(f"{key} {yaml_value(value)}" for key, value in values.items())
                        for name, values in PRESETS.items())
    scheme = ", ".join(f"`{key}`" if key in ("clip", "use_key", "use_value", "share_across_heads", "absolute_kind")
                       else f"`{key}.*`" for key in SCHEME_SETTINGS)
    intro = _INTRO.format(
        presets=f"`model.preset: {' | '.join(PRESETS)}` sets the paper's dimensions ({presets})",
        scheme_settings=scheme)
    parts = ["# Configuration reference\n", _wrap(intro), _wrap(_GENERATED)]
    keys = config_keys()
    for section, cls in config_sections():
        parts.append(f"### `{section}`\n")
        if section_help(cls):
            parts.append(_wrap(_prose(section_help(cls))))
        rows = ["| key | default | type | meaning |", "|---|---|---|---|"]
        rows += [f"| `{key.name}` | `{_cell(key.default)}` | `{_cell(key.type)}` | {_cell(_prose(key.meaning))} |"
                 for key in keys if key.section == section]
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def select_keys(prefix: str | None = None) -> list[ConfigKey]:
    """The keys of section or key ``prefix`` (``train``, ``model.t5``, ``train.max_steps``; None: all). An unknown
    prefix is a ``UserError`` naming the sections (with the closest one)."""
    keys = config_keys()
    if not prefix:
        return keys
    prefix = prefix.strip().rstrip(".")
    sections = [section for section, _ in config_sections()]
    if prefix in sections:  # a nested section (model.t5): its keys, not its entry in the parent's table
        chosen = [key for key in keys if key.section == prefix or key.section.startswith(prefix + ".")]
    else:  # a key, or a mapping's entries (data.splits: the key and data.splits.NAME's keys)
        chosen = [key for key in keys if key.dotted == prefix or key.dotted.startswith(prefix + ".")]
    if chosen:
        return chosen
    names = sections + [key.dotted for key in keys]
    close = difflib.get_close_matches(prefix, names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"no config section or key '{prefix}'{hint}; the sections are "
                    f"{', '.join(sections)}")


def render_text(keys: list[ConfigKey]) -> str:
    """``rpr-mt config keys``: one line a key, ``section.key = default  (type)  meaning``, a blank line and the
    section's description before each section."""
    descriptions = {section: section_help(cls) for section, cls in config_sections()}
    lines: list[str] = []
    section = None
    for key in keys:
        if key.section != section:
            section = key.section
            if lines:
                lines.append("")
            lines.append(f"[{section}]" + (f"  {descriptions[section]}" if descriptions[section] else ""))
        lines.append(f"{key.dotted} = {key.default}  ({key.type})  {key.meaning}")
    return "\n".join(lines)
