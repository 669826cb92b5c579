"""The one error type users see.

Anything raised as ``UserError`` is a problem with the user's input (a config key, a file, a checkpoint), not a
bug: the CLI prints its message on one line of stderr and exits with code 2, without a traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line and exit code 2."""

    exit_code = 2
