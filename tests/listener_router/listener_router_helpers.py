"""Helpers for the listener/router tests (``from listener_router_helpers import …``).

Naming: a verb for what acts (``publish_ids``, ``write_config``,
``start_service``, ``wait_for_log``, ``kill_group``), a noun for what reads
(``records_of``, ``stored_counts``, ``stored_attributes``,
``message_ids_by_record``); :class:`Broker` is a small synchronous client.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pika

from blackboard import Blackboard
from listener_router import Settings
from listener_router.broker import AmqpLink, OutMessage, connection_parameters


class Broker:
    """Small synchronous helpers over one BlockingConnection (tests only)."""

    def __init__(self, url: str):
        self.url = url
        self.created: list[str] = []

    def _channel(self) -> tuple[Any, Any]:
        conn = pika.BlockingConnection(connection_parameters(self.url))
        return conn, conn.channel()

    def depth(self, queue: str) -> int:
        conn, ch = self._channel()
        try:
            return ch.queue_declare(queue, passive=True).method.message_count
        finally:
            conn.close()

    def drain(self, queue: str) -> list[tuple[Any, bytes]]:
        """Take every message off ``queue``: [(properties, body)]."""
        conn, ch = self._channel()
        out = []
        try:
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return out
                out.append((props, body))
        finally:
            conn.close()

    def publish(self, queue: str, body: bytes | str, *, message_id: str | None = None,
                headers: dict[str, Any] | None = None) -> None:
        conn, ch = self._channel()
        try:
            ch.confirm_delivery()
            ch.basic_publish("", queue, body.encode() if isinstance(body, str) else body,
                             pika.BasicProperties(delivery_mode=2, message_id=message_id,
                                                  headers=headers))
        finally:
            conn.close()

    def declare(self, queue: str) -> None:
        conn, ch = self._channel()
        try:
            ch.queue_declare(queue, durable=True)
        finally:
            conn.close()

    def bind(self, queue: str, exchange: str, key: str) -> None:
        conn, ch = self._channel()
        try:
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, exchange, routing_key=key)
        finally:
            conn.close()

    def delete(self, *queues: str) -> None:
        conn, ch = self._channel()
        try:
            for queue in queues:
                ch.queue_delete(queue)
        finally:
            conn.close()


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
               *, every: float = 0.1, explain: Callable[[], str] | None = None) -> Any:
    """``condition()``'s first true value, asked every ``every`` seconds; an AssertionError
    naming ``what`` (and ``explain()``, e.g. the processes' logs) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what} not reached within {timeout:.0f} s"
                         + (f"\n{explain()}" if explain is not None else ""))


def bodies(messages: list[tuple[Any, bytes]]) -> list[dict[str, Any]]:
    return [json.loads(body) for _props, body in messages]


def records_of(messages: list[tuple[Any, bytes]]) -> list[dict[str, Any]]:
    return [r for body in bodies(messages) for r in body["records"]]


def message_ids_by_record(messages: list[tuple[Any, bytes]]) -> dict[str, set[str]]:
    """Record ID -> the message IDs it came under (one ID per record means no true duplicate)."""
    routed: dict[str, set[str]] = {}
    for props, body in messages:
        for record in records_of([(props, body)]):
            routed.setdefault(record["id"], set()).add(props.message_id)
    return routed


def publish_ids(settings: Settings, ids: Sequence[str], *, prefix: str = "t") -> None:
    """Publish one message per record ID to the first listener rule's queue (with confirms)."""
    queue = settings.listeners[0].queue
    link = AmqpLink(settings.broker_url, consume=()).start()
    try:
        link.publish([OutMessage(routing_key=queue, message_id=f"{prefix}-{uuid.uuid4().hex}",
                                 body=json.dumps({"records": [{"id": rid}]}).encode())
                      for rid in ids]).result(timeout=60)
    finally:
        link.stop()


def stored_attributes(url: str, ids: list[str], names: list[str] | None = None
                      ) -> dict[str, dict[str, Any] | None]:
    """Each stored record's attributes (``names`` only, when given); None for one not stored."""
    with Blackboard.connect(url) as bb:
        bb.load_many(ids)
        out = {rid: (None if bb.is_new(rid) else bb.get_attributes(rid, names)) for rid in ids}
        bb.invalidate_many(ids)
    return out


def stored_counts(url: str, ids: list[str], attribute: str = "count") -> Counter:
    """How many stored records hold each value of an attribute (read without keeping leases)."""
    with Blackboard.connect(url) as bb:
        bb.load_many(ids)
        counts = Counter(bb.get_attributes(rid, [attribute]).get(attribute) for rid in ids)
        bb.invalidate_many(ids)
    return counts


TEST_PIPELETS = '''
from blackboard import Annotation
from pipelets import Pipelet


class Increment(Pipelet):
    """Adds one to an integer attribute (absent counts as 0)."""

    parameters = frozenset({"attribute"})

    def process(self, blackboard, ids):
        name = self.config["attribute"]
        for rid in ids:
            has = blackboard.has_literals(rid, name)
            blackboard.set_literal(rid, name, (blackboard.get_literal(rid, name).value if has else 0) + 1)
        return ids


class FailWhenFlagged(Pipelet):
    """Raises for records whose "fail" attribute is true."""

    def process(self, blackboard, ids):
        for rid in ids:
            if blackboard.has_literals(rid, "fail") and blackboard.get_literal(rid, "fail").value:
                raise RuntimeError(f"record {rid} asked to fail")
        return ids


class HangWhenFlagged(Pipelet):
    """Sleeps for an hour on records whose "hang" attribute is true."""

    def process(self, blackboard, ids):
        import time
        for rid in ids:
            if blackboard.has_literals(rid, "hang") and blackboard.get_literal(rid, "hang").value:
                time.sleep(3600)
        return ids


class CrashWhenFlagged(Pipelet):
    """Ends its process (os._exit) on records whose "crash" attribute is true."""

    runs_in_service = True

    def process(self, blackboard, ids):
        import os
        for rid in ids:
            if blackboard.has_literals(rid, "crash") and blackboard.get_literal(rid, "crash").value:
                os._exit(3)
        return ids


class SleepWhenAsked(Pipelet):
    """Sleeps for the "sleep" attribute's seconds on each record that has one."""

    def process(self, blackboard, ids):
        import time
        for rid in ids:
            if blackboard.has_literals(rid, "sleep"):
                time.sleep(float(blackboard.get_literal(rid, "sleep").value))
        return ids


class RouteByDest(Pipelet):
    """Sets the record's nextDestination annotation from its "dest" attribute."""

    def process(self, blackboard, ids):
        for rid in ids:
            if blackboard.has_literals(rid, "dest"):
                dest = blackboard.get_literal(rid, "dest").value
                blackboard.set_annotation(rid, None, "nextDestination", Annotation([dest]))
        return ids
'''

_WORKFLOW = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
{steps}
  </sequence>
</process>
"""

_STEP = """    <proc:invokePipelet name="{name}">
      <proc:pipelet class="lr_test_pipelets.{cls}"/>
      <proc:configuration>{params}</proc:configuration>
    </proc:invokePipelet>"""


def _steps(*steps: tuple[str, dict[str, str]]) -> str:
    out = []
    for position, (cls, params) in enumerate(steps):
        text = "".join(f'<proc:param name="{k}">{v}</proc:param>' for k, v in params.items())
        out.append(_STEP.format(name=f"s{position}", cls=cls, params=text))
    return "\n".join(out)


def write_test_workflows(folder: Any) -> Any:
    """Workflows Counting, Fragile, Hanging, Crashing, Slow and Routed plus their pipelets,
    in ``folder``."""
    from pathlib import Path
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lr_test_pipelets.py").write_text(TEST_PIPELETS)
    (folder / "counting.xml").write_text(_WORKFLOW.format(
        name="Counting", steps=_steps(("Increment", {"attribute": "count"}))))
    (folder / "fragile.xml").write_text(_WORKFLOW.format(
        name="Fragile", steps=_steps(("Increment", {"attribute": "count"}),
                                     ("FailWhenFlagged", {}))))
    (folder / "hanging.xml").write_text(_WORKFLOW.format(
        name="Hanging", steps=_steps(("Increment", {"attribute": "count"}),
                                     ("HangWhenFlagged", {}))))
    (folder / "crashing.xml").write_text(_WORKFLOW.format(
        name="Crashing", steps=_steps(("Increment", {"attribute": "count"}),
                                      ("CrashWhenFlagged", {}))))
    (folder / "slow.xml").write_text(_WORKFLOW.format(
        name="Slow", steps=_steps(("Increment", {"attribute": "count"}),
                                  ("SleepWhenAsked", {}))))
    (folder / "routed.xml").write_text(_WORKFLOW.format(
        name="Routed", steps=_steps(("Increment", {"attribute": "count"}), ("RouteByDest", {}))))
    return folder



def start_service(config: Any, log: Any, *extra: str) -> Any:
    """``chalk run --config CONFIG`` as its own process group, output appended to ``log``."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    handle = open(log, "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-m", "listener_router", "run", "--config",
                             str(config), *extra], stdout=handle, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def wait_for_log(log: Any, text: str, count: int = 1, timeout: float = 120.0,
                 required: bool = True) -> bool:
    """Wait until ``text`` appears ``count`` times in the log; False (or raise) on timeout."""
    import time
    from pathlib import Path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(log).exists() and Path(log).read_text(errors="replace").count(text) >= count:
            return True
        time.sleep(0.1)
    if not required:
        return False
    raise AssertionError(f"{text!r} did not appear {count} time(s) in the service log:\n"
                         f"{Path(log).read_text(errors='replace')[-3000:]}")


def kill_group(proc: Any, sig: int = 9) -> None:
    """Signal the service's whole process group (its JVM too) and reap it."""
    import os
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    if sig == 9:
        proc.wait(timeout=30)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string


def _section(header: str, values: Mapping[str, Any]) -> list[str]:
    lines = [header]
    tables = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{json.dumps(key) if '.' in key else key} = {_toml(value)}")
    name = header.strip("[]")
    for key, value in tables:
        lines += _section(f"[{name}.{key}]", value)
    return lines


def write_config(path: Path, *, db: str, broker: str, workflows: Any,
                 listeners: Sequence[Mapping[str, Any]], routers: Sequence[Mapping[str, Any]],
                 **sections: Mapping[str, Any]) -> Path:
    """Write the chalk.toml a service test runs with ``chalk run --config`` and return its path.

    ``db`` and ``broker`` are the URLs; ``blackboard={...}`` and ``broker_options={...}`` add
    keys to those sections; any other keyword is a section (``engine={"runner": "local"}``,
    ``spark={"master": "local[2]"}``, ``node={"name": "a"}``).  Dead letters stay in
    ``Q.dlq`` for the test to read (``[dead_letters] move_every = 0``) unless
    ``dead_letters`` says otherwise.
    """
    sections.setdefault("dead_letters", {"move_every": 0})
    blackboard = {"url": db, **sections.pop("blackboard", {})}
    broker_section = {"url": broker, **sections.pop("broker_options", {})}
    lines = _section("[blackboard]", blackboard) + _section("[broker]", broker_section)
    lines += _section("[workflows]", {"dir": str(workflows)})
    for name, values in sections.items():
        lines += _section(f"[{name}]", values)
    for rule in listeners:
        lines += _section("[[listener]]", rule)
    for rule in routers:
        lines += _section("[[router]]", rule)
    path.write_text("\n".join(lines) + "\n")
    return path


def bind_subscriber(broker_url: str, queue: str, exchange: str = "chalk.events") -> None:
    """A durable queue bound to the events exchange with '#': every event from now on."""
    from listener_router.events import declare_exchange
    conn = pika.BlockingConnection(connection_parameters(broker_url))
    try:
        channel = conn.channel()
        declare_exchange(channel, exchange)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, routing_key="#")
    finally:
        conn.close()


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_service(proc: Any, timeout: float = 60.0) -> None:
    """Stop ``chalk run`` as its supervisor would (SIGTERM to its group), SIGKILL when it
    has not stopped within ``timeout`` seconds."""
    import subprocess
    kill_group(proc, 15)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, 9)
