"""Typed experiment configuration: one YAML file, four sections, validated on load.

    data:   where the parallel text comes from and how it is cleaned and tokenized   (``DataConfig``)
    model:  the Transformer and its position representation                          (``ModelConfig``)
    train:  optimisation, batching, checkpoints, validation                          (``TrainConfig``)
    decode: beam search and length penalty                                            (``DecodeConfig``)

Every key is a dataclass field with a comment; unknown keys are rejected with a "did you mean" suggestion, values
are type-checked, and ``validate()`` rejects impossible combinations. ``--set section.key=value`` overrides are
parsed as YAML scalars and go through the same checks. The fully resolved config is saved beside checkpoints.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import yaml

from rpr_mt.errors import UserError
from rpr_mt.faults import fault_point
from rpr_mt.languages import ISO_639_1
from rpr_mt.model.positions.schemes import SCHEMES, RotarySettings, SchemeName, T5Settings, XLSettings

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class SplitFiles:
    """One split of local parallel text: two aligned files (plain or .gz), or one TSV file (src<TAB>tgt)."""

    src: Optional[str] = None  # source-language file, one sentence a line
    tgt: Optional[str] = None  # target-language file, line N translates line N of src
    # alternative to src/tgt: one "source<TAB>target" pair a line (a blank line is an empty pair, as in two files)
    tsv: Optional[str] = None


# datasets' builders for local files that data.hub.path may name: their data.hub.data_files are local paths
HUB_LOCAL_BUILDERS = ("parquet", "json", "arrow", "csv")


@dataclass
class HubSettings:
    """data.source = hub: any Hugging Face dataset, streamed with ``datasets.load_dataset(..., streaming=True)``, or
    local files read by one of its builders (parquet, json, arrow, csv)."""

    path: Optional[str] = None  # a dataset on the hub (wmt/wmt16), or a builder for local files: parquet/json/arrow/csv
    name: Optional[str] = None  # the dataset's config (wmt/wmt16: ro-en, de-en, ...); null: its default one
    # the files, as load_dataset takes them: a path or glob, a list of them, or {its split: files}; for the local
    # builders they are local paths (relative to the current directory; a string or list is its split "train"),
    # for a hub dataset patterns inside its repository (null: all its files)
    data_files: Optional[Union[str, list[str], dict[str, Union[str, list[str]]]]] = None
    # which of the dataset's splits are ours: {our split: its split}; train is required, dev is validation's
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    revision: Optional[str] = None  # hub datasets: the commit (or tag) to read; null: the current one, recorded
    # the source text's column, with tgt_column (null, both: the WMT/OPUS schema, one column "translation" of
    # {language code: text} holding data.src_lang and data.tgt_lang)
    src_column: Optional[str] = None
    tgt_column: Optional[str] = None  # the target text's column, with src_column


@dataclass
class DataConfig:
    """Where the parallel text comes from, and how ``prepare`` cleans it and trains its SentencePiece vocabulary."""

    source: Literal["demo", "files", "multi30k", "wmt14", "hub"] = "demo"  # where raw parallel text comes from
    src_lang: str = "en"  # source language code
    tgt_lang: str = "de"  # target language code
    output_dir: str = "data/demo"  # prepared data (SentencePiece model, id arrays, manifest) goes here
    splits: dict[str, SplitFiles] = field(default_factory=dict)  # source=files: train/dev/test files
    # source=multi30k: a local copy, {train,val,test_2016_flickr}.{lang}.gz with tok/ beside them, or the dataset's
    # own data/task1/ layout; unset: $RPR_MT_MULTI30K_DIR, else the files are downloaded (pinned commit, SHA-256
    # checked) into $XDG_CACHE_HOME/rpr-mt/multi30k (~/.cache/rpr-mt/multi30k); $RPR_MT_MULTI30K_URL names a mirror
    multi30k_dir: Optional[str] = None
    # source=multi30k: raw (cased, untokenized) or tok: the dataset's own lowercased, punctuation-normalized,
    # Moses-tokenized files (tok/, or data/task1/tok/), which the Multi30k literature trains and scores on
    multi30k_text: Literal["raw", "tok"] = "raw"
    demo_sizes: dict[str, int] = field(  # source=demo: pairs generated per split
        default_factory=lambda: {"train": 20000, "dev": 500, "test": 500}
    )
    demo_seed: int = 1234  # source=demo: generator seed (the corpus is a pure function of it)
    max_train_pairs: Optional[int] = None  # keep only the first N training pairs (quick experiments)
    # train only on pairs of at most this many pieces a side (without eos); dev/test and the prepared data keep all
    # (length extrapolation: the study tests on inputs longer than any seen in training)
    max_train_tokens: Optional[int] = None
    max_words: int = 250  # cleaning: drop training pairs with more whitespace words than this on either side
    max_length_ratio: float = 3.0  # cleaning: drop training pairs whose word-count ratio exceeds this
    dedup: bool = False  # cleaning: drop exact duplicate training pairs
    vocab_size: int = 8000  # joint SentencePiece vocabulary (paper WMT: 32768)
    spm_model_type: Literal["bpe", "unigram"] = "bpe"  # SentencePiece algorithm
    spm_character_coverage: float = 1.0  # SentencePiece character coverage
    spm_sample_sentences: int = 2_000_000  # SentencePiece trains on at most this many random sentences
    hub: HubSettings = field(default_factory=HubSettings)  # source=hub: the dataset, its splits and columns


@dataclass
class ModelConfig:
    """The encoder-decoder Transformer and its position representation."""

    preset: Optional[Literal["base", "big"]] = None  # paper dimensions; explicit keys below override the preset
    d_model: int = 512  # model width
    n_heads: int = 8  # attention heads (d_model must be divisible by it)
    encoder_layers: int = 6  # encoder depth
    decoder_layers: int = 6  # decoder depth
    ff_dim: int = 1024  # feed-forward inner width (paper base: 1024)
    dropout: float = 0.1  # residual and embedding dropout
    attention_dropout: float = 0.0  # dropout on attention probabilities
    activation_dropout: float = 0.0  # dropout inside the feed-forward block
    norm: Literal["post", "pre"] = "post"  # layer-norm placement; the paper is post-norm
    # position scheme (rpr_mt/model/positions): none | absolute | relative (Shaw) | absolute+relative | t5 | xl |
    # rope | alibi
    positions: SchemeName = "relative"
    absolute_kind: Literal["sinusoidal", "learned"] = "sinusoidal"  # for positions=absolute(+relative)
    max_positions: int = 1024  # longest sequence the model accepts (learned table size; truncation limit)
    clip: int = 16  # relative: clipping distance k (2k+1 relative vectors); 0 = one vector, no order
    use_key: bool = True  # relative: aK term in the attention logits
    use_value: bool = True  # relative: aV term in the attention output
    share_across_heads: bool = False  # relative: one table for all heads (paper big) or one per head (paper base)
    t5: T5Settings = field(default_factory=T5Settings)  # positions=t5
    xl: XLSettings = field(default_factory=XLSettings)  # positions=xl
    rope: RotarySettings = field(default_factory=RotarySettings)  # positions=rope


# The model settings that only some position schemes read (``Scheme.reads``), each with the schemes that read it, in
# ModelConfig's order; every other model setting matters to every scheme. Load warns about the others when they are
# given, and a resumed run ignores their changes (rpr_mt.train.run_dir).
SCHEME_SETTINGS: dict[str, tuple[str, ...]] = {
    key: readers for key in (f.name for f in dataclasses.fields(ModelConfig))
    if (readers := tuple(name for name, scheme in SCHEMES.items() if key in scheme.reads))
}


def unused_model_settings(positions: str) -> list[str]:
    """The ``ModelConfig`` fields (a nested section by its name: ``t5``) that position scheme ``positions`` ignores."""
    return [key for key, schemes in SCHEME_SETTINGS.items() if positions not in schemes]


def model_settings_read(model: dict[str, Any]) -> dict[str, Any]:
    """A saved model section without the settings its position scheme ignores: two that agree here are one model."""
    unused = unused_model_settings(model.get("positions", ModelConfig.positions))
    return {key: value for key, value in model.items() if key not in unused}


@dataclass
class TrainConfig:
    """Optimisation, batching, checkpoints, validation and the stopping rules of ``train``."""

    run_dir: str = "runs/demo"  # checkpoints, metrics.jsonl and the resolved config go here
    seed: int = 1  # seeds parameters, dropout and batch order
    max_tokens: int = 4096  # per batch: source tokens <= max_tokens and target tokens <= max_tokens
    update_freq: int = 1  # gradient accumulation: batches per update
    max_steps: Optional[int] = 100000  # stop after this many updates
    max_epochs: Optional[int] = None  # stop after this many epochs
    # stop after this many seconds of wall clock, counted from the start of `rpr-mt train` (data preparation and
    # validation included) and summed over a resumed run's invocations
    max_time: Optional[float] = None
    lr_schedule: Literal["noam", "inverse_sqrt", "budget", "cosine"] = "noam"  # learning-rate schedule
    lr_scale: float = 1.0  # noam: lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    peak_lr: float = 7e-4  # inverse_sqrt, budget, cosine: the learning rate at the end of warm-up
    warmup_steps: int = 4000  # noam, inverse_sqrt: warm-up updates (budget and cosine use warmup_fraction)
    warmup_fraction: float = 0.1  # budget / cosine: share of max_time / max_steps spent warming up
    final_lr_fraction: float = 0.0  # budget / cosine: lr at the end as a fraction of peak_lr
    adam_betas: tuple[float, float] = (0.9, 0.98)  # Adam beta1, beta2
    adam_eps: float = 1e-9  # Adam epsilon
    weight_decay: float = 0.0  # decoupled weight decay (AdamW) on weight matrices, not biases/norms/positions; paper: 0
    label_smoothing: float = 0.1  # label-smoothed cross entropy
    clip_norm: float = 0.0  # gradient-norm clipping; 0 = off
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype; fp16 only on CUDA (with GradScaler)
    device: str = "auto"  # auto (cuda when available), cpu, cuda or cuda:N (one process; torchrun: LOCAL_RANK's GPU)
    num_threads: Optional[int] = None  # torch intra-op threads on CPU; null = torch's default
    log_every: int = 50  # updates between progress lines / metrics records
    save_every: int = 1000  # updates between checkpoints
    keep_last: int = 5  # checkpoints kept besides the best one
    validate_every: int = 1000  # updates between validations (dev loss and, if valid_bleu, dev BLEU)
    # decode the dev set at validation and report its BLEU: sacreBLEU, or on data.multi30k_text: tok the Multi30k
    # literature's BLEU of the text as it is (rpr_mt.train.validation.dev_bleu)
    valid_bleu: bool = True
    valid_max_sentences: Optional[int] = 500  # decode only the first N dev sentences (null = all)
    valid_beam_size: int = 1  # beam for validation BLEU (1 = greedy: fast; final scores use decode.beam_size)
    # stop after this many validations without a better dev BLEU (or the same BLEU at a lower dev NLL; the dev NLL
    # alone when valid_bleu is off)
    patience: Optional[int] = None
    max_bad_updates: int = 5  # NaN/inf losses in a row before the run stops
    average_last: int = 0  # at the end, average the last N checkpoints into checkpoint_avg.pt (0 = off; <= keep_last)
    tensorboard: bool = True  # also write the metrics as TensorBoard scalars into run_dir/tensorboard
    init_from: Optional[str] = None  # fine-tune: start a new run from this checkpoint (file or run dir: its best)
    reset_optimizer: bool = True  # with init_from: fresh Adam moments (false: also load the checkpoint's optimizer)


@dataclass
class DecodeConfig:
    """Beam search, length penalty and batching of ``translate`` and ``eval-bleu --checkpoint``."""

    beam_size: int = 4  # 1 = greedy
    length_penalty: float = 0.6  # GNMT alpha: score / ((5 + |Y|) / 6)^alpha
    max_len_a: float = 1.5  # maximum output length = a * source length + b
    max_len_b: int = 10  # (b of max_len_a's formula, in tokens)
    # eos is not allowed before this many output tokens (fairseq's and CTranslate2's default 1): 0 lets beam search
    # return an empty translation, which it finds for a few percent of sources with some small models
    min_length: int = 1
    max_tokens: int = 4096  # source tokens per decoding batch
    nbest: int = 1  # hypotheses printed per input line
    split_sentences: bool = True  # translate each line's sentences one by one and join them (rpr_mt.text.segment)
    buffer_lines: int = 2000  # input lines read, decoded (sorted, batched), written at a time; fairseq's --buffer-size


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> "Config":
        """Reject impossible combinations with a message naming the key."""
        d, m, t, dec = self.data, self.model, self.train, self.decode
        # First: NaN fails every comparison below, whose messages ("must be positive") would not say what is wrong
        for section in (d, m, t, dec):
            for f in dataclasses.fields(section):
                value = getattr(section, f.name)
                values = value if isinstance(value, tuple) else (value,)
                if not all(not isinstance(v, float) or math.isfinite(v) for v in values):  # (nested sections: no)
                    raise UserError(f"{_SECTION_NAMES[type(section)]}.{f.name} must be a finite number "
                                    f"(got {yaml_value(value)})")
        for key in ("src_lang", "tgt_lang"):  # the BLEU tokenizer's language: a typo must not change the score silently
            _require(getattr(d, key) in ISO_639_1, f"data.{key} must be a two-letter ISO 639-1 language code such as "
                     f"en, de or fr (got {yaml_value(getattr(d, key))})")
        validate_data(d)
        _require(d.vocab_size >= 16, "data.vocab_size must be at least 16")
        _require(d.max_words > 0, "data.max_words must be positive")
        _require(d.max_train_tokens is None or d.max_train_tokens > 0, "data.max_train_tokens must be positive")
        _require(d.max_length_ratio >= 1.0, "data.max_length_ratio must be >= 1")
        _require(d.spm_sample_sentences > 0, "data.spm_sample_sentences must be positive")
        _require(0.0 < d.spm_character_coverage <= 1.0, "data.spm_character_coverage must be in (0, 1]")
        if d.source == "files":
            if "train" not in d.splits:  # a misspelt one first: the error then names its line, not the section's
                close = difflib.get_close_matches("train", list(d.splits), n=1, cutoff=0.6)
                raise UserError((f"data.splits.{close[0]}: did you mean 'train'? " if close else "")
                                + "data.splits must name a 'train' split when data.source is 'files'")
            for name, split in d.splits.items():
                if split.tsv is not None:
                    _require(split.src is None and split.tgt is None,
                             f"data.splits.{name} takes either 'src'/'tgt' or 'tsv', not both")
                else:
                    _require(split.src is not None and split.tgt is not None,
                             f"data.splits.{name} needs both 'src' and 'tgt' (or one 'tsv')")
        for name, n in d.demo_sizes.items():
            _require(n > 0, f"data.demo_sizes.{name} must be positive")
        _require(m.d_model > 0 and m.n_heads > 0, "model.d_model and model.n_heads must be positive")
        _require(
            m.d_model % m.n_heads == 0,
            f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})",
        )
        _require(m.encoder_layers >= 1 and m.decoder_layers >= 1, "model.encoder_layers/decoder_layers must be >= 1")
        _require(m.ff_dim > 0, "model.ff_dim must be positive")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            _require(0.0 <= getattr(m, key) < 1.0, f"model.{key} must be in [0, 1)")
        _require(m.clip >= 0, f"model.clip must be >= 0 (got {m.clip})")
        _require(m.max_positions > 0, "model.max_positions must be positive")
        for scheme in SCHEMES.values():  # every scheme's settings section, and the chosen scheme's own rules
            section_problem = getattr(m, scheme.name).problem() if scheme.settings is not None else None
            _require(section_problem is None, section_problem or "")
            if scheme.name == m.positions:
                problem = scheme.problem(m)
                _require(problem is None, problem or "")
        _require(t.max_tokens > 0, "train.max_tokens must be positive")
        _require(t.update_freq >= 1, "train.update_freq must be >= 1")
        _require(
            t.max_steps is not None or t.max_epochs is not None or t.max_time is not None,
            # the keys in full: the error then names the --set or the line that set them to null
            "train needs at least one of train.max_steps, train.max_epochs, train.max_time (all are null)",
        )
        for key in ("max_steps", "max_epochs", "max_time", "patience", "num_threads", "valid_max_sentences"):
            value = getattr(t, key)
            _require(value is None or value > 0, f"train.{key} must be positive")
        _require(t.warmup_steps >= 1, "train.warmup_steps must be >= 1")
        _require(0.0 <= t.warmup_fraction < 1.0, "train.warmup_fraction must be in [0, 1)")
        _require(t.lr_schedule != "budget" or t.max_time is not None, "train.lr_schedule 'budget' needs train.max_time")
        _require(t.lr_schedule != "cosine" or t.max_steps is not None, "train.lr_schedule 'cosine' needs train.max_steps")
        for key in ("lr_scale", "peak_lr"):  # each its own message: the user must see which one is wrong
            _require(getattr(t, key) > 0, f"train.{key} must be positive (got {yaml_value(getattr(t, key))})")
        _require(all(0.0 <= b < 1.0 for b in t.adam_betas), "train.adam_betas must be in [0, 1)")
        _require(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)")
        _require(t.clip_norm >= 0.0, "train.clip_norm must be >= 0")
        _require(t.weight_decay >= 0.0, f"train.weight_decay must be >= 0 (got {t.weight_decay})")
        for key in ("log_every", "save_every", "validate_every", "keep_last", "max_bad_updates"):
            _require(getattr(t, key) >= 1, f"train.{key} must be >= 1")
        _require(t.valid_beam_size >= 1, "train.valid_beam_size must be >= 1")
        _require(t.average_last >= 0, "train.average_last must be >= 0")
        _require(t.average_last <= t.keep_last,
                 f"train.average_last ({t.average_last}) must not exceed train.keep_last ({t.keep_last}): the run "
                 f"deletes all but its last {t.keep_last} numbered checkpoints before it averages them")
        _require(0.0 <= t.final_lr_fraction <= 1.0, f"train.final_lr_fraction must be in [0, 1] (got {t.final_lr_fraction})")
        _require(t.adam_eps > 0.0, f"train.adam_eps must be positive (got {t.adam_eps})")
        _require(DEVICE_NAME.fullmatch(t.device) is not None,
                 f"train.device must be auto, cpu, cuda or cuda:N (got {yaml_value(t.device)})")
        _require(t.seed >= 0, f"train.seed must be >= 0 (got {t.seed})")  # numpy's generators take no negative seed
        check_decode(dec)
        return self


# The command-line options that set decode keys (translate, eval-bleu): a value given as one is named as it was given.
DECODE_OPTIONS = {"beam_size": "--beam-size", "length_penalty": "--length-penalty", "nbest": "--nbest",
                  "max_tokens": "--max-tokens", "min_length": "--min-length", "buffer_lines": "--buffer-lines"}


def config_key(key: str) -> str:
    """A decode key as a config names it (``decode.beam_size``)."""
    return f"decode.{key}"


def option_or_key(key: str) -> str:
    """A decode key as the command line names it (``--beam-size``), or as a config does where no option sets it."""
    return DECODE_OPTIONS.get(key, config_key(key))


def check_decode(dec: DecodeConfig, name: Callable[[str], str] = config_key) -> DecodeConfig:
    """The one check of decoding settings, for a config, the command line's options and a caller of the library
    alike; ``name`` says how a key was given (``config_key``, ``option_or_key``), so that the message names it as the
    user wrote it. Returns ``dec``."""
    for key in ("beam_size", "max_tokens", "buffer_lines"):
        _require(getattr(dec, key) >= 1, f"{name(key)} must be >= 1 (got {getattr(dec, key)})")
    _require(math.isfinite(dec.length_penalty) and dec.length_penalty >= 0,
             f"{name('length_penalty')} must be a finite number >= 0 (got {dec.length_penalty})")
    _require(1 <= dec.nbest <= dec.beam_size,
             f"{name('nbest')} must be between 1 and the beam size {dec.beam_size} (got {dec.nbest})")
    for key in ("max_len_a", "max_len_b", "min_length"):
        _require(getattr(dec, key) >= 0, f"{name(key)} must be >= 0 (got {getattr(dec, key)})")
    return dec


# What train.device and the --device options take; group 1 is a cuda device's number, where one is given.
DEVICE_NAME = re.compile(r"auto|cpu|cuda(?::(\d+))?")
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def validate_data(config: DataConfig) -> None:
    """The data section's checks that name files and splits; ``prepare`` runs them too, for a ``DataConfig`` built
    in code. Part of ``Config.validate``, so that ``train`` rejects these values before it starts preparing data."""
    if config.src_lang == config.tgt_lang:
        raise UserError(f"data.src_lang and data.tgt_lang must differ (both are '{config.src_lang}')")
    for key in ("src_lang", "tgt_lang"):
        if not _SPLIT_NAME.match(getattr(config, key)):
            raise UserError(f"data.{key} must be a plain language code like 'en' "
                            f"(got {yaml_value(getattr(config, key))})")
    names, prefix = {"demo": (config.demo_sizes, "data.demo_sizes"), "files": (config.splits, "data.splits"),
                     "hub": (config.hub.splits, "data.hub.splits")}.get(config.source, ({}, "data.splits"))
    for name in names:
        if not _SPLIT_NAME.match(name):
            raise UserError(f"{prefix}.{name}: split names may use only letters, digits, '_' and '-'")
    misnamed = sorted(set(names) & {"valid", "validation", "val", "development"})
    if misnamed and "dev" not in names:  # validation reads the split named dev: under another name it never ran
        raise UserError(f"{prefix}.{misnamed[0]}: the validation split is named 'dev' (validation, the best "
                        f"checkpoint and the dev scores read it); rename '{misnamed[0]}' to 'dev'")
    if config.splits and config.source != "files":  # the other sources read no split files: they were ignored
        hint = "; local Multi30k files go in data.multi30k_dir" if config.source == "multi30k" else ""
        raise UserError(f"data.splits is read only when data.source is files (it is {config.source}): remove "
                        f"data.splits or set data.source: files{hint}")
    if config.source == "demo" and "train" not in config.demo_sizes:
        raise UserError("data.demo_sizes must have a 'train' entry")
    if config.source == "hub":
        validate_hub(config.hub)
    if not Path(os.path.abspath(config.output_dir)).name or Path(config.output_dir).name in ("", ".", ".."):
        raise UserError(f"data.output_dir must name a directory of its own (got {yaml_value(config.output_dir)})")
    if config.max_train_pairs is not None and config.max_train_pairs <= 0:
        raise UserError("data.max_train_pairs must be positive")
    if config.multi30k_text == "tok" and config.source != "multi30k":
        raise UserError(f"data.multi30k_text: tok reads Multi30k's tokenized files; it needs data.source: multi30k "
                        f"(it is {config.source})")


def validate_hub(hub: HubSettings) -> None:
    """The data.hub section's own checks (data.source: hub)."""
    if not hub.path:
        raise UserError("data.hub.path is required when data.source is hub: a dataset on the hub such as "
                        f"wmt/wmt16, or one of {', '.join(HUB_LOCAL_BUILDERS)} with data.hub.data_files")
    if hub.path in HUB_LOCAL_BUILDERS:
        if hub.data_files is None or hub.data_files in ("", [], {}):
            raise UserError(f"data.hub.data_files is required with data.hub.path: {hub.path} (the local files to "
                            "read: a path or glob, a list, or {split: files})")
        if hub.revision is not None:
            raise UserError(f"data.hub.revision is for datasets on the hub; local files (data.hub.path: {hub.path}) "
                            "are recorded by their sha256: remove data.hub.revision")
    if "train" not in hub.splits:
        raise UserError("data.hub.splits must map 'train' to one of the dataset's splits (e.g. {train: train, "
                        "dev: validation, test: test})")
    if (hub.src_column is None) != (hub.tgt_column is None):
        given = "data.hub.src_column" if hub.src_column is not None else "data.hub.tgt_column"
        raise UserError(f"{given} needs its partner: give both data.hub.src_column and data.hub.tgt_column (two text "
                        "columns), or neither (the translation column of {language: text})")
    if hub.src_column is not None and hub.src_column == hub.tgt_column:
        raise UserError(f"data.hub.src_column and data.hub.tgt_column must differ (both are '{hub.src_column}')")


def is_pretokenized(config: DataConfig) -> bool:
    """Whether the text is already lowercased, punctuation-normalized and Moses-tokenized (Multi30k's tok/ files): its
    translations are scored as they are, without the tokenization that raw text gets before BLEU."""
    return config.source == "multi30k" and config.multi30k_text == "tok"


_SECTION_NAMES = {DataConfig: "data", ModelConfig: "model", TrainConfig: "train", DecodeConfig: "decode"}

# The paper's two model sizes (Shaw et al. 2018, Section 4.1, following Vaswani et al. 2017).
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(d_model=512, n_heads=8, encoder_layers=6, decoder_layers=6, ff_dim=1024, dropout=0.1, clip=16,
                 share_across_heads=False),
    "big": dict(d_model=1024, n_heads=16, encoder_layers=6, decoder_layers=6, ff_dim=4096, dropout=0.3, clip=8,
                share_across_heads=True),
}


# --------------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key given twice in one mapping is an error (YAML says keys are unique;
    PyYAML would silently keep the last value)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first on line {seen[key]})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's booleans: true and false only. PyYAML follows YAML 1.1, where yes/no/on/off are booleans too, so
# `tgt_lang: no` (Norwegian) read as False; with this resolver it is the string it looks like, and `valid_bleu: yes`
# is an error that says a bool field wants true or false.
_BOOL = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))

# Exponent notation without a dot (1e-9, -3E4), which YAML 1.1 leaves as a string.
_YAML11_FLOAT_GAP = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def yaml_value(value: Any) -> str:
    """``value`` as a config file spells it: null, true/false, strings bare unless YAML needs quotes ('no', '010'),
    [0.9, 0.98]. Messages about config values use it, so that they show what the user wrote in the YAML, not
    Python's None/True/'text'."""
    def plain(v: Any) -> Any:  # tuples (train.adam_betas) are lists in YAML, sections are mappings
        if dataclasses.is_dataclass(v):
            return plain(dataclasses.asdict(v))
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    def dump(style: str | None) -> str:
        text = yaml.safe_dump(plain(value), default_flow_style=True, default_style=style, width=float("inf"),
                              allow_unicode=True, sort_keys=False)
        return text.removesuffix("\n").removesuffix("\n...")  # a bare scalar is dumped as a document: "null\n...\n"

    text = dump(None)
    return text if "\n" not in text else dump('"')  # a line break inside: "a\nb", escaped, keeps the message one line


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def load_config(path: str | Path | None, overrides: list[str] | None = None, user_given: bool = True) -> Config:
    """Read a YAML config (``None`` = all defaults), apply ``section.key=value`` overrides, validate.

    ``user_given=False``: a run's saved config, which the user did not write: no warnings about settings the
    position scheme or a preset ignores, and no refusal of a setting that was ignored when the run was made."""
    raw: dict[str, Any] = {}
    lines: dict[str, int] = {}  # the line of each key in the file, for validation errors
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise UserError(f"config file {path} is a directory; give a YAML file, e.g. configs/demo.yaml")
        if not path.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
            loaded = yaml.load(text, Loader=_StrictLoader)
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise UserError(f"{path}:{where} invalid YAML: {getattr(exc, 'problem', exc)}") from None
        if loaded is None:
            raise UserError(f"{path}: the config file is empty (configs/demo.yaml is a small complete example)")
        if not isinstance(loaded, dict):
            raise UserError(f"{path}: the top level must be a mapping of sections (data, model, train, decode)")
        raw = loaded
        lines = _key_lines(text)
    # Where each model setting was given (the last --set of a key wins over the file), for the warnings below.
    model_raw = raw.get("model")
    given = {key: str(path) for key in model_raw} if isinstance(model_raw, dict) else {}
    set_by: dict[str, str] = {}  # dotted key -> the --set that gave it last
    for override in overrides or []:
        _apply_override(raw, override)
        keys = override.partition("=")[0].strip().split(".")
        set_by[".".join(keys)] = f"--set {override.strip()}"
        if keys[0] == "model":
            given[keys[1]] = f"--set {override.strip()}"
    config = config_from_dict(raw, origin=str(path) if path is not None else "config",
                              locate=_locator(path, lines, set_by))
    if given.get("positions", "").startswith("--set"):
        # The scheme was switched by an override (as a sweep's cells do): the file's settings are evidently for the
        # file's own scheme, and a warning about them is one the user cannot act on. Overrides are still checked.
        given = {key: source for key, source in given.items() if source.startswith("--set")}
    if user_given:
        warn_unused_settings(config.model, given)
        warn_overridden_preset(config.model, given)
        refuse_unread_data_keys(config.data)
    return config


def refuse_unread_data_keys(config: DataConfig) -> None:
    """A data key that only another data.source reads was ignored: `--set data.multi30k_dir=DIR` alone (source demo
    by default) prepared and trained on the synthetic demo corpus without a word, and data.demo_sizes under source
    files changed nothing. Checked only on a config the user gives now (``load_config``): a run's saved config and
    its checkpoints still load."""
    defaults = DataConfig()
    for key, reader in (("multi30k_dir", "multi30k"), ("demo_sizes", "demo"), ("demo_seed", "demo")):
        if config.source != reader and getattr(config, key) != getattr(defaults, key):
            raise UserError(f"data.{key} is read only when data.source is {reader} (it is {config.source}): set "
                            f"data.source: {reader}, or remove data.{key}")
    if config.source != "hub":
        for f in dataclasses.fields(HubSettings):
            if getattr(config.hub, f.name) != getattr(defaults.hub, f.name):
                raise UserError(f"data.hub.{f.name} is read only when data.source is hub (it is {config.source}): "
                                "set data.source: hub, or remove data.hub")


def warn_overridden_preset(model: ModelConfig, given: dict[str, str]) -> None:
    """A preset chosen by ``--set`` under a config file that sets some of the preset's keys: the file's values win
    (keys given next to a preset override it), so ``--set model.preset=big`` on configs/demo.yaml kept the demo's
    d_model, heads, layers and feed-forward size without a word. One warning names the keys the file kept."""
    source = given.get("preset", "")
    if not source.startswith("--set") or model.preset not in PRESETS:
        return
    kept = [key for key in PRESETS[model.preset] if key in given and not given[key].startswith("--set")]
    if kept:
        where = given[kept[0]]
        message = (f"warning: {source}: {where} sets {', '.join('model.' + k for k in kept)}, which override the "
                   f"preset's values (--set them too, or use a config without them)")
        if message not in _warned:
            _warned.add(message)
            log.warning(message)


_warned: set[str] = set()  # a sweep loads its config once per cell and run: each warning is said once a process


def warn_unused_settings(model: ModelConfig, given: dict[str, str]) -> None:
    """One warning line for each setting in ``given`` (model key -> where it was given) that the position scheme
    ignores and that differs from the value it would have had unset (a saved, fully resolved config spells out every
    default; those warn about nothing)."""
    unset = ModelConfig(**PRESETS.get(model.preset or "", {}))
    for key in unused_model_settings(model.positions):
        if key not in given or getattr(model, key) == getattr(unset, key):
            continue
        users = " and ".join(SCHEME_SETTINGS[key])
        message = (f"warning: {given[key]}: model.{key} is ignored by model.positions={model.positions} (only "
                   f"{users} read it)")
        if message not in _warned:
            _warned.add(message)
            log.warning(message)


def config_from_dict(raw: dict[str, Any], origin: str = "config",
                     locate: Callable[[list[str]], str | None] | None = None) -> Config:
    """Build a validated ``Config`` from plain nested dicts (YAML or a checkpoint's saved config).

    ``locate``: where the settings a validation error names (``train.max_steps``) were given, as the error's prefix
    (``load_config``: the file and line, or the --set); by default ``origin``, unless that is the generic "config"."""
    raw = dict(raw)
    model_raw = raw.get("model")
    if isinstance(model_raw, dict) and model_raw.get("preset") is not None:
        preset = model_raw["preset"]
        if preset not in PRESETS:
            raise UserError(f"{origin}: model.preset must be one of {yaml_value(sorted(PRESETS))} "
                            f"(got {yaml_value(preset)})")
        raw["model"] = {**PRESETS[preset], **model_raw}
    config = _build(Config, raw, prefix="", origin=origin)
    expand_home(config)
    try:
        return config.validate()
    except UserError as exc:
        where = (locate or (lambda keys: None if origin == "config" else origin))(_KEY_IN_MESSAGE.findall(str(exc)))
        if where is None:
            raise
        raise UserError(f"{where}: {exc}") from None


# The settings a validation message names: "train.max_steps", "model.t5.num_buckets", "data.splits.dev"
_KEY_IN_MESSAGE = re.compile(r"\b(?:data|model|train|decode)(?:\.[\w-]+)+")


def _key_lines(text: str) -> dict[str, int]:
    """The line of each key of a YAML config, by its dotted name: {"train": 20, "train.max_steps": 23, ...}."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    lines[prefix + key_node.value] = key_node.start_mark.line + 1
                    walk(value_node, f"{prefix}{key_node.value}.")

    walk(yaml.compose(text, Loader=_StrictLoader), "")
    return lines


def _locator(path: Path | None, lines: dict[str, int], set_by: dict[str, str]) -> Callable[[list[str]], str | None]:
    """Where the settings ``keys`` of a validation error were given: the first given by a --set (``set_by``: dotted
    key -> "--set key=value"), else the config file at the first one's line (``lines``), else the file itself (the
    value is a default, or a preset's, which the file chose). A key is given where it, a section above it or a
    setting below it was."""
    def given(key: str, where: dict[str, Any]) -> Any:
        parts = key.split(".")
        above = (where[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in where)
        below = (value for name, value in where.items() if name.startswith(key + "."))  # data.splits.train.src
        return next(above, None) or next(below, None)

    def locate(keys: list[str]) -> str | None:
        for key in keys:
            if given(key, set_by) is not None:
                return given(key, set_by)
        for key in keys:
            line = given(key, {k: v for k, v in lines.items() if "." in k})  # a section's line says too little
            if line is not None and path is not None:
                return f"{path}: line {line}"
        return None if path is None else str(path)

    return locate


def expand_home(config: Config) -> None:
    """``~`` and ``~user`` at the start of a path setting are a home directory, as a shell reads them (a ``--set``
    value after ``=`` and a YAML value never reach one): kept as written, ``train.run_dir: ~/runs/x`` made a
    directory named ``~`` in the current one, and ``rm -rf ~`` is what a user then types to remove it."""
    d, t = config.data, config.train
    d.output_dir = os.path.expanduser(d.output_dir)
    d.multi30k_dir = d.multi30k_dir and os.path.expanduser(d.multi30k_dir)
    if d.hub.path in HUB_LOCAL_BUILDERS:  # local paths (a hub dataset's data_files are paths in its repository)
        d.hub.data_files = map_data_files(d.hub.data_files, os.path.expanduser)
    for split in d.splits.values():
        for key in ("src", "tgt", "tsv"):
            setattr(split, key, getattr(split, key) and os.path.expanduser(getattr(split, key)))
    t.run_dir = os.path.expanduser(t.run_dir)
    t.init_from = t.init_from and os.path.expanduser(t.init_from)


def map_data_files(files: Any, fn: Callable[[str], Any]) -> Any:
    """``fn`` applied to every path of a data_files value (a string, a list, or {split: string or list})."""
    if isinstance(files, str):
        return fn(files)
    if isinstance(files, list):
        return [fn(f) for f in files]
    if isinstance(files, dict):
        return {split: map_data_files(value, fn) for split, value in files.items()}
    return files


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dicts (tuples as lists), suitable for YAML, JSON and ``torch.save(weights_only)``."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(config)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config atomically (a temporary file renamed into place): a kill while writing leaves the
    previous file, never an empty one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False), encoding="utf-8")
        fault_point("config_write")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk's partial copy: not left beside the run
        raise


def _apply_override(raw: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise UserError(f"--set expects section.key=value, got {override!r}")
    dotted, _, value_text = override.partition("=")
    keys = dotted.strip().split(".")
    if len(keys) < 2 or not all(keys):
        raise UserError(f"--set expects section.key=value, got {override!r}")
    try:
        value = yaml.load(value_text, Loader=_StrictLoader) if value_text.strip() else None
    except yaml.YAMLError:
        value = value_text
    entry = _check_override_key(keys, override.strip(), value)
    node = raw
    for depth, key in enumerate(keys[:-1], start=1):
        child = node.get(key)
        if child is None:  # a mapping the file does not give starts from its default: dev and test stay
            child = node[key] = _default_mapping(keys[:depth]) or {}
        if not isinstance(child, dict):
            raise UserError(f"--set {dotted}: {key} is not a section")
        node = child
    if entry and value is None:  # --set data.splits.test=null: the mapping loses the entry (it has no null value)
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def _default_mapping(keys: list[str]) -> dict[str, Any] | None:
    """A copy of the default value at ``keys`` (data.demo_sizes) when it is a mapping, in the config file's form."""
    node: Any = Config()
    for key in keys:
        node = getattr(node, key, None) if dataclasses.is_dataclass(node) else None
    if not isinstance(node, dict):
        return None
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else copy.deepcopy(v) for k, v in node.items()}


# What fairseq, OpenNMT-py and Sockeye users type for a setting with another name here: offered as the "did you
# mean", never accepted silently (a closest-spelling match could name another setting: max_updates -> max_bad_updates).
KEY_ALIASES = {
    "max_update": "max_steps", "max_updates": "max_steps", "train_steps": "max_steps", "max_epoch": "max_epochs",
    "lr": "peak_lr", "learning_rate": "peak_lr", "warmup_updates": "warmup_steps", "warmup": "warmup_steps",
    "batch_size": "max_tokens", "max_sentences": "max_tokens", "beam": "beam_size", "lenpen": "length_penalty",
    "save_interval_updates": "save_every", "validate_interval_updates": "validate_every",
    "keep_last_epochs": "keep_last", "max_grad_norm": "clip_norm",
}


def _suggestion(key: str, names: list[str]) -> str | None:
    """The field a mistyped ``key`` probably meant: a known alias of another toolkit, else the closest spelling."""
    alias = KEY_ALIASES.get(key)
    if alias in names:
        return alias
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _check_override_key(keys: list[str], override: str, value: Any) -> bool:
    """An unknown key in --set, a key below a value, a value given to a whole section and a value of the wrong type
    are named as --set's errors, not as the config file's. True when the key is an entry of a mapping (null, then,
    removes it)."""
    cls: Any = Config
    entry = False
    for depth, key in enumerate(keys):
        entry = typing.get_origin(cls) is dict
        if entry:  # an entry of a mapping (data.splits.train): any name
            cls = typing.get_args(cls)[1]
            continue
        if not dataclasses.is_dataclass(cls):
            raise UserError(f"--set {override}: {'.'.join(keys[:depth])} is a value, not a section")
        names = [f.name for f in dataclasses.fields(cls)]
        if key not in names:
            prefix = ".".join(keys[:depth])
            suggestion = _suggestion(key, names)
            hint = (f" (did you mean '{prefix + '.' if prefix else ''}{suggestion}'?)" if suggestion
                    else f"; valid keys: {', '.join(names)}")
            raise UserError(f"--set {override}: unknown key '{'.'.join(keys[:depth + 1])}'{hint}")
        cls = typing.get_type_hints(cls)[key]
    dotted = ".".join(keys)
    # A YAML mapping (or null: the defaults) replaces a section whole; any other value is a section's error.
    if value is not None and not isinstance(value, dict):
        if dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
            raise UserError(f"--set {override}: {dotted} is a section, not a value; set one of its keys "
                            f"({', '.join(names)}), e.g. --set {dotted}.{names[0]}=...")
        if typing.get_origin(cls) is dict:
            raise UserError(f"--set {override}: {dotted} is a mapping, not a value; set one entry at a time, "
                            f"e.g. --set {dotted}.NAME=...")
    if entry and value is None:
        return True
    _coerce(cls, value, dotted, f"--set {override}")  # a value of the wrong type: --set's error too
    return entry


def _build(cls: type, raw: Any, prefix: str, origin: str) -> Any:
    if not isinstance(raw, dict):
        raise UserError(f"{origin}: {prefix.rstrip('.') or 'config'} must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            suggestion = _suggestion(str(key), names)
            hint = f" (did you mean '{prefix}{suggestion}'?)" if suggestion else f"; valid keys: {', '.join(names)}"
            raise UserError(f"{origin}: unknown key '{prefix}{key}'{hint}")
        kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}", origin)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str, origin: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert ints to floats and lists to tuples where declared."""
    origin_tp = typing.get_origin(tp)
    args = typing.get_args(tp)

    def fail(expected: str) -> UserError:
        return UserError(f"{origin}: {key} must be {expected}, got {yaml_value(value)}")

    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, f"{key}.", origin)
    if origin_tp in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        errors = []
        for arg in non_none:
            try:
                return _coerce(arg, value, key, origin)
            except UserError as exc:
                errors.append(exc)
        raise errors[0]
    if origin_tp is Literal:
        if value not in args:
            choices = ", ".join(yaml_value(a) for a in args)
            suggestion = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f" (did you mean '{suggestion[0]}'?)" if suggestion else ""  # quoted as the key suggestions are
            raise UserError(f"{origin}: {key} must be one of {choices}, got {yaml_value(value)}{hint}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT_GAP.fullmatch(value.strip()):
            return float(value)  # PyYAML (YAML 1.1) reads 1e-9 as a string; YAML 1.2 and users mean a number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail("a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):  # a number is not turned back into text: YAML 1.1 read 010 as 8, 1_0 as 10
            raise fail("a string")
        return value
    if origin_tp is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            # "(0.9, 0.98)" is a string to YAML: say how a list is written (on the command line: --set k=[a,b])
            raise fail(f"a list of {len(args)} values in brackets ([{', '.join('abcdefgh'[:len(args)])}])")
        return tuple(_coerce(a, v, f"{key}[{i}]", origin) for i, (a, v) in enumerate(zip(args, value)))
    if origin_tp is list:
        if not isinstance(value, list):
            raise fail("a list")
        return [_coerce(args[0], v, f"{key}[{i}]", origin) for i, v in enumerate(value)]
    if origin_tp is dict:
        if not isinstance(value, dict):
            raise fail("a mapping")
        return {str(k): _coerce(args[1], v, f"{key}.{k}", origin) for k, v in value.items()}
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")  # a bug in this module, not user input
