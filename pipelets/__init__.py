"""Pipelets: the ``Pipelet`` base API and the built-in pipelets."""

from pipelets._base import Pipelet, PipeletConfigurationError, PipeletError
from pipelets.text import Lowercase, NormalizeWhitespace, WordCount

__all__ = [
    "Lowercase",
    "NormalizeWhitespace",
    "Pipelet",
    "PipeletConfigurationError",
    "PipeletError",
    "WordCount",
]
