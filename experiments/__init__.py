"""Registered experiments: one file each; every module here calls `minfer_cli.experiment.register` at import."""
