"""Exit codes that mean something (documented in README.md), and the errors that carry them."""
from __future__ import annotations

OK = 0
RUNTIME_ERROR = 1
USAGE = 2            # bad arguments, bad profile, bad RADIANCE_* value
GATE_FAILED = 3
INCOMPATIBLE = 4     # hardware or kernels cannot run this profile
UNREACHABLE = 5      # the endpoint to gate did not answer
INCONCLUSIVE = 6     # a check that verified nothing: `radiance bench`'s lossless check scored no position


class LauncherError(Exception):
    """An error the CLI reports as one line and an exit code (no traceback)."""

    exit_code = RUNTIME_ERROR

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LauncherError):
    exit_code = USAGE
