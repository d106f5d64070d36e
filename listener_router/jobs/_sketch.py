"""A mergeable histogram of durations: p50 and p99 that stay right when summed.

Statistics are kept per interval and per member, and read back summed over
intervals and members (after restarts, across a cluster).  Percentiles of
percentiles are wrong; a histogram with fixed buckets is not: adding two
histograms bucket by bucket gives exactly the histogram of all the samples.
The buckets are logarithmic (the DDSketch layout): bucket ``i`` holds values
in ``(γ^(i-1), γ^i]`` with ``γ = (1 + α) / (1 - α)``, so any quantile read
back is within a relative error ``α`` (1 %) of a true sample value, whatever
the range, and a histogram of seconds from a microsecond to a day needs at
most ~1,300 buckets (a few dozen in practice; only used ones are stored).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import orjson

__all__ = ["ACCURACY", "Sketch", "merged"]

ACCURACY = 0.01
_GAMMA = (1 + ACCURACY) / (1 - ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_SMALLEST = 1e-6          # seconds; anything at or below counts as this (bucket "z")


class Sketch:
    """Counts of values in logarithmic buckets (see module doc); ``merge`` adds two."""

    __slots__ = ("buckets", "zero", "count", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.zero = 0
        self.count = 0
        self.total = 0.0

    def add(self, value: float, n: int = 1) -> None:
        """Count ``value`` (seconds) ``n`` times."""
        self.count += n
        self.total += value * n
        if value <= _SMALLEST:
            self.zero += n
            return
        index = math.ceil(math.log(value) / _LOG_GAMMA)
        self.buckets[index] = self.buckets.get(index, 0) + n

    def add_many(self, values: Iterable[float]) -> None:
        """Count each of ``values`` once (the same as :meth:`add` for each, faster)."""
        buckets, log, ceil, scale = self.buckets, math.log, math.ceil, 1.0 / _LOG_GAMMA
        count, total, zero = 0, 0.0, 0
        for value in values:
            count += 1
            total += value
            if value <= _SMALLEST:
                zero += 1
                continue
            index = ceil(log(value) * scale)
            buckets[index] = buckets.get(index, 0) + 1
        self.count += count
        self.total += total
        self.zero += zero

    def merge(self, other: Sketch) -> Sketch:
        """Add ``other``'s counts to this one (in place); returns self."""
        self.count += other.count
        self.total += other.total
        self.zero += other.zero
        buckets = self.buckets
        for index, n in other.buckets.items():
            buckets[index] = buckets.get(index, 0) + n
        return self

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile by nearest rank: the smallest sample (within the accuracy) that
        at least a fraction ``q`` of the samples do not exceed (None: no samples).

        Nearest rank, not the lower neighbour of ``q * (count - 1)``: p99 of 2 to 100
        samples is their largest, so one slow batch among a few fast ones shows in p99.
        """
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count - 1e-9))   # 1-based
        seen = self.zero
        if rank <= seen:
            return 0.0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if rank <= seen:
                return 2 * _GAMMA ** index / (_GAMMA + 1)
        return 2 * _GAMMA ** max(self.buckets) / (_GAMMA + 1)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    # -- stored form ------------------------------------------------------------------
    def dumps(self) -> str:
        """JSON: ``{"z": zero count, "b": {bucket: count}}`` (count and total are columns)."""
        return orjson.dumps({"z": self.zero, "b": {str(i): n for i, n in self.buckets.items()}}
                            ).decode()

    @classmethod
    def loads(cls, text: str | None, count: int = 0, total: float = 0.0) -> Sketch:
        sketch = cls()
        if text:
            data = orjson.loads(text)
            sketch.zero = int(data.get("z", 0))
            sketch.buckets = {int(i): int(n) for i, n in data.get("b", {}).items()}
        sketch.count = count
        sketch.total = total
        return sketch

    @classmethod
    def of(cls, values: Iterable[float]) -> Sketch:
        sketch = cls()
        for value in values:
            sketch.add(value)
        return sketch

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Sketch) and self.zero == other.zero
                and self.count == other.count and self.buckets == other.buckets
                and math.isclose(self.total, other.total, rel_tol=1e-9, abs_tol=1e-9))

    def __repr__(self) -> str:
        return f"Sketch(count={self.count}, p50={self.quantile(0.5)}, p99={self.quantile(0.99)})"


def merged(sketches: Iterable[Sketch]) -> Sketch:
    """One sketch of all the given ones' samples."""
    out = Sketch()
    for sketch in sketches:
        out.merge(sketch)
    return out
