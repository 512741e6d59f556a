"""minfer: a command-line lab for GPU inference kernels (numba.cuda), with an honest A/B harness and a ledger."""

__version__ = "0.1.0"
