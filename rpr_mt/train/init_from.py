"""``train.init_from``: a new run that starts from another run's weights (fine-tuning)."""

from __future__ import annotations

from typing import Any

import torch

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import ModelConfig
from rpr_mt.errors import UserError
from rpr_mt.model.transformer import Seq2Seq
from rpr_mt.train.context import RunData, Session


# Model settings that change what the weights compute but not their names or shapes: a checkpoint trained under
# another value loads without a complaint from torch and is another model (rope, alibi and none have no position
# weights at all; pre- and post-norm have the same ones). Dropouts, max_positions and a scheme's own settings (a
# longer rope base, a wider t5 max_distance) are what fine-tuning may change.
_SAME_SHAPE_SETTINGS = ("positions", "norm", "absolute_kind")


def _setting_mismatch(saved: dict[str, Any], model_config: ModelConfig) -> str | None:
    for key in _SAME_SHAPE_SETTINGS:
        if key == "absolute_kind" and "absolute" not in model_config.positions:
            continue  # not used by this scheme
        mine = getattr(model_config, key)
        if key in saved and saved[key] != mine:
            return f"model.{key} is {saved[key]} in the checkpoint but {mine} here"
    return None


def init_from(session: Session, data: RunData, model: Seq2Seq, optimizer: torch.optim.Optimizer) -> None:
    """Fine-tuning: a new run starts from the weights of ``train.init_from`` (its own update count, schedule and
    data order start at zero, like fairseq's --finetune-from-model), with fresh Adam moments unless
    ``train.reset_optimizer`` is false."""
    t, vocab_info, data_dir, log, model_config = (session.t, data.vocab_payload, data.directory, session.log,
                                                  session.cfg.model)
    try:
        source = ckpt.resolve_checkpoint(t.init_from, "best")
        state = ckpt.load_checkpoint(source)
    except UserError as exc:
        raise UserError(f"train.init_from: {exc}") from None
    if state["vocab"]["fingerprint"] != vocab_info["fingerprint"]:
        raise UserError(f"train.init_from: {source} was trained with another vocabulary than "
                        f"{data_dir / 'spm.model'}; fine-tuning needs data prepared with the checkpoint's vocabulary")
    problem = _setting_mismatch(state["config"].get("model", {}), model_config) or ckpt.weights_mismatch(
        model, state["model"])
    if problem is not None:
        raise UserError(f"train.init_from: {source} does not fit this model section ({problem})")
    model.load_state_dict(state["model"])
    if not t.reset_optimizer:
        if not state.get("optimizer"):
            raise UserError(f"train.init_from: {source} has no optimizer state (an averaged checkpoint?); "
                            "set train.reset_optimizer=true")
        try:
            optimizer.load_state_dict(state["optimizer"])
        except ValueError as exc:
            raise UserError(f"train.init_from: the optimizer state of {source} does not fit ({exc}); "
                            "set train.reset_optimizer=true") from None
    log(f"initialised from {source} ({ckpt.describe_checkpoint(state)}); "
        f"optimizer {'reset' if t.reset_optimizer else 'state loaded'}; updates and schedule start at 0")
