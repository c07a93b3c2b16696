"""Error types, and how a command's end becomes its exit status: every error one line, SIGTERM
unwound as Ctrl-C is (staging dirs removed), a traceback only when asked for."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

EXIT_STATUS = """\
exit status: 0 success, 1 a check or build step failed, 2 bad input (recipe, model, data, paths),
  3 built in part: the steps this machine cannot run (e.g. a GPU engine builder that is not installed)
  are listed with the command that finishes them elsewhere
"""


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so it unwinds as Ctrl-C does."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def one_line(message: str) -> str:
    """``message`` with control characters (a newline in a file name, say) written as escapes, so an
    error is always one line."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)


def exit_status(run: Callable[[], int], debug: bool = False) -> int:
    """Run a command and turn how it ended into its exit status (see :data:`EXIT_STATUS`); errors
    are printed as one ``cosycompile: ...`` line on stderr, with the traceback too under ``debug``."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(run())
    except UserError as exc:
        if debug:
            traceback.print_exc()
        print(f"cosycompile: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BuildFailed as exc:
        print(f"cosycompile: build failed: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`cosycompile cache ls | head`): stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if not exc.filename:
            raise  # not about a path: a bug, shown as one
        # A path the system refuses (a name too long, a loop of links, no permission, a full
        # disk): the file and the reason are the whole story.
        if debug:
            traceback.print_exc()
        print(f"cosycompile: error: {one_line(str(exc.filename))}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        how, status = ("terminated", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        print(f"cosycompile: {how}; finished steps stay cached, the running one was discarded", file=sys.stderr)
        return status
