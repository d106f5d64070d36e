"""Helpers for the ``chalk reprocess`` tests: stored records to choose from, a configuration."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blackboard import Blackboard
from listener_router.reprocess import Runs

LANGS = ("de", "en", "fr")


def store_docs(url: str, count: int = 60, *, langs: tuple[str, ...] = LANGS,
               source: str = "web", every: int = 5, digits: int = 3
               ) -> dict[str, dict[str, Any]]:
    """``doc-NNN`` and ``img-NNN`` records, ``count`` in all: ``lang`` by turn, every
    ``every``-th of ``source``."""
    docs = {f"{kind}-{i:0{digits}d}": {"lang": langs[i % len(langs)],
                                       "source": source if i % every == 0 else None}
            for kind in ("doc", "img") for i in range(count // 2)}
    with Blackboard.connect(url) as bb:
        for rid, values in docs.items():
            bb.create(rid, source=values["source"])
            bb.set_literal(rid, "lang", values["lang"])
        bb.commit_many(list(docs))
    return docs


def write_reprocess_config(path: Path, *, db: str, broker: str, queue: str,
                           workflow: str = "Counting", workflows: str = "workflows") -> Path:
    path.write_text(f'[blackboard]\nurl = "{db}"\n[broker]\nurl = "{broker}"\n'
                    f'[workflows]\ndir = "{workflows}"\n'
                    f'[[listener]]\nname = "main"\nqueue = "{queue}"\nworkflow = "{workflow}"\n')
    return path


@contextlib.contextmanager
def dying_before_the_second_save(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside: a run's second part is confirmed by the broker, and the process "dies"
    (Ctrl-C) before its cursor is saved."""
    advance = Runs.advance
    calls = []

    def dies(self: Runs, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(Runs, "advance", dies)
    try:
        yield
    finally:
        monkeypatch.setattr(Runs, "advance", advance)
