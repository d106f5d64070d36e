"""The blackboard: records under processing, persisted with SQLAlchemy.

``from blackboard import Blackboard, Path, PathStep, Literal, Annotation``.
See ``Blackboard`` for the API and ``blackboard._model`` for the document form.
"""

from blackboard._blackboard import FRAGMENT_SEPARATOR, Blackboard, default_owner
from blackboard._errors import (
    BlackboardError,
    PathError,
    RecordLockedError,
    RecordNotFoundError,
    StaleRecordError,
    StorageError,
    ValueTypeError,
)
from blackboard._model import FORMAT, Annotation, Literal
from blackboard._path import Path, PathStep
from blackboard._storage import SCHEMA_VERSION, SqlStore, gc_paused
from blackboard._urls import safe_url

__all__ = [
    "Annotation",
    "Blackboard",
    "BlackboardError",
    "FORMAT",
    "FRAGMENT_SEPARATOR",
    "Literal",
    "Path",
    "PathError",
    "PathStep",
    "RecordLockedError",
    "RecordNotFoundError",
    "SCHEMA_VERSION",
    "SqlStore",
    "StaleRecordError",
    "StorageError",
    "ValueTypeError",
    "default_owner",
    "gc_paused",
    "safe_url",
]
