"""Typed exceptions of minfer's core. The CLI turns each into one line on stderr and a non-zero exit status.

Core code raises these and never exits the process; only `minfer_cli/console.py` decides how they are shown.
"""


class MinferError(Exception):
    """Base of every error minfer reports to a user as one sentence (no traceback). Exit status 2."""

    exit_code = 2


class UsageError(MinferError):
    """Bad input on the command line: unknown knob, value outside the allowed set, malformed arm, ..."""


class NoGpuError(MinferError):
    """The command needs an NVIDIA GPU and none is usable here. The message names `minfer doctor`."""


class EnvironmentProblem(MinferError):
    """An installed package has a version minfer cannot work with (e.g. numpy >= 2.5 with numba-cuda 0.30)."""


class LedgerError(MinferError):
    """A ledger record could not be written or read (the message names the file and the reason)."""

