"""The reprocess panel: ``chalk reprocess`` runs with their progress, and what the service
committed of each (a panel of its own: its data function and its template)."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router.reprocess import RunView, run_views
from listener_router.store import ServiceStore

__all__ = ["REPROCESS_HTML", "ReprocessPanel", "reprocess_runs"]

SHOWN = 10   # the newest runs on the page


@dataclass(frozen=True)
class ReprocessPanel:
    runs: list[RunView]
    error: str = ""


def reprocess_runs(store: ServiceStore, limit: int = SHOWN) -> ReprocessPanel:
    """The newest runs (the page says so when the store cannot be read)."""
    try:
        return ReprocessPanel(run_views(store, limit))
    except Exception as e:  # the database is down: say so on the page
        return ReprocessPanel([], f"reprocess runs unavailable: {type(e).__name__}: {e}")


REPROCESS_HTML = """{% if p.error %}<p class="error">{{ p.error }}</p>
{% elif not p.runs %}<p class="muted">no reprocess runs (<code>chalk reprocess</code>)</p>
{% else %}<table id="reprocess-table"><tr><th>run</th><th>state</th><th>workflow</th>
<th>queue</th><th>selection</th><th>looked at</th><th>published</th><th>committed</th>
<th>started</th><th>updated</th></tr>
{% for r in p.runs %}<tr data-run="{{ r.run }}" data-state="{{ r.state }}"><td><code>{{ r.run }}</code></td>
<td>{{ r.state }}{% if r.note %} <span class="muted">({{ r.note }})</span>{% endif %}</td>
<td>{{ r.workflow }}</td><td><code>{{ r.queue }}</code></td><td>{{ r.selection }}</td>
<td><progress max="1" value="{{ r.done }}"></progress> {{ r.looked | count }} / {{ r.total | count }}</td>
<td class="num published">{{ r.published | count }}</td><td class="num committed">{{ r.committed | count }}</td>
<td>{{ r.started_at | clock }}</td><td>{{ r.updated_at | clock }}</td></tr>{% endfor %}</table>
{% endif %}
"""
