"""q2real's own error types: problems it can name for its user in one line.

Bad input (a config key, a spec field, a bundle, a checkpoint, a run directory) and refused checks
subclass `Q2RealError`; the CLI prints those as one line and shows a traceback for anything else,
which is a bug. Each also subclasses the builtin it refines, so `except ValueError` keeps working.
"""

from __future__ import annotations


class Q2RealError(Exception):
    """A problem q2real names for its user: the message says which file, key or topic, and what was expected."""


class MissingDependency(Q2RealError, ImportError):
    """An optional extra a setting needs is not installed; the message names the `pip install`."""


class RunDirError(Q2RealError, FileNotFoundError):
    """A path given as a training run directory is not one (no config.yaml or checkpoint.pt)."""
