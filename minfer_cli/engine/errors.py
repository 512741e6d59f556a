"""The engine's error type: bad model files and model descriptions, reported as one sentence."""

from __future__ import annotations

from minfer_cli.errors import MinferError


class ModelError(MinferError):
    """A model file or description minfer cannot use: not a GGUF file, a truncated one, an unsupported
    architecture or tensor type, a missing tensor or metadata key. The message names the file, tensor or key."""
