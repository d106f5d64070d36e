"""Attribute paths: ``"attr[1]/sub/leaf[2]"``.

A path is a list of steps; each step names an attribute and an index into
its values (default 0).  ``PathStep.ATTRIBUTE_ANNOTATION`` (-1) as the index
of the last step addresses the attribute's own annotations.  Whether an index
counts literals or sub-objects depends on the method that takes the path.

``Path`` follows the seed's Java class: ``add`` and ``up`` change the path in
place and return it.  It is also a value (equality, hashing, ``str`` round
trip), so do not change a path while it is a dict key.  The blackboard
methods take a ``Path`` or its string form; parsed strings are cached.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Union

from blackboard._errors import PathError

__all__ = ["Path", "PathStep", "PathLike", "as_path", "path_steps"]

_STEP = re.compile(r"([^\[\]/]+?)(?:\[(-?\d+)\])?")
_BAD_NAME_CHARS = frozenset("[]/")


class PathStep:
    """One step of a path: an attribute name and an index (default 0)."""

    ATTRIBUTE_ANNOTATION = -1
    __slots__ = ("_name", "_index")

    def __init__(self, name: str, index: int = 0):
        if (not isinstance(name, str) or not name or name != name.strip()
                or not _BAD_NAME_CHARS.isdisjoint(name)):
            raise PathError(f"bad attribute name {name!r} in path: names are non-empty, "
                            "without surrounding spaces, and contain no '[', ']' or '/'")
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

    # The seed's getters.
    def get_name(self) -> str:
        return self._name

    def get_index(self) -> int:
        return self._index

    @classmethod
    def parse(cls, text: str) -> PathStep:
        """``"name"`` or ``"name[index]"`` → a step."""
        match = _STEP.fullmatch(text.strip()) if isinstance(text, str) else None
        if not match:
            raise PathError(f"bad path step {text!r}: expected 'name' or 'name[index]'")
        return cls(match.group(1).strip(), int(match.group(2)) if match.group(2) else 0)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PathStep):
            return NotImplemented
        return self._name == other._name and self._index == other._index

    def __hash__(self) -> int:
        return hash((self._name, self._index))

    def __str__(self) -> str:
        return self._name if self._index == 0 else f"{self._name}[{self._index}]"

    def __repr__(self) -> str:
        return f"PathStep({self._name!r}, {self._index})"


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[PathStep, ...]:
    stripped = text.strip()
    if stripped.startswith(Path.SEPARATOR):
        stripped = stripped[1:]
    if stripped.endswith(Path.SEPARATOR):
        stripped = stripped[:-1]
    if not stripped:
        return ()
    parts = stripped.split(Path.SEPARATOR)
    if any(not part.strip() for part in parts):
        raise PathError(f"bad path {text!r}: empty step (two '/' in a row)")
    try:
        return tuple(PathStep.parse(part) for part in parts)
    except PathError as e:
        raise PathError(f"bad path {text!r}: {e}") from None


class Path:
    """A sequence of :class:`PathStep`; see the module docstring."""

    SEPARATOR = "/"
    __slots__ = ("_steps",)

    def __init__(self, path: Union[Path, str, Iterable[PathStep], None] = None):
        if path is None:
            self._steps: list[PathStep] = []
        elif isinstance(path, Path):
            self._steps = list(path._steps)
        elif isinstance(path, str):
            self._steps = list(_parse(path))
        elif isinstance(path, PathStep):
            self._steps = [path]
        elif isinstance(path, (list, tuple)):
            for step in path:
                if not isinstance(step, PathStep):
                    raise PathError(f"bad path step {step!r}: expected a PathStep")
            self._steps = list(path)
        else:
            raise PathError(f"bad path {path!r}: expected a string like 'attr[1]/sub', "
                            "a Path or a list of PathSteps")

    def add(self, step: Union[PathStep, str], index: int | None = None) -> Path:
        """Append a step (a PathStep, or a name and optional index); return this path."""
        if isinstance(step, PathStep):
            if index is not None:
                raise PathError("give either a PathStep or a name and an index, not both")
            self._steps.append(step)
        else:
            self._steps.append(PathStep(step, 0 if index is None else index))
        return self

    def up(self) -> Path:
        """Remove the last step; return this path."""
        if not self._steps:
            raise PathError("cannot go up from the empty path")
        self._steps.pop()
        return self

    def copy(self) -> Path:
        return Path(self)

    def child(self, name: str, index: int = 0) -> Path:
        """A new path one step longer (this one is unchanged)."""
        return Path(self).add(name, index)

    def parent(self) -> Path:
        """A new path one step shorter (this one is unchanged)."""
        return Path(self).up()

    def is_empty(self) -> bool:
        return not self._steps

    def _at(self, position: int) -> PathStep:
        try:
            return self._steps[position]
        except (IndexError, TypeError):
            raise PathError(f"path {str(self)!r} has no step {position!r} "
                            f"(length {len(self._steps)})") from None

    def get(self, position: int) -> PathStep:
        return self._at(position)

    def name(self, position: int) -> str:
        return self._at(position).name

    def index(self, position: int) -> int:
        return self._at(position).index

    get_name = name
    get_index = index

    @property
    def steps(self) -> tuple[PathStep, ...]:
        return tuple(self._steps)

    @property
    def last(self) -> PathStep:
        if not self._steps:
            raise PathError("the empty path has no last step")
        return self._steps[-1]

    def __getitem__(self, position: int) -> PathStep:
        return self._at(position)

    def __iter__(self) -> Iterator[PathStep]:
        return iter(tuple(self._steps))

    def __len__(self) -> int:
        return len(self._steps)

    def length(self) -> int:
        return len(self._steps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Path):
            return NotImplemented
        return self._steps == other._steps

    def __hash__(self) -> int:
        return hash(tuple(self._steps))

    def __str__(self) -> str:
        return self.SEPARATOR.join(str(step) for step in self._steps)

    def __repr__(self) -> str:
        return f"Path({str(self)!r})"


PathLike = Union[Path, str, None]


# path text -> top_level_step(text), a few hundred at most: the getters and setters look a
# path up here first (``TOP_LEVEL.get(path) or top_level_step(path)``)
TOP_LEVEL: dict[str, tuple[str, int] | None] = {}


def top_level_step(text: str) -> tuple[str, int] | None:
    """``(name, index)`` when ``text`` is one step with an index >= 0, else None (also when bad)."""
    try:
        return TOP_LEVEL[text]
    except KeyError:
        pass
    try:
        steps = _parse(text)
    except PathError:
        found = None
    else:
        found = (steps[0].name, steps[0].index) if len(steps) == 1 and steps[0].index >= 0 \
            else None
    if len(TOP_LEVEL) < 4096:
        TOP_LEVEL[text] = found
    return found


def as_path(path: PathLike) -> Path:
    return path if isinstance(path, Path) else Path(path)


def path_steps(path: PathLike) -> tuple[PathStep, ...]:
    """The steps of a path or path string (strings parsed once and cached)."""
    if isinstance(path, str):
        return _parse(path)
    if path is None:
        return ()
    if isinstance(path, Path):
        return tuple(path._steps)
    raise PathError(f"bad path {path!r}: expected a string like 'attr[1]/sub' or a Path")
