"""Error types that the CLI turns into one-line messages with exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a recipe, a model dir, a data set, a path.

    The CLI prints ``cosycompile: error: <message>`` and exits with status 2, no traceback.
    The message must name the offending file and/or key.
    """


class RecipeError(UserError):
    """A recipe that cannot be parsed or validated."""


class ModelError(UserError):
    """A model dir or checkpoint that cannot be read or does not match the network."""


class DataError(UserError):
    """A calibration or evaluation set that is missing, empty or unreadable."""


class BackendUnavailable(UserError):
    """A backend whose runtime is not installed on this machine, or that cannot run the request."""


class BuildFailed(Exception):
    """A step that failed where the CLI cannot show its traceback (a cluster node): one line, exit 1."""
