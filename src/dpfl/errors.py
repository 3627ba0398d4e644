"""The error that is dpfl's fault, never its user's.

Bad input (a study or data file, a command's options, a Python caller's argument) raises
`ValueError` or one of its subclasses, and the `dpfl` command reports it in one line with
exit status 2. A check that no input can fail (an impossible state; values that only
dpfl's own code assembles, found inconsistent) raises `InternalError` instead: it is no
`ValueError`, so nothing reports it as the user's mistake, and the command reports it as
a bug in dpfl, with its traceback and exit status 70 (`EX_SOFTWARE`).
"""

__all__ = ["InternalError"]


class InternalError(Exception):
    """A check of dpfl's own invariants failed: a bug in dpfl, not bad input."""
