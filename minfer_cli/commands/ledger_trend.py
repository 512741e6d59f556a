"""`minfer ledger trend`: not built in this commit (the next one adds it)."""

from minfer_cli.errors import UsageError


def trend() -> None:
    """Not built yet: says so plainly."""
    raise UsageError("minfer ledger trend is not built yet")
