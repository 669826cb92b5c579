"""Reading a run's ``metrics.jsonl``: the one reader that `rpr-mt plot`, the sweep tables and the scripts share.

The trainer appends one JSON record a line. A run killed while it wrote a line leaves that last line cut off: it is
skipped, with one warning, since every record before it is whole. A bad line anywhere else is corruption and a
``UserError`` naming the file and line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rpr_mt.errors import UserError

__all__ = ["METRICS_FILE", "read_records"]

METRICS_FILE = "metrics.jsonl"

log = logging.getLogger(__name__)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of the JSON-lines file ``path`` in file order (blank lines skipped); each must be an object with
    an integer ``step``. A bad last line is taken for a cut-off write and skipped with a warning; a bad line before
    it is a ``UserError``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    numbered = [(number, raw) for number, raw in enumerate(data.split(b"\n"), 1) if raw.strip()]
    records: list[dict[str, Any]] = []
    for index, (number, raw) in enumerate(numbered):
        problem = None
        try:
            record = json.loads(raw.decode("utf-8"))
            int(record["step"])
        except UnicodeDecodeError as exc:
            problem = f"line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start})"
        except (ValueError, KeyError, TypeError):
            problem = f"line {number} is not a metrics record"
        if problem is None:
            records.append(record)
        elif index == len(numbered) - 1:  # what a kill during the last write leaves; everything before it is whole
            log.warning(f"warning: {path}: {problem}: skipped it as cut off (the run was stopped while writing it?)")
        else:
            raise UserError(f"{path}: {problem}")
    return records
