"""SMILA's own test and example pipelets, as real pipelets.

SMILA's test pipelines (``SplitterPipeline``, ``SearchPipeletPipeline``,
``ErrorPipeline``) and its hello-world tutorial call a family of small Java
pipelets; these do the same on a Chalk blackboard, so those files run as
they are (``pipelets.aliases`` maps the Java names here).  Where batching
would change the Java behaviour, they keep SMILA's meaning per workflow
instance (one SMILA request was one instance).
"""

from __future__ import annotations

import time
from typing import Any

from blackboard import Blackboard, Literal
from pipelets._base import Pipelet, PipeletError
from pipelets._config import PipeletConfig
from pipelets.values import text_of

__all__ = ["AddLiteral", "ErrorOnDemand", "HelloWorld", "Splitter"]


def _by_instance(blackboard: Blackboard, ids: list[str]) -> list[list[str]]:
    """``ids`` grouped by workflow instance, in order (one group when instances are unknown)."""
    groups: dict[Any, list[str]] = {}
    instance_of = getattr(blackboard, "instance_of", None)
    for rid in ids:
        key = instance_of(rid) if instance_of is not None else None
        groups.setdefault(key, []).append(rid)
    return list(groups.values())


class Splitter(Pipelet):
    """Replace each record by ``factor`` copies ``<id>#fragment0``, ``#fragment1``, …

    SMILA's ``bpel.pipelet.SplitterPipelet`` (``copyRecord`` to
    ``<id>#fragment<j>``, three per record); only the fragments go on.

    Parameters:
        factor: fragments per record (default 3).
        marker: the fragment name before its number (default ``fragment``).
        indexAttribute: attribute receiving each fragment's number (default: none).
    """

    runs_in_service = True
    parameters = frozenset({"factor", "marker", "indexAttribute"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.factor: int = s.integer("factor", default=3, minimum=1)
        self.marker: str = s.name("marker", default="fragment")
        if "#" in self.marker:
            raise s.error("marker", "must not contain '#' (it separates a fragment's name from its parent)")
        self.index_attribute: str | None = s.name("indexAttribute", default=None)

    def process_record(self, blackboard: Blackboard, rid: str) -> list[str]:
        out: list[str] = []
        for j in range(self.factor):
            fid = blackboard.split(rid, f"{self.marker}{j}")
            if self.index_attribute:
                blackboard.set_literal(fid, self.index_attribute, j)
            out.append(fid)
        return out


class AddLiteral(Pipelet):
    """Append ``SMILA #<n>`` to an attribute, ``n`` the record's position in its instance (from 0).

    SMILA's ``bpel.pipelet.AddLiteralPipelet``: the Java pipelet numbers the
    records of the request it is called with; Chalk calls a pipelet with the
    records of many instances at once, so the number counts within each
    instance, which is what SMILA's one request per call gave.

    Parameters:
        attribute: the attribute (default
            ``org.eclipse.smila.processing.bpel.pipelet.AddLiteralPipelet``, the
            Java class name, as SMILA wrote it).
        prefix: text before the number (default ``SMILA #``).
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "prefix"})
    DEFAULT_ATTRIBUTE = "org.eclipse.smila.processing.bpel.pipelet.AddLiteralPipelet"

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute", default=self.DEFAULT_ATTRIBUTE)
        self.prefix: str = s.text("prefix", default="SMILA #", empty=True)

    def process(self, blackboard: Blackboard, ids: list[str]) -> list[str]:
        for group in _by_instance(blackboard, ids):
            for n, rid in enumerate(group):
                with self.record(rid):
                    blackboard.add_literal(rid, self.attribute, f"{self.prefix}{n}")
        return ids


class ErrorOnDemand(Pipelet):
    """Fail the way a record asks to: SMILA's ``bpel.pipelet.ErrorPipelet`` for error-handling tests.

    A record asks with a ``mode`` in the attribute (a map) or annotation named
    ``setting`` (default: the Java class name, as SMILA's tests set it), or
    every record with the ``mode`` parameter:

    * ``PROCESSING``: a :class:`PipeletError` naming the record (its instance
      fails with ``pipeletError``; the others go on);
    * ``RUNTIME``: a ``RuntimeError`` naming the record;
    * ``INVALID_ID``: return an ID that is on no blackboard (the instance fails:
      the engine cannot map it back);
    * ``TIMEOUT``: sleep ``timeoutSeconds`` (default 15), then go on.

    Records without a mode pass unchanged.  SMILA reads the mode of the first
    record of a call only; batching makes "first" meaningless here, so each
    record is read.

    Parameters:
        mode: the mode for every record (default: none; records say it).
        setting: the attribute/annotation holding a record's mode.
        timeoutSeconds: how long ``TIMEOUT`` sleeps.
    """

    parameters = frozenset({"mode", "setting", "timeoutSeconds"})
    MODES = ("PROCESSING", "RUNTIME", "INVALID_ID", "TIMEOUT")
    DEFAULT_SETTING = "org.eclipse.smila.processing.bpel.pipelet.ErrorPipelet"

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.mode: str | None = s.choice("mode", self.MODES, default=None)
        self.setting: str = s.name("setting", default=self.DEFAULT_SETTING)
        self.timeout: int = s.integer("timeoutSeconds", default=15, minimum=0)

    def _mode_of(self, bb: Any, rid: str) -> str | None:
        mode: Any = None
        if bb.has_attribute(rid, self.setting):
            mode = bb.get_attributes(rid, [self.setting])[self.setting]
            mode = mode.get("mode") if isinstance(mode, dict) else None
        if mode is None:
            ann = bb.get_annotation(rid, None, self.setting)
            if ann is not None:
                mode = ann.named.get("mode")
        if mode is None:
            return self.mode
        text = str(mode).strip().upper()
        if text not in self.MODES:
            raise PipeletError(f"record {rid!r} asks for error mode {mode!r}; modes: {', '.join(self.MODES)}",
                               record_id=rid, pipelet=type(self).__name__)
        return text

    def process(self, blackboard: Blackboard, ids: list[str]) -> list[str]:
        out = list(ids)
        for rid in ids:
            mode = self._mode_of(blackboard, rid)
            if mode == "PROCESSING":
                raise PipeletError(f"record {rid!r}: this is a processing error (mode PROCESSING)",
                                   record_id=rid, pipelet=type(self).__name__)
            if mode == "RUNTIME":
                with self.record(rid):
                    raise RuntimeError("this is a runtime error (mode RUNTIME)")
            if mode == "INVALID_ID":
                out[out.index(rid)] = "ErrorPipelet-invalidId"
            elif mode == "TIMEOUT":
                time.sleep(self.timeout)
        return out


class HelloWorld(Pipelet):
    """Write a source attribute's value plus `` --- Hello world!!!`` to a target attribute.

    SMILA's tutorial pipelet ``integration.helloworld.HelloWorldPipelet``: a
    record without the source gets just the suffix; the first value of the
    source is used.

    Parameters:
        source_attribute_name / input: the attribute read (required).
        target_attribute_name / output: the attribute written (required).
        suffix: what is appended (default `` --- Hello world!!!``).
    """

    runs_in_service = True
    parameters = frozenset({"source_attribute_name", "input", "target_attribute_name", "output", "suffix"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.source: str = s.name("source_attribute_name", "input")
        self.target: str = s.name("target_attribute_name", "output")
        self.suffix: str = s.text("suffix", default=" --- Hello world!!!", empty=True)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        value = ""
        if blackboard.has_attribute(rid, self.source):
            value = text_of(blackboard.get_literals(rid, self.source)[0].value)
        blackboard.set_literal(rid, self.target, Literal(f"{value}{self.suffix}"))
