"""Helpers for engine tests: paths, workflow snippets, record set-up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from blackboard import Blackboard

REPO = Path(__file__).resolve().parents[2]
SMILA_DIR = REPO / ".." / "shared" / "smila-workflows"
# Chansonnier's SMILA pipelines: fetched from github.com/giorgiosironi/Chansonnier, kept outside
# the repository (one folder per SMILA bundle).
CHANSONNIER_DIR = Path(os.environ.get("CHALK_CHANSONNIER_DIR") or REPO.parent / "corpora" / "chansonnier")
VALID_DIR = REPO / "tests" / "workflows" / "valid"
INVALID_DIR = REPO / "tests" / "workflows" / "invalid"

BPEL_HEADER = (
    '<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable" '
    'xmlns:proc="http://www.eclipse.org/smila/processor" xmlns:rec="http://www.eclipse.org/smila/record">'
)


def pipelet(name: str, cls: str, **params: Any) -> str:
    """XML of an ``invokePipelet`` of a test pipelet in ``tests.engine._pipelets``."""
    conf = "".join(f'<proc:param name="{k}">{v}</proc:param>' for k, v in params.items())
    return (
        f'<extensionActivity><proc:invokePipelet name="{name}">'
        f'<proc:pipelet class="tests.engine._pipelets.{cls}"/>'
        f"<proc:configuration>{conf}</proc:configuration></proc:invokePipelet></extensionActivity>"
    )


def records(bb: Blackboard, spec: dict[str, dict[str, Any]]) -> None:
    """Create records ``id -> attributes`` on ``bb``."""
    for rid, attrs in spec.items():
        bb.create(rid)
        bb.set_attributes(rid, attrs)


def snapshot(bb: Blackboard, ids: list[str] | None = None) -> dict[str, Any]:
    """Every record's attributes on ``bb`` (for comparisons)."""
    return {rid: bb.get_attributes(rid) for rid in sorted(ids if ids is not None else bb.ids())}


def unknown_class_error(error: str) -> bool:
    """Whether a load error is an unmapped pipelet class, service or partner service."""
    return (" unknown pipelet class " in error or " unknown service " in error
            or " unknown partner service " in error)
