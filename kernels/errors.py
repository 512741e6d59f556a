"""The one exception kernel launchers raise for bad input (kernels never import from `minfer_cli`)."""


class KernelConstraintError(ValueError):
    """A launcher was given inputs it cannot take (wrong dtype, shape, alignment, size); the message says what
    was wrong and what would be right. The CLI reports it as one line, exit status 2."""
