"""The pipelet contract.

A pipelet is configured once per worker and then called once per activity per
partition with every record ID that reached that activity.  It reads and
writes records only through the blackboard it is given.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Pipelet", "PipeletConfigurationError"]


class PipeletConfigurationError(ValueError):
    """The configuration given to a pipelet is not usable.

    Raised from :meth:`Pipelet.configure`; the workflow loader reports it with
    the ``file:line`` of the ``invokePipelet`` element.
    """


class Pipelet:
    """Base class of every pipelet.

    Subclasses override :meth:`configure` (read settings, raise
    :class:`PipeletConfigurationError` for bad ones) and :meth:`process`.
    ``process`` returns the IDs that continue in the workflow: usually the
    argument list, plus fragment IDs made with ``blackboard.split``, minus
    records the pipelet filters out.

    A pipelet keeps no global state and starts no SparkSession or broker
    connection: the same object may serve many batches.
    """

    #: Settings a pipelet accepts; ``None`` means "do not check names".
    parameters: ClassVar[frozenset[str] | None] = None

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}

    def configure(self, config: dict[str, Any]) -> None:
        """Take the settings from the workflow file (called once per worker)."""
        if self.parameters is not None:
            unknown = sorted(set(config) - set(self.parameters))
            if unknown:
                raise PipeletConfigurationError(
                    f"{type(self).__name__}: unknown parameter(s) {', '.join(unknown)}; "
                    f"accepted: {', '.join(sorted(self.parameters)) or 'none'}"
                )
        self.config = dict(config)

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        """Work on the records ``ids`` and return the IDs that go on."""
        raise NotImplementedError(f"{type(self).__name__} must implement process()")
