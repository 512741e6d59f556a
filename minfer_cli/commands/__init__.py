"""Thin command modules: each parses its options, calls the core, and renders through `minfer_cli.console`."""
