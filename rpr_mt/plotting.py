"""matplotlib, an optional extra, for every plot that rpr-mt draws (``rpr-mt plot``, the sweep and study figures)."""

from __future__ import annotations

from typing import Any

from rpr_mt.errors import UserError

__all__ = ["pyplot"]


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or a UserError saying how to install it (an optional extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("plots need matplotlib: pip install 'matplotlib>=3.7'") from exc
    return plt
