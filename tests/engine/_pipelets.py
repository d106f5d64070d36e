"""Pipelets for engine tests (importable as ``tests.engine._pipelets`` from the repo root).

Each does one visible thing to a record so tests can tell which activities
ran, in which order, and how often.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pipelets import Pipelet, PipeletError


class Mark(Pipelet):
    """Append ``value`` to the ``trail`` attribute (shows order and repetitions)."""

    parameters = frozenset({"value", "attribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.value = str(config.get("value", "x"))
        self.attribute = str(config.get("attribute", "trail"))

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            blackboard.add_literal(rid, self.attribute, self.value)
        return ids


class Upper(Pipelet):
    """Uppercase the string values of ``attribute``."""

    parameters = frozenset({"attribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.attribute = config.get("attribute", "text")

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            if blackboard.has_attribute(rid, self.attribute):
                values = [lit.value for lit in blackboard.get_literals(rid, self.attribute)]
                blackboard.set_literals(rid, self.attribute, [str(v).upper() for v in values])
        return ids


class Increment(Pipelet):
    """Add 1 to the int attribute ``counter`` (0 when absent)."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            n = blackboard.get_literal(rid, "counter").value if blackboard.has_attribute(rid, "counter") else 0
            blackboard.set_literal(rid, "counter", n + 1)
        return ids


class FailWhen(Pipelet):
    """Raise for records whose ``fail`` attribute is set.

    ``named`` (default true) raises a PipeletError naming the record; false
    raises a bare RuntimeError (the engine cannot tell whose record it was).
    Records before the failing one are marked first, like a real pipelet that
    stops half-way through a batch.
    """

    parameters = frozenset({"named"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.named = str(config.get("named", "true")).lower() == "true"

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            if blackboard.has_attribute(rid, "fail"):
                if self.named:
                    raise PipeletError(f"record {rid!r} is marked to fail", record_id=rid)
                raise RuntimeError("something failed somewhere in the batch")
            blackboard.add_literal(rid, "trail", "failwhen")
        return ids


class SplitInTwo(Pipelet):
    """Replace each record by two fragments ``#a`` and ``#b`` (each gets ``part``)."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        out = []
        for rid in ids:
            for part in ("a", "b"):
                fid = blackboard.split(rid, part)
                blackboard.set_literal(fid, "part", part)
                out.append(fid)
        return out


class DropMarked(Pipelet):
    """Return only records without a ``drop`` attribute."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        return [rid for rid in ids if not blackboard.has_attribute(rid, "drop")]


class Crash(Pipelet):
    """Kill the Python worker (``os._exit``) for a record with ``crash``; hang for one with ``hang``."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            if blackboard.has_attribute(rid, "crash"):
                os._exit(3)
            if blackboard.has_attribute(rid, "hang"):
                time.sleep(3600)
            blackboard.add_literal(rid, "trail", "survived")
        return ids


class NeedsSetting(Pipelet):
    """Rejects its configuration unless ``level`` is an int between 1 and 9."""

    parameters = frozenset({"level"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        from pipelets import PipeletConfigurationError

        level = config.get("level")
        if not isinstance(level, int) or not 1 <= level <= 9:
            raise PipeletConfigurationError(f"level must be an int 1..9, got {level!r}")

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        return ids


class RecordIndex(Pipelet):
    """Stand-in for SMILA's LuceneIndexPipelet: note each record as indexed.

    Takes SMILA's ``_indexing`` map (``indexname``/``indexName``,
    ``executionMode``) and writes ``indexed = "<index>:<mode>"``.
    """

    parameters = frozenset({"_indexing"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        from pipelets import PipeletConfigurationError

        indexing = config.get("_indexing")
        if not isinstance(indexing, dict):
            raise PipeletConfigurationError("_indexing must be a map (rec:Map)")
        self.index = indexing.get("indexname") or indexing.get("indexName")
        self.mode = indexing.get("executionMode", "ADD")

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            blackboard.set_literal(rid, "indexed", f"{self.index}:{self.mode}")
        return ids


class BrokenFrame(Pipelet):
    """Sets ``x`` to ``y``; its DataFrame form names a column that does not exist."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            blackboard.set_literal(rid, "x", "y")
        return ids

    def frame_io(self) -> Any:
        from pipelets.frames import STRING, FrameIO

        return FrameIO(reads=(), writes=(("x", STRING),))

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        return frame.withColumn("x", F.col("no_such_column"))


class BatchSize(Pipelet):
    """Append to ``batch`` the number of records of the call (shows batching across instances)."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            blackboard.add_literal(rid, "batch", len(ids))
        return ids


class Order(Pipelet):
    """Append to ``attribute`` (default ``order``) the IDs the call got, space-separated (shows which
    records came, in which order)."""

    parameters = frozenset({"attribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.attribute = str(config.get("attribute", "order"))

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        seen = " ".join(ids)
        for rid in ids:
            blackboard.add_literal(rid, self.attribute, seen)
        return ids


class Greeter:
    """A message service for BPEL ``invoke``: ``sayHi`` answers "Hello <arg0>" (stands in for a web service)."""

    def invoke(self, operation: str, parts: dict[str, Any]) -> dict[str, Any]:
        from lxml import etree

        if operation != "sayHi":
            raise ValueError(f"unknown operation {operation!r}")
        name = parts["parameters"].findtext("arg0") or ""
        reply = etree.Element("sayHiResponse")
        etree.SubElement(reply, "return").text = f"Hello {name}"
        return {"parameters": reply}


class Journal(Pipelet):
    """Append a line per record to the file ``path``: ``value``, or the record's ``attribute`` (a side
    effect outside the blackboard, which survives a failed instance)."""

    parameters = frozenset({"path", "value", "attribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.path = str(config["path"])
        self.value = config.get("value")
        self.attribute = config.get("attribute")

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        with open(self.path, "a", encoding="utf-8") as f:
            for rid in ids:
                value = self.value
                if self.attribute and blackboard.has_attribute(rid, self.attribute):
                    value = blackboard.get_literal(rid, self.attribute).value
                f.write(f"{value}\n")
        return ids


class StandIn(Pipelet):
    """Stands in for a Java pipelet with no Python counterpart: takes any configuration,
    appends ``stand-in`` to ``trail``."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            blackboard.add_literal(rid, "trail", "stand-in")
        return ids


class WhereAmI(Pipelet):
    """Write where it ran: ``pid``, and ``in_task`` (inside a Spark task or not)."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        from pyspark import TaskContext

        for rid in ids:
            blackboard.set_literal(rid, "pid", os.getpid())
            blackboard.set_literal(rid, "in_task", TaskContext.get() is not None)
        return ids


class PauseMidAnswer(Pipelet):
    """Counts each record (``counter`` + 1) and, the first time only (of every worker: the
    first to claim ``marker``), has its worker stop between the first two frames of its
    answer: it writes its pid into ``marker`` and waits there to be killed
    (``engine._supervisor.send_answer``)."""

    parameters = frozenset({"marker"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.marker = str(config["marker"])

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            n = blackboard.get_literal(rid, "counter").value if blackboard.has_attribute(rid, "counter") else 0
            blackboard.set_literal(rid, "counter", n + 1)
        if self._first():
            import engine._supervisor as supervisor
            from engine._wire import ANSWER, ANSWER_HEAD, send

            marker = self.marker

            def half(conn: Any, seq: int, kind: bytes, parts: Any, seconds: float) -> None:
                send(conn, ANSWER, ANSWER_HEAD.pack(seq, kind, len(parts), seconds))
                send(conn, parts[0])
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(600)

            supervisor.send_answer = half
        return ids

    def _first(self) -> bool:
        """Whether this is the first call anywhere (one worker of all pauses)."""
        try:
            os.close(os.open(self.marker + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


class Stamp(Pipelet):
    """Sleeps ``sleep`` seconds (an attribute) per record, then stamps ``done`` with the time."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            if blackboard.has_attribute(rid, "sleep"):
                time.sleep(float(blackboard.get_literal(rid, "sleep").value))
            blackboard.set_literal(rid, "done", time.time())
        return ids


class Scripted(Pipelet):
    """Do to each record what its record note ``script`` says: a list of ``[op, name, value]``
    (``read``, ``set``, ``add``, ``set_many``, ``typed`` (a date literal with a semantic
    type), ``remove``, ``attributes``, ``annotate``, ``attach``, ``split`` (a fragment
    ``id#name`` with ``frag`` set), ``delete``) -- the Blackboard API's ways to read and write,
    for tests that compare where they run."""

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        going: list[str] = []
        for rid in ids:
            going.append(rid)
            script = blackboard.get_record_note(rid, "script") \
                if blackboard.has_record_note(rid, "script") else []
            going += run_script(blackboard, rid, script)
        return going


def run_script(bb: Any, rid: str, script: list[list[Any]]) -> list[str]:
    """Apply ``script`` (see :class:`Scripted`) to ``rid``; the fragments it made."""
    import datetime as dt

    from blackboard import Annotation, Literal

    made: list[str] = []
    for op, name, value in script:
        if op == "read":
            bb.get_literals(rid, name)
        elif op == "set":
            bb.set_literal(rid, name, value)
        elif op == "add":
            bb.add_literal(rid, name, value)
        elif op == "set_many":
            bb.set_literals(rid, name, value)
        elif op == "typed":
            bb.set_literal(rid, name, Literal(dt.date.fromisoformat(value), "day"))
        elif op == "remove":
            bb.remove_attribute(rid, name)
        elif op == "attributes":
            bb.set_attributes(rid, {name: value})
        elif op == "annotate":
            bb.set_annotation(rid, None, name, Annotation([value]))
        elif op == "attach":
            bb.set_attachment(rid, name, str(value).encode())
        elif op == "split" and f"{rid}#{name}" not in bb:
            fid = bb.split(rid, name)
            bb.set_literal(fid, "frag", value)
            made.append(fid)
        elif op == "delete":
            bb.delete(rid)
    return made
