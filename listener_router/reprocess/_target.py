"""Where a run's messages go: a queue whose listener rule runs the workflow.

The workflow runs in the service, so the run publishes to a queue a
listener rule reads.  Without ``--queue`` it is the queue of the first
rule that runs the workflow; with it, the rule the service would match for
a reprocess message on that queue (the first whose condition holds) must
run the workflow.  Both are asked of the service's own rule matching with
a message like the ones the run publishes, so a condition on the rule
(``$reprocess``, ``$operation = 'ADD'``) is honoured as the service will.
"""

from __future__ import annotations

import orjson

from listener_router._errors import ConfigError
from listener_router._messages import parse_message
from listener_router._rules import ListenerRules
from listener_router._settings import ListenerRule, Settings

__all__ = ["OPERATION", "headers_for", "target_rule"]

OPERATION = "ADD"


def headers_for(run_id: str) -> dict[str, str]:
    """The headers of a run's messages (``$reprocess`` in a listener condition)."""
    return {"operation": OPERATION, "reprocess": run_id}


def _matched(rules: ListenerRules, queue: str) -> ListenerRule | None:
    probe = parse_message(orjson.dumps({"records": [{"id": "probe"}]}), queue=queue,
                          message_id="reprocess:probe:probe", headers=headers_for("probe"))
    return rules.match(probe)


def target_rule(settings: Settings, workflow: str, queue: str | None = None) -> ListenerRule:
    """The listener rule a run of ``workflow`` publishes for (see the module doc); a
    :class:`ConfigError` saying what to add when there is none."""
    where = settings.source or "the configuration"
    rules = ListenerRules(settings.listeners)
    running = {r.workflow for r in settings.listeners}
    if queue is None:
        for rule in settings.listeners:
            if rule.workflow == workflow and _matched(rules, rule.queue) == rule:
                return rule
        known = ", ".join(sorted(running)) or "none"
        raise ConfigError(
            f"no listener rule in {where} runs workflow {workflow!r} (the rules run: {known}); "
            f"add one, e.g. [[listener]] queue = \"chalk.reprocess\" workflow = \"{workflow}\", "
            "and restart chalk run, or give --queue")
    if not rules.for_queue(queue):
        raise ConfigError(f"no listener rule in {where} reads queue {queue!r}: the service "
                          "would not take the messages; add one, or leave out --queue")
    matched = _matched(rules, queue)
    if matched is None or matched.workflow != workflow:
        found = (f"its messages would match rule {matched.name!r}, which runs "
                 f"{matched.workflow!r}" if matched is not None
                 else "no rule's condition holds for its messages")
        raise ConfigError(f"queue {queue!r} does not run workflow {workflow!r}: {found}")
    return matched
