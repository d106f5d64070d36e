"""The page's HTML: one Jinja template per panel and the page around them.

Everything is escaped (autoescape); the SVG pictures are made by
``_svg`` from escaped text and marked safe there.  The page's only script
re-fetches each panel from ``/panel/<name>`` every few seconds (with the
page's query string: its filters), leaves a panel alone while something in
it has the focus, and puts the token typed into the header into the form a
control posts; it loads nothing from anywhere else.  The operator's panels
and the pages of one record or dead letter are in ``_templates``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from jinja2 import DictLoader, Environment, select_autoescape

from listener_router.schedules import tick_label
from listener_router.watch._login import LOGIN_SCRIPT, LOGIN_TEMPLATES
from listener_router.watch._reprocess import REPROCESS_HTML
from listener_router.watch._templates import TEMPLATES

__all__ = ["LATER", "PANELS", "SCRIPTS", "render"]

# panel → seconds between refreshes on the page
PANELS = {"topology": 5, "lanes": 2, "queues": 5, "stats": 10, "batches": 5, "jobs": 5,
          "cancellations": 10, "dead_letters": 15, "schedules": 10, "journal": 30, "events": 3,
          "workflows": 30, "reprocess": 5}
# panels that take a while (they read streams): the page comes without them, the script
# fetches them at once
LATER = frozenset({"journal"})

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
header { display: flex; gap: 1.5em; align-items: baseline; border-bottom: 2px solid #345; }
header h1 { margin: .4em 0; color: #345; }
header h1 a { color: inherit; text-decoration: none; }
section { margin-top: 1.2em; }
h2 { font-size: 1.15em; margin: .3em 0; color: #345; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.notice { background: #e8f5e9; border: 1px solid #8c8; padding: .4em .8em; }
.refused { background: #fdecea; border: 1px solid #d88; padding: .4em .8em; }
.muted { color: #777; }
.error { color: #a22; }
.wfs { display: flex; flex-wrap: wrap; gap: .8em; align-items: flex-start; }
.wf { border: 1px solid #ddd; padding: .3em .8em; flex: 0 1 380px; }
.wf h3 { font-size: 1em; margin: .3em 0; }
.svgbox { overflow: auto; max-height: 80vh; }
.svgbox svg { max-width: 100%; height: auto; }
svg text.axis, svg text.legend { font: 10px sans-serif; fill: #555; }
svg text.node { font: 11px sans-serif; } svg text.edge { font: 10px sans-serif; }
code { font-size: 12px; }
tr.under td:first-child { padding-left: 1.6em; }
button.fold { font-size: 11px; padding: 0 .4em; }
header label { margin-left: auto; font-size: 13px; }
form.guarded, form.inline { display: inline; }
td.act { white-space: nowrap; }
form.controls { margin: .4em 0; } form.controls input { margin-right: .4em; }
pre { background: #f6f8fa; padding: .4em .6em; overflow: auto; max-height: 60vh; font-size: 12px;
      white-space: pre-wrap; overflow-wrap: anywhere; }
a.current { font-weight: bold; color: #222; text-decoration: none; }
h3 { font-size: 1em; margin: .6em 0 .2em; }
/* the page fits 1280 px: charts shrink with their column (they scale, viewBox) */
svg.chart { width: 100%; min-width: 200px; max-width: 320px; height: auto; }
td.charts svg.chart { display: block; }
#stats-table, #queue-table { width: 100%; }
/* a path in a reason or an error breaks, not the page */
td.reason, td.error { overflow-wrap: anywhere; min-width: 12em; }
td.num, td.act, td.when { white-space: nowrap; }
"""

_SCRIPT = """
(function () {
  // the token kept for this tab: the controls post it, reads send it when they need one
  function stored() { try { return sessionStorage.getItem('chalk-token') || ''; } catch (e) { return ''; } }
  function keep(value) { try { sessionStorage.setItem('chalk-token', value); } catch (e) {} }
  function auth(value) { return value ? {Authorization: 'Bearer ' + value} : {}; }
  function start() {
  var unfolded = new Set();   // inputs whose dead-letter and retry queues are shown
  var token = document.getElementById('token') || {value: ''};
  token.value = stored();
  function folds(root) {
    root.querySelectorAll('tr[data-under]').forEach(function (tr) {
      tr.hidden = !unfolded.has(tr.dataset.under);
    });
    root.querySelectorAll('button[data-fold]').forEach(function (b) {
      var open = unfolded.has(b.dataset.fold);
      b.setAttribute('aria-expanded', String(open));
      b.textContent = (open ? '\u25BE ' : '\u25B8 ') + b.dataset.label;
    });
  }
  document.addEventListener('click', function (e) {
    var b = e.target.closest && e.target.closest('button[data-fold]');
    if (!b) { return; }
    if (unfolded.has(b.dataset.fold)) { unfolded.delete(b.dataset.fold); }
    else { unfolded.add(b.dataset.fold); }
    folds(document);
  });
  // a control posts the token typed into the header (kept for this tab only)
  document.addEventListener('submit', function (e) {
    var form = e.target;
    if (!form.classList || !form.classList.contains('guarded')) { return; }
    keep(token.value);
    form.querySelectorAll('input[name=token]').forEach(function (i) { i.value = token.value; });
  }, true);
  // a download behind the token: fetched with it, saved from memory
  document.addEventListener('click', function (e) {
    var a = e.target.closest && e.target.closest('a[data-download]');
    if (!a) { return; }
    e.preventDefault();
    var note = document.getElementById('download-note') || {};
    var value = token.value || stored();
    if (value) { keep(value); }
    fetch(a.href, {cache: 'no-store', headers: auth(value)}).then(function (r) {
      return r.ok ? r.blob() : r.text().then(function (t) { throw new Error(t); });
    }).then(function (blob) {
      var save = document.createElement('a');
      save.href = URL.createObjectURL(blob);
      save.download = a.dataset.download;
      document.body.appendChild(save);
      save.click();
      save.remove();
      note.textContent = '';
    }).catch(function (err) { note.textContent = String(err.message || err); });
  });
  document.querySelectorAll('[data-panel]').forEach(function (el) {
    var every = 1000 * Number(el.dataset.every || 5);
    function refresh() {
      if (el.contains(document.activeElement) && document.activeElement !== document.body) {
        setTimeout(refresh, every);   // someone is typing in it: later
        return;
      }
      fetch('/panel/' + el.dataset.panel + location.search,
            {cache: 'no-store', headers: auth(stored())}).then(function (r) {
        return r.ok ? r.text() : null;
      }).then(function (text) {
        if (text !== null) { el.innerHTML = text; folds(el); el.dataset.updated = String(Date.now()); }
      }).catch(function () {}).then(function () { setTimeout(refresh, every); });
    }
    setTimeout(refresh, el.dataset.later ? 0 : every);
  });
  }
  window.chalkStart = start;        // the login form's script starts it on the page it fetched
  if (!document.getElementById('chalk-login')) { start(); }
})();
"""

_TEMPLATES = {
    "page.html": """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Chalk · {{ node }}</title><style>{{ style | safe }}</style></head>
<body>
<header><h1>Chalk</h1><span>node <b>{{ node }}</b></span>
<span class="muted"><a href="/metrics">metrics</a></span>
<label title="[http] token: the controls (pause, resume, cancel, replay) need it">operator token
<input type="password" id="token" autocomplete="off" size="16"></label></header>
{% if notice %}<p class="notice" id="notice">{{ notice }}</p>{% endif %}
{% macro panel(name, title, id) %}<section id="{{ id }}"><h2>{{ title }}</h2>{{ caller() if caller else "" }}
<div data-panel="{{ name }}" data-every="{{ every[name] }}"{% if name in later %} data-later="1"{% endif %}>
{{- panels[name] | safe if name in panels else '<p class="muted">loading…</p>' | safe }}</div></section>{% endmacro %}
{{ panel("topology", "Topology", "topology") }}
{{ panel("lanes", "Lanes", "lanes") }}
{{ panel("queues", "Queues", "queues") }}
{{ panel("stats", "Throughput and latency", "stats") }}
{{ panel("batches", "Recent batches", "batches") }}
{% call panel("jobs", "Job log", "jobs") %}<form method="get" action="/#jobs" id="job-search" class="controls">
<input name="record" value="{{ jq.record }}" placeholder="record ID" aria-label="record ID" size="14">
<select name="state" aria-label="step"><option value="">any step</option>
{% for s in states %}<option{% if s == jq.state %} selected{% endif %}>{{ s }}</option>{% endfor %}</select>
<select name="queue" aria-label="queue"><option value="">any queue</option>
{% for q in queues %}<option{% if q == jq.queue %} selected{% endif %}>{{ q }}</option>{% endfor %}</select>
<select name="workflow" aria-label="workflow"><option value="">any workflow</option>
{% for w in workflows %}<option{% if w == jq.workflow %} selected{% endif %}>{{ w }}</option>{% endfor %}</select>
<select name="since" aria-label="since"><option value="">any time</option>
{% for s in since %}<option value="{{ s }}"{% if s == jq.since %} selected{% endif %}>last {{ s }}</option>{% endfor %}</select>
<button type="submit">Search</button>{% if jq.filtered %} <a href="/#jobs">all</a>{% endif %}</form>{% endcall %}
{% call panel("cancellations", "Cancellations", "cancel") %}<form method="post" action="/cancel" class="guarded controls" id="cancel-form">
<input type="hidden" name="token" value="">
<input name="messages" placeholder="message IDs" aria-label="message IDs" size="24">
<input name="record" placeholder="or a record ID" aria-label="record ID" size="14">
<input name="for" placeholder="for (2h)" aria-label="for how long" size="6">
<input name="schedule" placeholder="or a schedule" aria-label="schedule" size="10">
<input name="tick" placeholder="and its tick" aria-label="tick" size="18">
<button type="submit">Cancel</button></form>
<p class="muted">a message not yet run is acked without running; one in flight ends before its next pipelet call, and nothing of it is committed</p>{% endcall %}
{% call panel("dead_letters", "Dead letters", "dead-letters") %}{% endcall %}
{{ panel("schedules", "Schedules", "schedules") }}
{{ panel("journal", "Journal subscribers", "journal") }}
{{ panel("events", "Events", "events") }}
{{ panel("workflows", "Workflows", "workflows") }}
{{ panel("reprocess", "Reprocess runs", "reprocess") }}
<script>{{ script | safe }}</script>
</body></html>
""",
    "topology.html": """<p>leader <b class="leader">{{ t.leader or "none" }}</b>
{%- if t.is_leader %} (this node){% endif %} · up {{ uptime | duration }} ·
{% for key, n in counts %}{{ key }} {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}</p>
{% if t.members %}<table id="members"><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for m in t.members %}<tr{% if m.name == t.node %} class="me"{% endif %}>
{% for c in columns %}<td>{{ m.get(c) | field(c) }}</td>{% endfor %}</tr>{% endfor %}</table>
{% else %}<p class="muted">no live members in the store</p>{% endif %}
""",
    "queues.html": """{% if not rows %}<p class="muted">no queues</p>{% else %}
<table id="queue-table"><tr><th>queue</th><th>role</th><th>depth</th><th>consumers</th>
<th>in/s</th><th>out/s</th><th>last hour</th></tr>
{% for q in rows %}{% set folded = rows | selectattr("under", "equalto", q.name) | list %}
<tr data-queue="{{ q.name }}"{% if q.under %} data-under="{{ q.under }}" class="under" hidden{% endif %}>
<td><code>{{ q.name }}</code>{% if folded %} <button type="button" class="fold"
 data-fold="{{ q.name }}" data-label="{{ folded | length }} more" aria-expanded="false"
 title="its dead-letter and retry queues">▸ {{ folded | length }} more</button>{% endif %}</td>
<td>{{ q.role }}{% if q.waiting %} <span class="error">· {{ q.waiting }} dead letter(s)</span>{% endif %}</td>
<td class="num depth">{{ q.depth | count }}</td><td class="num">{{ q.consumers | count }}</td>
<td class="num">{{ q.in_rate | rate }}</td><td class="num">{{ q.out_rate | rate }}</td>
<td>{{ q.chart | safe }}</td></tr>{% endfor %}</table>
<p class="muted">each input's dead-letter and retry queues fold under it;
depths sampled from the broker every {{ every }} s{% if not broker_up %};
<span class="error">broker unreachable at the last sample</span>{% endif %}</p>{% endif %}
""",
    "batches.html": """{% if not batches %}<p class="muted">no batch finished yet</p>{% else %}
<table id="batch-table"><tr><th>finished</th>
<th title="messages in the batch, and the most the batch sizing let it take then">messages</th>
<th>states</th><th>records</th>
<th title="messages the router rules sent on">routed</th>
<th title="events published with the batch (record.committed, record.invalidated, message.dead_lettered)">events</th>
<th>gather</th><th>load</th><th>run</th><th>commit</th><th>publish</th>
<th>total</th><th>runs</th></tr>
{% for b in batches %}<tr><td>{{ b.finished | clock }}</td><td class="num">{{ b.messages }}
{%- if b.size_limit %} <span class="muted">of {{ b.size_limit }} allowed</span>{% endif %}</td>
<td>{% for s, n in b.states | dictsort %}{{ s }} {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td>{% for key, n in b.records | dictsort %}{{ key[0] }}: {{ key[1] }} {{ n }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td>
<td class="num routed">{{ b.routed }}</td><td class="num events">{{ b.published.events }}</td>
{% for s in ("stage", "load", "run", "commit", "publish", "batch") %}<td class="num">{{ b.seconds.get(s) | ms }}</td>{% endfor %}
<td>{% for run in b.runs %}{{ run.workflow }} {{ run.runner }} {{ run.seconds | ms }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}</table>{% endif %}
""",
    "dead_letters.html": """{% if error %}<p class="error">{{ error }}</p>
{% elif not letters %}<p class="muted">no dead letters</p>
{% else %}<table id="dead-letter-table"><tr><th>queue</th><th>message</th><th>attempts</th>
<th>workflow</th><th>error</th><th>records</th><th></th></tr>
{% for d in letters %}<tr data-message="{{ d.message_id }}"><td>{{ d.queue }}</td>
<td><a href="/dead-letter?{{ {'queue': d.queue, 'message': d.message_id} | urlencode }}" title="its body, headers and history"><code>{{ d.message_id }}</code></a></td>
<td class="num">{{ d.attempts }}</td><td>{{ d.workflow }}</td>
<td class="error">{{ d.error | truncate(300) }}</td>
<td>{% for r in d.records %}<a href="/record/{{ r | urlencode }}">{{ r }}</a>{% if not loop.last %}, {% endif %}{% endfor %}
{%- if d.body_note %}<span class="muted body-note">{{ d.body_note }}</span>{% endif %}</td>
<td class="act"><form method="post" action="/dlq/replay" class="guarded"><input type="hidden" name="token" value="">
<button type="submit" name="target" value="{{ [d.queue, d.message_id] | tojson | forceescape }}">Replay</button></form></td></tr>
{% endfor %}</table>
<form method="post" action="/dlq/replay" class="guarded"><input type="hidden" name="token" value="">
{% for q in queues %}<button type="submit" name="target" value="{{ [q, ''] | tojson | forceescape }}">Replay all of {{ q }}</button> {% endfor %}</form>
{% endif %}{% if not token_set %}<p class="muted">the controls are off: set <code>[http] token</code> in the configuration</p>{% endif %}
""",
    "workflows.html": """<div class="wfs">{% for w in views %}<div class="wf" data-workflow="{{ w.name }}">
<h3>{{ w.name }} <span class="muted">version <code>{{ w.version[:12] }}</code></span></h3>
<p class="muted"><code>{{ w.path }}</code></p>
{% if w.errors %}<p class="error">the file has errors; the last good version (above) keeps running:</p>
<ul>{% for e in w.errors %}<li class="error"><code>{{ e }}</code></li>{% endfor %}</ul>{% endif %}
<div class="svgbox">{{ w.svg | safe }}</div></div>
{% else %}<p class="muted">no workflow loaded</p>{% endfor %}</div>
{% if orphans %}<p class="error">files with errors that run nothing:</p>
<ul>{% for e in orphans %}<li class="error"><code>{{ e }}</code></li>{% endfor %}</ul>{% endif %}
""",
    "reprocess.html": REPROCESS_HTML,
    "refused.html": """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Chalk · refused</title><style>{{ style | safe }}</style></head><body>
<p class="refused" id="refused">{{ message }}</p><p><a href="/{{ back }}">back</a></p></body></html>
""",
}


def _when(at: float | None) -> str:
    if not at:
        return ""
    return dt.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _clock(at: float | None) -> str:
    if not at:
        return ""
    return dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _field(value: Any, name: str) -> str:
    """A member row's field: times as age, lists and maps as text."""
    if isinstance(value, float) and name.endswith("_at"):
        return f"{_clock(value)} ({_duration(time.time() - value)} ago)"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str, sort_keys=True)
    return "" if value is None else str(value)


_ENV = Environment(loader=DictLoader({**_TEMPLATES, **TEMPLATES, **LOGIN_TEMPLATES}), autoescape=select_autoescape(default=True),
                   trim_blocks=True, lstrip_blocks=True)
_ENV.filters.update(
    clock=_clock, when=_when, duration=_duration, field=_field, bytes=_bytes, tick=tick_label,
    count=lambda n: "–" if n is None else f"{n:,}",
    rate=lambda r: "–" if r is None else f"{r:,.1f}",
    ms=lambda s: "" if s is None else f"{s * 1000:,.0f} ms")


def render(template: str, **values: Any) -> str:
    """``template`` (a name in this module's table) with ``values``."""
    return _ENV.get_template(template).render(style=_STYLE, script=_SCRIPT,
                                              login_script=LOGIN_SCRIPT, **values)


SCRIPTS = (_SCRIPT, LOGIN_SCRIPT)   # the only scripts the page may run (its CSP's hashes)
