"""Export a trained model to CTranslate2 (OpenNMT's inference engine: fast CPU and GPU decoding, int8/int16).

The model is described with CTranslate2's own specification API (``ctranslate2.specs.TransformerSpec``) and written
by its ``Converter``; nothing here knows the binary format. The model directory's files are named in
``rpr_mt.layouts`` (which its readers import instead of this module).

Each position scheme declares how CTranslate2 holds it (``Scheme.ctranslate2`` in
``rpr_mt.model.positions.schemes``: a layout, or why it cannot); this module writes each layout:

    encodings     the exact table as explicit position encodings (zeros for none): our sinusoids interleave
                  sin/cos, CTranslate2's built-in ones are concatenated halves. Shaw's k = 0 is held so too: its
                  value vector is a constant folded into the output projection's bias
    shaw          relative_position_keys / _values [2k+1, d_head] in every self-attention layer; a term the model
                  does not use is a zero table (q . 0 and softmax . 0 add nothing)
    t5 bias       relative_attention_bias [buckets, H] and relative_attention_max_distance, added after the
                  1/sqrt(d_head) scaling as in rpr-mt; CTranslate2 computes it from a stack's first layer
    alibi bias    a T5 bias table whose exact buckets cover every distance below max_positions and hold
                  -m_h * distance: CTranslate2 has ALiBi only in decoders, this form works in both stacks
    rotary        rotary embeddings over the whole head dimension, half-split (non-interleaved) layout

A model CTranslate2 cannot hold is refused by ``unsupported_reason`` with its scheme's one line: why, what to train instead.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from rpr_mt.config import ModelConfig, config_from_dict, config_to_dict, is_pretokenized
from rpr_mt.data.vocab import MODEL_FILE
from rpr_mt.errors import UserError
from rpr_mt.layouts import CTRANSLATE2_WEIGHTS, EXPORT_FORMAT, EXPORT_INFO_FILE
from rpr_mt.model.positions import SCHEMES, describe_positions
from rpr_mt.model.positions.schemes import CT2_ALIBI_BIAS, CT2_ENCODINGS, CT2_ROTARY, CT2_SHAW, CT2_T5_BIAS, \
    Unexportable
from rpr_mt.text import casing

if TYPE_CHECKING:
    from ctranslate2.specs import transformer_spec

    from rpr_mt.data.vocab import Vocab
    from rpr_mt.model.transformer import Seq2Seq

__all__ = ["ExportResult", "build_spec", "export_ctranslate2", "quantization_types",
           "unsupported_reason"]

INSTALL_HINT = "pip install 'ctranslate2>=4.7'"


def _import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise UserError(f"exporting to CTranslate2 needs the ctranslate2 package: {INSTALL_HINT}") from None
    return ctranslate2


def quantization_types() -> tuple[str, ...]:
    """The weight types CTranslate2 accepts at conversion (int8, int8_float32, int16, float16, ...)."""
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    return tuple(ACCEPTED_MODEL_TYPES)


# --------------------------------------------------------------------------------------------------------------------
# What CTranslate2 can express
# --------------------------------------------------------------------------------------------------------------------


def unsupported_reason(cfg: ModelConfig) -> Optional[str]:
    """None when CTranslate2 can hold a model of this config exactly, else one line: why not, what to train."""
    form = SCHEMES[cfg.positions].ctranslate2(cfg)
    return form.reason if isinstance(form, Unexportable) else None


def _layout(cfg: ModelConfig) -> str:
    """How an expressible model is held: one of the ``CT2_*`` layouts of ``rpr_mt.model.positions.schemes``."""
    form = SCHEMES[cfg.positions].ctranslate2(cfg)
    assert not isinstance(form, Unexportable), form.reason  # build_spec refuses those first
    return form


# --------------------------------------------------------------------------------------------------------------------
# The specification
# --------------------------------------------------------------------------------------------------------------------


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _set_linear(spec: Any, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _set_norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _output_bias(attn: Any) -> torch.Tensor:
    """The output projection's bias, with Shaw's value term folded in when k = 0 (see the module docstring)."""
    bias = attn.out_proj.bias.detach().double()
    positions = attn.positions
    rel_v = getattr(positions, "rel_v", None)
    if rel_v is not None and positions.clip == 0:
        # rel_v [1, d_head] shared or [H, 1, d_head] per head -> the constant added to each head's output
        constant = rel_v.detach().double().reshape(-1, rel_v.size(-1)).expand(attn.n_heads, -1).reshape(-1)
        bias = bias + attn.out_proj.weight.detach().double() @ constant
    return bias


def _set_self_attention(spec: Any, attn: Any, norm: torch.nn.LayerNorm, layout: str) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear[0], attn.in_proj_weight, attn.in_proj_bias)  # [q; k; v] rows: CTranslate2's fused order
    _set_linear(spec.linear[1], attn.out_proj.weight, _output_bias(attn))
    # CTranslate2's default query scale is 1/sqrt(d_head) too; set it so that the model never depends on a default
    spec.queries_scale = np.float32(1.0 / math.sqrt(attn.d_head))
    if layout == CT2_SHAW:
        positions = attn.positions
        shape = (2 * positions.clip + 1, attn.d_head)  # per-head tables reach here only with one head
        zeros = np.zeros(shape, dtype=np.float32)
        spec.relative_position_keys = zeros if positions.rel_k is None else _array(positions.rel_k).reshape(shape)
        spec.relative_position_values = zeros if positions.rel_v is None else _array(positions.rel_v).reshape(shape)


def _set_cross_attention(spec: Any, attn: Any, norm: torch.nn.LayerNorm) -> None:
    d = attn.d_model
    _set_norm(spec.layer_norm, norm)
    bias = attn.in_proj_bias
    _set_linear(spec.linear[0], attn.in_proj_weight[:d], None if bias is None else bias[:d])  # queries
    _set_linear(spec.linear[1], attn.in_proj_weight[d:], None if bias is None else bias[d:])  # [k; v] on the memory
    _set_linear(spec.linear[2], attn.out_proj.weight, attn.out_proj.bias)
    spec.queries_scale = np.float32(1.0 / math.sqrt(attn.d_head))


def _set_ffn(spec: Any, ff: Any, norm: torch.nn.LayerNorm) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ff.fc1.weight, ff.fc1.bias)
    _set_linear(spec.linear_1, ff.fc2.weight, ff.fc2.bias)


def _position_encodings(model: "Seq2Seq") -> np.ndarray:
    """The vectors added to the scaled embeddings, [max_positions, d_model] (zeros when there are none)."""
    absolute = model.positions.absolute
    if absolute is None:
        return np.zeros((model.max_positions, model.cfg.d_model), dtype=np.float32)
    if absolute.learned is not None:
        return _array(absolute.learned.weight)
    return _array(absolute.sinusoid)


def _bias_tables(model: "Seq2Seq", layout: str) -> tuple[tuple[np.ndarray, int], tuple[np.ndarray, int]]:
    """(table [buckets, H], max_distance) for the encoder and the decoder of a model held as a T5 or ALiBi bias."""
    cfg = model.cfg
    if layout == CT2_T5_BIAS:
        tables = model.positions.encoder_table.weight, model.positions.decoder_table.weight
        return (_array(tables[0]), cfg.t5.max_distance), (_array(tables[1]), cfg.t5.max_distance)
    # ALiBi as T5 buckets. CTranslate2's buckets are exact (one per distance) below num_buckets / 4 in the encoder
    # (half the buckets per direction, half of those exact) and below num_buckets / 2 in the decoder; rpr-mt never
    # sees a distance >= max_positions, so 4 * max_positions and 2 * max_positions buckets make the bias exact.
    # max_distance only shapes the logarithmic buckets, which stay unused; it must exceed the exact range.
    from rpr_mt.model.positions.alibi import alibi_slopes

    limit = model.max_positions
    slopes = alibi_slopes(cfg.n_heads).float()  # the float32 slopes the model multiplies by, [H]
    distance = torch.arange(2 * limit, dtype=torch.float32)  # bucket b of a half holds distance b
    half = -slopes[None, :] * distance[:, None]  # [2 * limit, H], as rpr-mt computes -m_h * |i - j|
    encoder = torch.cat([half, half])  # keys left of (or at) the query, then keys to its right
    return (_array(encoder), 2 * limit), (_array(half), 2 * limit)


def build_spec(model: "Seq2Seq", vocab: "Vocab") -> "transformer_spec.TransformerSpec":
    """The CTranslate2 specification of ``model`` (eval mode, float32), its vocabulary registered. Raises
    ``UserError`` with ``unsupported_reason`` for a model CTranslate2 cannot hold."""
    _import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    reason = unsupported_reason(cfg)
    if reason is not None:
        raise UserError(reason)
    layout = _layout(cfg)
    options: dict[str, Any] = dict(
        pre_norm=cfg.norm == "pre", activation=common_spec.Activation.RELU,
        relative_position=layout == CT2_SHAW, relative_attention_bias=layout in (CT2_T5_BIAS, CT2_ALIBI_BIAS),
    )
    if layout == CT2_ROTARY:  # rotary_dim 0 = every dimension of the head
        options.update(rotary_dim=0, rotary_interleave=False, rotary_base=float(cfg.rope.base))
    encoder = transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.n_heads, **options)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.n_heads, **options)

    # One joint vocabulary: source embeddings, target embeddings and the output projection are the same matrix
    # (CTranslate2 stores it once: equal variables become aliases). Both stacks scale embeddings by sqrt(d_model),
    # CTranslate2's default.
    embeddings = _array(model.embed.weight)
    encoder.embeddings[0].weight = embeddings
    decoder.embeddings.weight = embeddings
    decoder.projection.weight = embeddings
    if layout == CT2_ENCODINGS:
        table = _position_encodings(model)
        encoder.position_encodings.encodings = table
        decoder.position_encodings.encodings = table
    if cfg.norm == "pre":
        _set_norm(encoder.layer_norm, model.encoder_norm)
        _set_norm(decoder.layer_norm, model.decoder_norm)

    for spec, layer in zip(encoder.layer, model.encoder_layers):
        _set_self_attention(spec.self_attention, layer.self_attn, layer.attn_block.norm, layout)
        _set_ffn(spec.ffn, layer.ff, layer.ff_block.norm)
    for spec, layer in zip(decoder.layer, model.decoder_layers):
        _set_self_attention(spec.self_attention, layer.self_attn, layer.self_block.norm, layout)
        _set_cross_attention(spec.attention, layer.cross_attn, layer.cross_block.norm)
        _set_ffn(spec.ffn, layer.ff, layer.ff_block.norm)
    if layout in (CT2_T5_BIAS, CT2_ALIBI_BIAS):
        for stack, (table, max_distance) in zip((encoder, decoder), _bias_tables(model, layout)):
            for spec in stack.layer:  # every layer is declared; CTranslate2 reads the first one's
                spec.self_attention.relative_attention_bias = table
                spec.self_attention.relative_attention_max_distance = np.int32(max_distance)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    pieces = [vocab.piece(i) for i in range(vocab.size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = (
        vocab.piece(vocab.unk_id), vocab.piece(vocab.bos_id), vocab.piece(vocab.eos_id))
    config.decoder_start_token = vocab.piece(vocab.bos_id)  # the decoder starts from bos, as in rpr-mt
    config.add_source_bos = False
    config.add_source_eos = True  # rpr-mt appends eos to every source
    config.layer_norm_epsilon = float(model.encoder_layers[0].attn_block.norm.eps)
    return spec


# --------------------------------------------------------------------------------------------------------------------
# Writing the model directory
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ExportResult:
    output: Path  # the model directory
    checkpoint: Path  # the checkpoint it came from
    positions: str  # model.positions of the exported model
    positions_label: str  # the same in words (rpr_mt.model.positions.describe_positions): "learned absolute"
    quantization: Optional[str]  # CTranslate2 weight type, None = float32 as trained


def _looks_like_ctranslate2_model(path: Path) -> bool:
    return path.is_dir() and (not any(path.iterdir()) or (path / CTRANSLATE2_WEIGHTS).is_file())


def _spec_converter(spec: Any):
    from ctranslate2.converters.converter import Converter

    class SpecConverter(Converter):
        """CTranslate2's converter driver (validate, optimize/quantize, save) for a specification built here."""

        def _load(self):
            return spec

    return SpecConverter()


def _fsync_tree(path: Path) -> None:
    for file in path.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def export_ctranslate2(
    source: str | Path,
    output: str | Path,
    *,
    which: str = "best",
    quantization: Optional[str] = None,
    force: bool = False,
) -> ExportResult:
    """Write the CTranslate2 model of a checkpoint (or a run directory's best / last / averaged one) to ``output``.

    The directory is written beside ``output`` under a temporary name and renamed into place, so an interrupted
    export leaves no half-written model. An existing ``output`` is replaced only with ``force``, and only if it is
    empty or a CTranslate2 model directory.
    """
    _import_ctranslate2()
    from rpr_mt.checkpoint_files import load_checkpoint, model_from_payload, resolve_checkpoint

    if quantization is not None and quantization not in quantization_types():
        raise UserError(f"--quantization must be one of {', '.join(quantization_types())} (got {quantization!r})")
    output = Path(output)
    if output.exists() or output.is_symlink():
        # what it is first: "pass --force" for a path that --force then refuses to replace would mislead
        if not _looks_like_ctranslate2_model(output):
            raise UserError(f"{output} exists and is not a CTranslate2 model directory; refusing to replace it "
                            "(even with --force): give another --output")
        if not force:
            raise UserError(f"{output} already exists; pass --force to replace it")
    ancestor = output.parent  # missing directories are created below it, so it must be one (checked before work)
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"--output {output}: {ancestor} is not a directory")

    resolved = resolve_checkpoint(source, which)
    payload = load_checkpoint(resolved)
    config = config_from_dict(payload["config"], origin=str(resolved))
    reason = unsupported_reason(config.model)  # before building anything
    if reason is not None:
        raise UserError(reason)
    model, vocab = model_from_payload(payload, config, resolved)  # the same checks, errors and casing as translate
    spec = build_spec(model, vocab)

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    except OSError as exc:  # no such parent that can be made, a file in the way, no permission
        raise UserError(f"--output {output}: cannot create it there ({exc.strerror or exc})") from None
    try:
        staged = workdir / "model"
        _spec_converter(spec).convert(str(staged), quantization=quantization)
        (staged / MODEL_FILE).write_bytes(payload["vocab"]["spm_model"].numpy().tobytes())
        if vocab.casing is not None:
            (staged / casing.FILE_NAME).write_text(vocab.casing.to_json(), encoding="utf-8")
        info = {
            "format": EXPORT_FORMAT,
            "checkpoint": str(resolved),
            "step": payload.get("step"),
            "positions": config.model.positions,
            "max_positions": config.model.max_positions,
            "quantization": quantization,
            "sentencepiece_model": MODEL_FILE,
            # translate_lines recases the translations of raw lines with it, as `rpr-mt translate` does
            "casing_model": casing.FILE_NAME if vocab.casing is not None else None,
            "decode": config_to_dict(config.decode),
            "src_lang": config.data.src_lang,  # sentence splitting's rules (ExportedTranslator.translate_lines)
            "tgt_lang": config.data.tgt_lang,
            # trained on Multi30k's tok/ text: translate_lines tokenizes raw-looking input as `rpr-mt translate` does
            "pretokenized": is_pretokenized(config.data),
        }
        (staged / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(staged)
        if output.exists() or output.is_symlink():
            old = workdir / "replaced"
            os.replace(output, old)
            try:
                os.replace(staged, output)
            except BaseException:
                os.replace(old, output)  # put the previous model back
                raise
        else:
            os.replace(staged, output)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return ExportResult(output, resolved, config.model.positions, describe_positions(config.model), quantization)
