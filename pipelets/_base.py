"""The pipelet contract.

A pipelet is configured once per worker and then called once per activity per
partition with every record ID that reached that activity.  It reads and
writes records only through the blackboard it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from blackboard import Blackboard

__all__ = ["Pipelet", "PipeletConfigurationError", "PipeletError"]


class PipeletConfigurationError(ValueError):
    """The configuration given to a pipelet is not usable.

    Raised from :meth:`Pipelet.configure`; the workflow loader reports it with
    the ``file:line`` of the ``invokePipelet`` element.
    """


class PipeletError(Exception):
    """A pipelet failed on one record (its data is bad, or a step failed).

    ``record_id`` names the record; the engine fails that record's workflow
    instance only (a ``pipeletError`` fault) and lets the rest of the batch go on.
    """

    def __init__(self, message: str, *, record_id: str | None = None,
                 pipelet: str | None = None):
        super().__init__(message)
        self.record_id = record_id
        self.pipelet = pipelet


class Pipelet:
    """Base class of every pipelet.

    Subclasses override :meth:`configure` (read settings, raise
    :class:`PipeletConfigurationError` for bad ones) and either
    :meth:`process_record` (work on one record; the base :meth:`process`
    calls it for each, naming the record in any failure) or :meth:`process`
    (work on the whole batch at once).  ``process`` returns the IDs that
    continue in the workflow: usually the argument list, plus fragment IDs
    made with ``blackboard.split``, minus records the pipelet filters out.

    A pipelet keeps no global state and starts no SparkSession or broker
    connection: the same object may serve many batches.
    """

    #: Settings a pipelet accepts; ``None`` means "do not check names".
    parameters: ClassVar[frozenset[str] | None] = None

    #: True: small batches of a workflow made only of such pipelets may run in
    #: the service's own process instead of on Spark (saving the round trip to
    #: Spark's warm workers, or a job's fixed cost where those are off).  Declare it only when the pipelet
    #: cannot crash the interpreter, hang, or wait on anything outside it (its
    #: time grows with its input alone) and loads no large data: Spark's
    #: workers would isolate those failures, the service's process cannot.
    #: A message delivered again always runs on Spark.  The built-ins set it,
    #: except those that run a pattern, stylesheet or file the configuration
    #: names (a regular expression can take exponential time).
    runs_in_service: ClassVar[bool] = False

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}

    def configure(self, config: dict[str, Any]) -> None:
        """Take the settings from the workflow file (called once per worker)."""
        if not isinstance(config, dict):
            raise PipeletConfigurationError(
                f"{type(self).__name__}: configuration must be a mapping of parameter names "
                f"to values, got {type(config).__name__}")
        if self.parameters is not None:
            unknown = sorted(set(config) - set(self.parameters))
            if unknown:
                raise PipeletConfigurationError(
                    f"{type(self).__name__}: unknown parameter(s) {', '.join(unknown)}; "
                    f"accepted: {', '.join(sorted(self.parameters)) or 'none'}"
                )
        self.config = dict(config)

    def process(self, blackboard: Blackboard, ids: list[str]) -> list[str]:
        """Work on the records ``ids`` and return the IDs that go on.

        The base calls :meth:`process_record` for each ID inside
        ``self.record(id)`` (a failure names its record and fails only its
        workflow instance) and returns ``ids`` unless a record said otherwise.
        Override it to work on the whole batch at once.
        """
        going: list[str] | None = None
        one = self.process_record
        for position, rid in enumerate(ids):
            try:  # self.record(rid)'s work, without a context manager per record
                instead = one(blackboard, rid)
            except Exception as e:
                raise self._record_error(rid, e)  # noqa: B904 (the cause is set there)
            if instead is not None:
                if going is None:
                    going = ids[:position]
                going.extend(instead)
            elif going is not None:
                going.append(rid)
        return ids if going is None else going

    def process_record(self, blackboard: Blackboard, record_id: str) -> list[str] | None:
        """Work on one record; return None to let it go on unchanged, or the IDs that go
        on in its place (``[]`` filters it out; fragments made with ``blackboard.split``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_record() or process()")

    # -- the DataFrame form (optional; see pipelets._frames) ------------------------
    def frame_io(self) -> Any:
        """What the DataFrame form of this configuration touches (a ``FrameIO``), or None.

        None (the default) means no DataFrame form: the engine calls
        ``process``.  A form must compute exactly what ``process`` does for
        records whose touched attributes are absent or hold one plain,
        portable string (``pipelets._frames``); the engine sends only such
        records to it.
        """
        return None

    def transform(self, frame: Any) -> Any:
        """The DataFrame form: ``frame`` with the ``frame_io().writes`` columns computed.

        ``frame`` is a Spark DataFrame with one row per record, a
        ``_record_id`` column and one column per attribute the form touches (a string, or
        null when the record lacks the attribute).  Return it with the
        written columns replaced or added (``withColumn``); keep the rows.
        """
        raise NotImplementedError(f"{type(self).__name__} has no DataFrame form")

    @contextmanager
    def record(self, record_id: str) -> Iterator[None]:
        """Work on one record: any exception becomes a :class:`PipeletError` naming it.

        ``with self.record(rid): ...`` inside ``process`` so that a failure
        says which pipelet and which record, and keeps the original cause.
        """
        try:
            yield
        except Exception as e:
            raise self._record_error(record_id, e)  # noqa: B904 (the cause is set there)

    def _record_error(self, record_id: str, e: Exception) -> Exception:
        """What a failure on ``record_id`` raises: a :class:`PipeletError` naming it, caused by ``e``."""
        if isinstance(e, PipeletError):
            if e.record_id is None:
                e.record_id = record_id
            return e
        name = type(self).__name__
        text = str(e)
        if repr(record_id) not in text:
            text = f"record {record_id!r}: {text}"
        error = PipeletError(f"{name}: {text}", record_id=record_id, pipelet=name)
        error.__cause__ = e  # as ``raise error from e``
        return error
