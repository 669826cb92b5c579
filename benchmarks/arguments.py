"""What every benchmark (and scripts/gpu_check.py) shares on its command line: a parser whose errors are one line,
integer types that refuse sizes and counts below their minimum, and a decorator that reports the project's
``UserError`` as one line. A bad value stops the script before it measures anything, with exit code 2, as
``rpr-mt`` does (rpr_mt/cli.py), not with a traceback minutes later.

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # this file, beside the script
    from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn, TypeVar

from rpr_mt.errors import UserError

F = TypeVar("F", bound=Callable)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with rpr-mt's one-line usage errors: ``error: PROG: MESSAGE (see PROG --help)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def at_least(minimum: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (a size, a count), else a one-line error with the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (got {value})")
        return value

    parse.__name__ = what.split(" ", 1)[-1].replace(" ", "_")  # argparse names the type in some messages
    return parse


positive_int = at_least(1, "a positive integer")
non_negative_int = at_least(0, "a non-negative integer")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):  # NaN fails the comparison too
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (got {text})")
    return value


def probability(text: str) -> float:
    """A dropout rate: in [0, 1), as the config requires (rpr_mt/config.py)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (got {text})")
    return value


def reports_user_errors(main: F) -> F:
    """A script's ``main``, with a ``UserError`` (a bad config, checkpoint or file) reported as ``error: ...`` on
    one line and its exit code (2), as rpr_mt/cli.py's commands do, instead of a traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]
