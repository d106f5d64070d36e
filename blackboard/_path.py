"""Attribute paths: ``"attr[1]/sub/leaf[2]"``.

A path is a list of steps; each step names an attribute and an index into
its values (default 0).  ``PathStep.ATTRIBUTE_ANNOTATION`` (-1) as the index
of the last step addresses the attribute's own annotations.  Whether an index
counts literals or sub-objects depends on the method that takes the path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Union

from blackboard._errors import PathError

__all__ = ["Path", "PathStep", "PathLike"]

_STEP = re.compile(r"^([^\[\]/]+)(?:\[(-?\d+)\])?$")


class PathStep:
    """One step of a path: an attribute name and an index."""

    ATTRIBUTE_ANNOTATION = -1
    __slots__ = ("_name", "_index")

    def __init__(self, name: str, index: int = 0):
        if not isinstance(name, str) or not name or any(c in name for c in "[]/"):
            raise PathError(f"bad attribute name {name!r} in path: names are non-empty "
                            "and contain no '[', ']' or '/'")
        if not isinstance(index, int) or isinstance(index, bool) or index < -1:
            raise PathError(f"bad index {index!r} for attribute {name!r}: use 0, 1, … "
                            "or PathStep.ATTRIBUTE_ANNOTATION (-1)")
        self._name = name
        self._index = index

    @property
    def name(self) -> str:
        return self._name

    @property
    def index(self) -> int:
        return self._index

    @classmethod
    def parse(cls, text: str) -> PathStep:
        match = _STEP.match(text.strip())
        if not match:
            raise PathError(f"bad path step {text!r}: expected 'name' or 'name[index]'")
        return cls(match.group(1), int(match.group(2)) if match.group(2) else 0)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PathStep) and self._name == other._name
                and self._index == other._index)

    def __hash__(self) -> int:
        return hash((self._name, self._index))

    def __str__(self) -> str:
        return self._name if self._index == 0 else f"{self._name}[{self._index}]"

    def __repr__(self) -> str:
        return f"PathStep({self._name!r}, {self._index})"


class Path:
    """A sequence of :class:`PathStep`.

    ``add`` and ``up`` change the path in place and return it (as the seed's
    Java API does); everything else treats it as a value: equality, hashing
    and ``str`` round trip.
    """

    SEPARATOR = "/"
    __slots__ = ("_steps",)

    def __init__(self, path: Union[Path, str, None, list[PathStep]] = None):
        if path is None:
            self._steps: list[PathStep] = []
        elif isinstance(path, Path):
            self._steps = list(path._steps)
        elif isinstance(path, str):
            text = path.strip().strip(self.SEPARATOR)
            self._steps = [PathStep.parse(part) for part in text.split(self.SEPARATOR)] if text else []
            if text and "//" in text:
                raise PathError(f"bad path {path!r}: empty step between '//'")
        elif isinstance(path, list):
            for step in path:
                if not isinstance(step, PathStep):
                    raise PathError(f"bad path step {step!r}: expected a PathStep")
            self._steps = list(path)
        else:
            raise PathError(f"bad path {path!r}: expected a string like 'attr[1]/sub' or a Path")

    def add(self, step: Union[PathStep, str], index: int | None = None) -> Path:
        if isinstance(step, PathStep):
            if index is not None:
                raise PathError("give either a PathStep or a name and an index, not both")
            self._steps.append(step)
        else:
            self._steps.append(PathStep(step, 0 if index is None else index))
        return self

    def up(self) -> Path:
        if not self._steps:
            raise PathError("cannot go up from the empty path")
        self._steps.pop()
        return self

    def is_empty(self) -> bool:
        return not self._steps

    def get(self, position: int) -> PathStep:
        return self._steps[position]

    def name(self, position: int) -> str:
        return self._steps[position].name

    def index(self, position: int) -> int:
        return self._steps[position].index

    @property
    def steps(self) -> tuple[PathStep, ...]:
        return tuple(self._steps)

    @property
    def last(self) -> PathStep:
        if not self._steps:
            raise PathError("the empty path has no last step")
        return self._steps[-1]

    def __iter__(self) -> Iterator[PathStep]:
        return iter(list(self._steps))

    def __len__(self) -> int:
        return len(self._steps)

    def length(self) -> int:
        return len(self._steps)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = Path(other)
        return isinstance(other, Path) and self._steps == other._steps

    def __hash__(self) -> int:
        return hash(tuple(self._steps))

    def __str__(self) -> str:
        return self.SEPARATOR.join(str(step) for step in self._steps)

    def __repr__(self) -> str:
        return f"Path({str(self)!r})"


PathLike = Union[Path, str, None]


def as_path(path: PathLike) -> Path:
    return path if isinstance(path, Path) else Path(path)
