"""Pipelets: the ``Pipelet`` base API and the built-in pipelets."""

from pipelets._base import Pipelet, PipeletConfigurationError

__all__ = ["Pipelet", "PipeletConfigurationError"]
