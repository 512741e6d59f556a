"""`python -m minfer_cli` runs the same app as the `minfer` console script."""

from minfer_cli.main import cli

cli()
