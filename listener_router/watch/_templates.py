"""The operator's panels and pages (Jinja, escaped): lanes, statistics, job log, schedules,
journal subscribers, events, cancellations; a record's page and a dead letter's.

Every form that changes something posts with the ``guarded`` class: the
page's script puts the token typed into the page's header into its hidden
``token`` field (the server compares it in constant time).
"""

from __future__ import annotations

__all__ = ["TEMPLATES"]

_TOKEN = '<input type="hidden" name="token" value="">'

TEMPLATES = {
    "lanes.html": """{% if not rows %}<p class="muted">no lanes</p>{% else %}
<table id="lane-table"><tr><th>lane (queue)</th><th>state</th><th>priority</th>
<th title="records/s for the cluster, and this member's share">rate limit</th><th>ordered by</th>
<th title="an output queue over max_output_depth holds the lane back">back-pressure</th>
<th>running</th><th title="messages the batches take at most now">batch size</th>
<th title="messages ready for it in the broker">waiting</th><th></th></tr>
{% for r in rows %}{% set v = r.view %}<tr data-lane="{{ v.queue }}" data-paused="{{ r.paused | lower }}" data-here="{{ 'paused' if v.paused else 'running' }}">
<td><code>{{ v.queue }}</code></td>
<td class="state">{% if r.paused %}<span class="error">paused</span>{% if r.state %}
<span class="muted"> since {{ r.state.changed_at | clock }} by {{ r.state.changed_by or "?" }}
{%- if r.state.reason %}: {{ r.state.reason }}{% endif %}</span>{% endif %}
{% if r.state and r.state.paused and not v.paused %} <span class="muted">(this member obeys within a second)</span>{% endif %}
{% else %}running{% endif %}</td>
<td class="num">{{ v.priority }}</td>
<td>{% if v.rate_limit is not none %}{{ v.rate_limit | rate }}/s{% if v.share is not none %} <span class="muted">(here {{ v.share | rate }})</span>{% endif %}{% else %}–{% endif %}</td>
<td>{{ v.ordered_by or "–" }}</td>
<td class="backpressure">{% if v.backed_up %}<span class="error">held back: <code>{{ v.backed_up }}</code>
holds {{ r.output_depth | count }} of {{ r.max_output_depth | count }}</span>
{% elif r.max_output_depth is not none %}<span class="muted">outputs under {{ r.max_output_depth | count }}</span>{% else %}–{% endif %}</td>
<td class="num">{{ v.running }}</td><td class="num">{{ v.batch_size }}</td><td class="num">{{ v.waiting | count }}</td>
<td class="act">{% if r.paused %}<form method="post" action="/lanes/resume" class="guarded">""" + _TOKEN + """
<input type="hidden" name="queue" value="{{ v.queue }}"><button type="submit">Resume</button></form>
{% else %}<form method="post" action="/lanes/pause" class="guarded">""" + _TOKEN + """
<input type="hidden" name="queue" value="{{ v.queue }}"><input name="reason" placeholder="why (optional)"
 aria-label="why" size="14"> <button type="submit">Pause</button></form>{% endif %}</td></tr>
{% endfor %}</table>{% endif %}
""",
    "stats.html": """<p class="muted">from the job log's statistics (every member, kept in the store:
they survive a restart), per {{ interval | int }} s interval, over the last
{% for key in windows %}<a href="?{{ {'stats': key} | urlencode }}#stats"{% if key == window %} class="current"{% endif %}>{{ key }}</a>{% if not loop.last %} · {% endif %}{% endfor %}</p>
{% if not rows %}<p class="muted">nothing in the statistics for this window</p>{% else %}
<table id="stats-table"><tr><th>queue</th><th>workflows</th><th>committed</th>
<th title="committed without a run: their records were unchanged (delta processing)">unchanged</th><th>retried</th>
<th title="dead-lettered; for chalk process, records that failed">dead</th><th>cancelled</th><th>records</th><th>latency p50 / p99</th><th>members</th>
<th>messages/s, and latency</th></tr>
{% for s in rows %}<tr data-queue="{{ s.queue }}"><td><code>{{ s.queue }}</code></td>
<td>{{ s.workflows | join(", ") }}</td>
<td class="num committed">{{ s.counts.get("committed", 0) + s.counts.get("processed", 0) }}</td>
<td class="num unchanged">{{ s.counts.get("unchanged", 0) }}</td>
<td class="num">{{ s.counts.get("retrying", 0) }}</td>
<td class="num dead">{{ s.counts.get("dead", 0) if s.counts.get("dead") or not s.counts.get("failed") else "" }}
{%- if s.counts.get("failed") %}{{ " + " if s.counts.get("dead") else "" }}{{ s.counts.get("failed") }} failed{% endif %}</td>
<td class="num">{{ s.counts.get("cancelled", 0) }}</td><td class="num records">{{ s.counts.get("records", 0) }}</td>
<td class="num latency">{% if s.p50 is none %}–{% else %}{{ s.p50 | ms }} / {{ s.p99 | ms }}{% endif %}</td><td class="num">{{ s.members }}</td>
<td class="charts">{{ s.rates | safe }}{{ s.latency | safe }}</td></tr>{% endfor %}</table>{% endif %}
""",
    "jobs.html": """{% set q = p.query %}{% if q.record %}<p>every step of the messages that named record
<a href="/record/{{ q.record | urlencode }}"><code>{{ q.record }}</code></a>:</p>{% endif %}
{% if not p.jobs %}<p class="muted">{% if q.filtered or q.before %}no entries match{% else %}no job-log entries yet{% endif %}</p>
{% else %}<table id="job-table"><tr><th>when</th><th>step</th><th>message</th><th>queue</th><th>attempt</th>
<th>workflow</th><th>member</th><th>records</th><th>outgoing</th><th>reason</th><th></th></tr>
{% for j in p.jobs %}{% set e = j.entry %}<tr data-state="{{ e.state }}" data-message="{{ e.message_id }}"><td class="when">{{ e.at | clock }}</td>
<td>{{ e.state }}{% if e.resolved %} ({{ e.resolved }}){% endif %}</td><td><code>{{ e.message_id }}</code></td>
<td>{{ e.queue }}</td><td class="num">{{ e.attempt }}{% if e.round %} (replay {{ e.round }}){% endif %}</td>
<td>{{ e.workflow or "" }}</td><td>{{ e.member or "" }}</td>
<td class="records">{% for r in j.records %}<a href="/record/{{ r | urlencode }}">{{ r }}</a>{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td class="num">{{ e.outgoing }}</td><td class="reason">{{ e.reason or "" }}</td>
<td class="act">{% if j.live %}<form method="post" action="/cancel" class="guarded">""" + _TOKEN + """
<input type="hidden" name="messages" value="{{ e.message_id }}"><button type="submit" title="its retry is acked without running">Cancel</button></form>{% endif %}</td></tr>{% endfor %}</table>{% endif %}
<p class="pages">{% if p.newer is not none %}<a href="?{{ q.link() | urlencode }}#jobs" rel="first">« newest</a>
{% if p.newer %} · <a href="?{{ q.link(before=p.newer) | urlencode }}#jobs" rel="prev">‹ newer</a>{% endif %}{% endif %}
{% if p.older %}{% if p.newer is not none %} · {% endif %}<a href="?{{ q.link(before=p.older) | urlencode }}#jobs" rel="next" id="older">older ›</a>{% endif %}</p>
""",
    "schedules.html": """{% if not rows %}<p class="muted">no <code>[[schedule]]</code> in the configuration</p>
{% else %}<table id="schedule-table"><tr><th>schedule</th><th>when</th><th>publishes</th><th>to</th>
<th>last tick</th><th>next tick</th><th></th></tr>
{% for s in rows %}{% set st = s.state %}<tr data-schedule="{{ s.rule.name }}"><td>{{ s.rule.name }}</td><td>{{ s.when }}</td>
<td>{{ s.publishes }}</td><td><code>{{ s.rule.queue }}</code>{% if s.rule.workflow %} → {{ s.rule.workflow }}{% endif %}</td>
<td>{% if st is none or st.started_at is none %}never{% else %}{{ st.tick | tick }}:
{% if st.done %}{{ st.messages }} message(s), {{ st.records }} record(s) by {{ st.member }}, done {{ st.finished_at | clock }}
{% else %}running, {{ st.messages }} message(s) so far ({{ st.member }}){% endif %}{% endif %}
{% if st and st.skipped %}<span class="muted">; {{ st.skipped }} missed tick(s) skipped</span>{% endif %}</td>
<td>{% if s.running %}running{% else %}{{ s.next_label }}{% if s.due %} (due now){% endif %}{% endif %}</td>
<td class="act">{% set t = (st.tick | tick) if s.running else s.next_label %}{% if t %}<form method="post" action="/cancel" class="guarded">""" + _TOKEN + """
<input type="hidden" name="schedule" value="{{ s.rule.name }}"><input type="hidden" name="tick" value="{{ t }}">
<button type="submit" title="its messages not yet run are acked without running">Cancel {{ "this" if s.running else "the next" }} tick</button></form>{% endif %}</td></tr>
{% endfor %}</table>{% endif %}
""",
    "journal.html": """{% if not journals %}<p class="muted">no <code>[[journal]]</code> in the configuration</p>{% endif %}
{% for j in journals %}<h3>journal {{ j.name }} <span class="muted">{% if j.head %}last offset {{ j.head.offset }},
entry {{ j.head.seq }}{% else %}empty{% endif %}</span></h3>
{% if j.error %}<p class="error">{{ j.error }}</p>{% elif not j.subscribers %}<p class="muted">no subscriber heard from lately</p>
{% else %}<table class="subscribers" data-journal="{{ j.name }}"><tr><th>subscriber</th><th>state</th><th>offset</th>
<th>lag (entries)</th><th>lag (s)</th><th>errors</th><th>last seen</th><th>host</th></tr>
{% for v in j.subscribers %}<tr data-subscriber="{{ v.subscriber }}"><td>{{ v.subscriber }}</td>
<td{% if v.state in ("blocked", "silent") %} class="error"{% endif %}>{{ v.state }}{% if v.blocked_reason %}: {{ v.blocked_reason }}{% elif v.note %} ({{ v.note }}){% endif %}</td>
<td class="num">{{ "–" if v.offset is none else v.offset }}</td><td class="num">{{ v.lag_entries }}</td>
<td class="num">{{ "%.1f" | format(v.lag_seconds) }}</td><td class="num">{{ v.errors }}</td>
<td>{% if v.last_seen is none %}–{% else %}{{ v.last_seen | duration }} ago{% endif %}</td><td>{{ v.host or "–" }}</td></tr>
{% endfor %}</table>{% endif %}{% endfor %}
""",
    "events.html": """{% if not on %}<p class="muted">events are off: switch kinds on in <code>[events]</code></p>
{% else %}<p class="muted">the last events on <code>{{ exchange }}</code> since the page was opened
(newest first; the watch keeps the last {{ keep }} in memory){% if error %}; <span class="error">{{ error }}</span>{% endif %}</p>
{% if events %}<table id="event-table"><tr><th>received</th><th>routing key</th><th>member</th><th>event</th></tr>
{% for s in events %}{% set e = s.event %}<tr><td>{{ s.at | clock }}</td><td><code>{{ e.routing_key }}</code></td>
<td>{{ e.application }}</td><td>{% for k, v in e.body | dictsort if k not in ("event", "application", "time") %}{{ k }}=<code>{{ v }}</code>{% if not loop.last %} {% endif %}{% endfor %}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">none yet</p>{% endif %}{% endif %}
""",
    "cancellations.html": """{% if not rows %}<p class="muted">no cancellations in force</p>
{% else %}<table id="cancel-table"><tr><th>cancelled</th><th>what</th><th>since</th><th>ends</th><th>by</th><th></th></tr>
{% for c in rows %}<tr data-value="{{ c.value }}"><td>{{ c.kind }}</td><td><code>{{ c.value }}</code></td>
<td>{{ c.at | clock }}</td><td>{{ c.until | when if c.until else "when withdrawn" }}</td><td>{{ c.by or "" }}</td>
<td><form method="post" action="/uncancel" class="guarded">""" + _TOKEN + """
<input type="hidden" name="kind" value="{{ c.kind }}"><input type="hidden" name="value" value="{{ c.value }}">
<button type="submit">Withdraw</button></form></td></tr>{% endfor %}</table>{% endif %}
""",
    "record.html": """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Chalk · record {{ r.record_id }}</title><style>{{ style | safe }}</style></head><body>
<header><h1><a href="/">Chalk</a></h1><span>record <b id="record-id">{{ r.record_id }}</b></span></header>
{% if not r.found %}<p class="muted" id="not-stored">not in the store (never stored, or deleted)</p>{% else %}
<p>stored version {{ r.version }}{% if r.source %} · source <code>{{ r.source }}</code>{% endif %}
{% if r.parent %} · part of <a href="/record/{{ r.parent | urlencode }}">{{ r.parent }}</a>{% endif %}</p>
<section><h2>Attributes</h2>{% if r.attributes %}<table id="attributes"><tr><th>name</th><th>values</th><th>annotations</th></tr>
{% for a in r.attributes %}<tr data-attribute="{{ a.name }}"><td><code>{{ a.name }}</code></td>
<td>{% for v in a.values %}<div>{{ v | truncate(2000) }}</div>{% endfor %}</td><td>{% for n in a.annotations %}<div>{{ n }}</div>{% endfor %}</td></tr>
{% endfor %}</table>{% else %}<p class="muted">none</p>{% endif %}</section>
<section><h2>Annotations</h2>{% if r.annotations %}<ul id="annotations">{% for n in r.annotations %}<li>{{ n }}</li>{% endfor %}</ul>{% else %}<p class="muted">none</p>{% endif %}</section>
<section><h2>Attachments</h2>{% if r.attachments %}<table id="attachments"><tr><th>name</th><th>size</th></tr>
{% for name, size in r.attachments %}<tr><td><code>{{ name }}</code></td><td class="num">{{ size | bytes }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">none</p>{% endif %}</section>{% endif %}
<section><h2>History</h2><p class="muted">every step of every message that named it, from the job log{% if r.workflows %};
workflows {{ r.workflows | join(", ") }}{% endif %}</p>
{% if r.history %}<table id="history"><tr><th>when</th><th>step</th><th>queue</th><th>message</th><th>attempt</th>
<th>workflow</th><th>version</th><th>member</th><th>reason</th></tr>
{% for s in r.history %}{% set e = s.entry %}<tr data-state="{{ e.state }}"><td>{{ e.at | when }}</td><td class="step">{{ s.shown or e.state }}{% if e.resolved %} ({{ e.resolved }}){% endif %}</td>
<td>{{ e.queue }}</td><td><code>{{ e.message_id }}</code></td><td class="num">{{ e.attempt }}{% if e.round %} (replay {{ e.round }}){% endif %}</td>
<td>{{ e.workflow or "" }}</td><td><code>{{ s.version }}</code></td><td>{{ e.member or "" }}</td><td class="reason">{{ e.reason or "" }}</td></tr>
{% endfor %}</table>{% else %}<p class="muted">no steps in the job log</p>{% endif %}</section>
</body></html>
""",
    "letter.html": """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Chalk · dead letter {{ d.message_id }}</title><style>{{ style | safe }}</style></head><body>
<header><h1><a href="/">Chalk</a></h1><span>dead letter <b id="letter-id">{{ d.message_id }}</b> of <code>{{ d.queue }}</code></span></header>
<p class="error" id="letter-error">{{ d.error }}</p>
<p>{{ d.attempts }} attempt(s){% if d.workflow %} · workflow {{ d.workflow }}{% endif %}{% if d.records %} · records
{% for r in d.records %}<a href="/record/{{ r | urlencode }}">{{ r }}</a>{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}</p>
<section><h2>Body</h2><p class="muted" id="letter-size">{{ d.size | bytes }}
{%- if d.shown < d.size %}: the first {{ d.shown | bytes }} shown{% endif %} ·
<a href="/dead-letter/body?{{ {'queue': d.queue, 'message': d.message_id} | urlencode }}" data-download="{{ d.message_id | replace('/', '_') | replace(':', '_') }}.body" id="letter-download">download the whole body</a>
(needs the token: <input type="password" id="token" autocomplete="off" size="16" aria-label="token">)
<span class="error" id="download-note"></span></p>
{% if d.body_note %}<p class="error" id="letter-body-note">{{ d.body_note }}</p>{% endif %}
<pre id="letter-body">{{ d.body }}</pre></section>
<section><h2>Headers</h2><pre id="letter-headers">{{ d.headers }}</pre></section>
<section><h2>History</h2>{% if d.history %}<table id="history"><tr><th>when</th><th>step</th><th>attempt</th><th>member</th><th>reason</th></tr>
{% for e in d.history %}<tr><td>{{ e.at | when }}</td><td>{{ e.state }}</td><td class="num">{{ e.attempt }}</td><td>{{ e.member or "" }}</td>
<td class="reason">{{ e.reason or "" }}</td></tr>{% endfor %}</table>{% else %}<p class="muted">not in the job log</p>{% endif %}</section>
<p><a href="/#dead-letters">back to the dead letters</a></p>
<script>{{ script | safe }}</script>
</body></html>
""",
}
