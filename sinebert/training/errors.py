"""User-facing failures: one clear sentence, no stack trace from deep inside a library."""

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input or a bad situation the user can fix; the message says what was wrong and what to do."""


class SharedUserError(UserError):
    """A UserError that every process of a multi-process run raises alike, from a decision the main process shared
    with them; only the main process prints it. (Raised by the main process alone, it would leave the others to fail
    in their next collective call with a communication backend's traceback.)"""


def run_cli(main: Callable[[], object]):
    """Run a script's `main`, turning user errors into `error: <sentence>` and exit status 2.

    Set SINEBERT_DEBUG=1 to see the full traceback instead.
    """
    from .checkpoint import CheckpointError

    try:
        main()
    except (UserError, CheckpointError) as error:
        if os.environ.get("SINEBERT_DEBUG"):
            raise
        if not isinstance(error, SharedUserError) or os.environ.get("RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
