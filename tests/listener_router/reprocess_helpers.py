"""Helpers for the ``chalk reprocess`` tests: stored records to choose from, a configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blackboard import Blackboard

LANGS = ("de", "en", "fr")


def store_docs(url: str, count: int = 60) -> dict[str, dict[str, Any]]:
    """``doc-NNN`` and ``img-NNN`` records: ``lang`` by turn, every fifth of source ``web``."""
    docs = {f"{kind}-{i:03d}": {"lang": LANGS[i % 3], "source": "web" if i % 5 == 0 else None}
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
