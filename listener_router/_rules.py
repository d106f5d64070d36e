"""Listener rules (which workflow gets a message) and router rules (where results go).

Listener conditions are XPath 1.0 over the message: every header is a
variable (``$operation = 'ADD'``), as are ``$message_id``, ``$queue``,
``$content_type`` and ``$routing_key``; the expression may also navigate
``/message/headers/NAME`` and ``/message/properties/NAME``.  A condition
naming a header the message lacks is false for that message.

Router conditions are XPath over the result record's workflow object
(``$record/Val[@key='lang'] = 'de'``), compiled by the engine.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from lxml import etree

import engine
from blackboard import Blackboard, BlackboardError
from listener_router._errors import ConfigError
from listener_router._messages import Incoming, outgoing_id
from listener_router._settings import ListenerRule, RouterRule, Settings
from listener_router.broker import OutMessage

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ListenerRules", "Router", "check_conditions"]

log = logging.getLogger(__name__)

NEXT_DESTINATION = "nextDestination"
_HEADER = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]|^\s*\[")
_CONDITION = re.compile(r"^\s*[\"']?condition[\"']?\s*=")


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: Any) -> str:
    """A header value as XPath text; characters XML cannot carry become U+FFFD."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return _NOT_XML.sub("\ufffd", "" if value is None else str(value))


def _message_element(variables: Mapping[str, str], headers: Mapping[str, Any]) -> etree._Element:
    root = etree.Element("message")
    props = etree.SubElement(root, "properties")
    for key, value in variables.items():
        etree.SubElement(props, key).text = value
    hdrs = etree.SubElement(root, "headers")
    for key, value in headers.items():
        try:
            etree.SubElement(hdrs, key).text = _text(value)
        except ValueError:  # header name that is no XML name: reachable as a variable only
            continue
    return root


class ListenerRules:
    """First matching listener rule per message."""

    def __init__(self, rules: Sequence[ListenerRule]):
        self.rules = list(rules)
        self._compiled: dict[str, etree.XPath] = {}
        for rule in self.rules:
            if rule.condition:
                try:
                    self._compiled[rule.name] = etree.XPath(rule.condition)
                except etree.XPathSyntaxError as e:
                    raise ConfigError(f"listener rule {rule.name!r}: condition "
                                      f"{rule.condition!r} is not valid XPath: {e}") from e

        self._by_queue: dict[str, list[ListenerRule]] = {}
        for rule in self.rules:
            self._by_queue.setdefault(rule.queue, []).append(rule)

    @property
    def queues(self) -> list[str]:
        return list(dict.fromkeys(rule.queue for rule in self.rules))

    def consumers(self) -> list[str]:
        """Each queue once per consumer wanted (the most any of its rules asks for)."""
        return [queue for queue in self.queues
                for _ in range(max(r.consumers for r in self.for_queue(queue)))]

    def for_queue(self, queue: str) -> list[ListenerRule]:
        return self._by_queue.get(queue, [])

    def match(self, message: Incoming) -> ListenerRule | None:
        rules = self._by_queue.get(message.queue, ())
        if rules and rules[0].name not in self._compiled:
            return rules[0]  # the first rule has no condition: no XPath to build
        variables = {
            "operation": message.operation, "message_id": message.message_id,
            "queue": message.queue,
            "content_type": _text(message.properties.get("content_type")),
            "routing_key": _text(message.properties.get("routing_key")),
        }
        for rule in rules:
            xpath = self._compiled.get(rule.name)
            if xpath is None:
                return rule
            values = {**{k: _text(v) for k, v in message.headers.items()}, **variables}
            try:
                result = xpath(_message_element(variables, message.headers), **values)
            except (etree.XPathError, ValueError, TypeError) as e:
                # a header this condition names is absent, or holds text XML cannot carry
                log.debug("listener rule %s: %s for message %s", rule.name, e, message.message_id)
                continue
            if (bool(result) if not isinstance(result, float) else result != 0):
                return rule
        return None


def _compile_condition(expression: str, position: int, where: str = "") -> Any:
    try:
        return engine.compile_condition(expression)
    except engine.WorkflowDefinitionError as e:
        raise ConfigError(f"{where or 'router rule'} #{position + 1}: condition {expression!r}: "
                          f"{e}") from e


def _condition_lines(source: str | None, section: str) -> list[tuple[str | None, int | None]]:
    """For each ``[[section]]`` table of the file: its ``name`` and the line of its
    ``condition`` (of its header when it has none); empty when there is no file."""
    if source is None:
        return []
    try:
        text = open(source, encoding="utf-8").read()   # noqa: SIM115 - read at once
        tables = tomllib.loads(text).get(section, [])
    except (OSError, ValueError):
        return []
    found: list[tuple[str | None, int | None]] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            inside = header.group(1) == section
            if inside:
                found.append((None, number))
        elif inside and _CONDITION.match(line):
            found[-1] = (None, number)
    return [(table.get("name") if isinstance(table, dict) else None, line)
            for table, (_none, line) in zip(tables, found, strict=False)]


def check_conditions(settings: Settings) -> None:
    """Compile every listener and router condition of ``settings``, each problem named with
    its place in the configuration file (``chalk.toml:12: [[router]] #1 condition …``).

    Raises:
        ConfigError: every condition that does not compile, at once.
    """
    problems: list[str] = []
    file = settings.source

    def place(lines: list[tuple[str | None, int | None]], index: int | None) -> str:
        line = lines[index][1] if index is not None and index < len(lines) else None
        return f"{file}:{line}: " if file and line else f"{file}: " if file else ""

    listeners = _condition_lines(file, "listener")
    names = [name or f"listener{i + 1}" for i, (name, _line) in enumerate(listeners)]
    for rule in settings.listeners:
        if rule.condition:
            try:
                etree.XPath(rule.condition)
            except etree.XPathSyntaxError as e:
                index = names.index(rule.name) if rule.name in names else None
                problems.append(f"{place(listeners, index)}[[listener]] {rule.name!r}: "
                                f"condition {rule.condition!r} is not valid XPath: {e}")
    routers = _condition_lines(file, "router")
    for position, router in enumerate(settings.routers):
        if router.condition:
            try:
                _compile_condition(router.condition, position,
                                   f"{place(routers, position)}[[router]]")
            except ConfigError as e:
                problems.append(str(e))
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems:\n  " + "\n  ".join(problems))


class Router:
    """Outgoing messages for a successful instance's result records."""

    def __init__(self, rules: Sequence[RouterRule]):
        self.rules = list(rules)
        self._conditions: dict[int, Any] = {}
        self._by_workflow: dict[str, list[tuple[int, RouterRule]]] = {}
        for position, rule in enumerate(self.rules):
            if rule.condition:
                self._conditions[position] = _compile_condition(rule.condition, position)

    def targets(self) -> list[str]:
        return [rule.queue for rule in self.rules if rule.queue]

    def _next_destination(self, bb: Blackboard, rid: str) -> str | None:
        try:
            ann = bb.get_annotation(rid, None, NEXT_DESTINATION)
        except BlackboardError:
            return None
        if ann is None:
            return None
        if ann.values:
            return str(ann.values[0])
        return str(ann.named.get("queue")) if ann.named.get("queue") else None

    def _for_workflow(self, workflow: str) -> list[tuple[int, RouterRule]]:
        rules = self._by_workflow.get(workflow)
        if rules is None:
            rules = self._by_workflow[workflow] = [
                (position, rule) for position, rule in enumerate(self.rules)
                if not rule.workflow or rule.workflow == workflow]
        return rules

    def route(self, bb: Blackboard, workflow: str, message: Incoming,
              result_ids: Sequence[str]) -> list[OutMessage]:
        out: list[OutMessage] = []
        rules = self._for_workflow(workflow)
        headers = {"operation": message.operation, "x-chalk-source": message.message_id,
                   "x-chalk-workflow": workflow}
        for rid in result_ids:
            for position, rule in rules:
                exchange, key = rule.exchange, rule.routing_key or rule.queue
                if position in self._conditions:
                    if not self._conditions[position].test([bb.document(rid)]):
                        continue
                if rule.use_next_destination:
                    key = self._next_destination(bb, rid)
                    if key is None:
                        continue
                assert key is not None
                attributes = bb.get_attributes(rid, rule.attributes) if rule.attributes else {}
                record: dict[str, Any] = {"id": rid, "attributes": attributes} if attributes \
                    else {"id": rid}
                out.append(OutMessage(  # positional: (routing_key, body, message_id, headers, exchange)
                    key, orjson.dumps({"records": [record]}),
                    outgoing_id(message.message_id, f"{exchange}/{key}", rid), dict(headers),
                    exchange))
                break
        return out
