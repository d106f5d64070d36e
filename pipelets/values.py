"""Setting, adding, copying, renaming and removing attribute values."""

from __future__ import annotations

import datetime as dt
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

from blackboard import Annotation, Blackboard, Literal
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._frames import STRING, STRINGS, FrameIO, cached_column, frame_name
from pipelets._literals import copy_attribute

__all__ = ["AddValues", "Copy", "FileUri", "RemoveAttribute", "Rename", "SetAttributes", "SetValue",
           "SubAttributeExtract", "text_of"]

_TYPES = ("str", "int", "float", "bool", "date", "datetime")


def _convert(owner: str, param: str, value: Any, kind: str | None) -> Any:
    """A configured value as ``kind`` (values from XML arrive as text)."""
    if kind is None:
        return value
    if kind == "str":
        return text_of(value)
    s = PipeletConfig(owner, {param: value})
    try:
        if kind == "int":
            return s.integer(param)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "bool":
            return s.boolean(param)
        if kind == "date":
            return dt.date.fromisoformat(str(value).strip())
        return dt.datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise s.error(param, f"{value!r} is not a valid {kind}") from None


class _ValuesPipelet(Pipelet):
    """Shared configuration of SetValue and AddValues."""

    runs_in_service = True

    def _read(self, config: dict[str, Any], *, plural: bool) -> None:
        owner = type(self).__name__
        s = PipeletConfig(owner, config)
        self.attribute: str = s.name("attribute", "outputAttribute")
        kind = s.choice("type", _TYPES, default=None)
        semantic = s.name("semanticType", default=None)
        names = ("values", "value", "valuesToAdd") if plural else ("value", "values")
        used, _ = s.raw(*names)
        self.values = [Literal(_convert(owner, used, v, kind), semantic)
                       for v in s.values(*names)]


class SetValue(_ValuesPipelet):
    """Set an attribute to fixed values, replacing what it held.

    Parameters:
        attribute: the attribute (or path) to set (required).
        value / values: one value or a list (``rec:Seq``) (required).
        type: convert the values to str, int, float, bool, date or datetime
            (XML gives text unless ``rec:Val type=...`` says otherwise).
        semanticType: semantic type given to each literal.
    """

    parameters = frozenset({"attribute", "outputAttribute", "value", "values", "type",
                            "semanticType"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self._read(config, plural=False)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        blackboard.set_literals(rid, self.attribute, self.values)

    def frame_io(self) -> FrameIO | None:
        plain = all(type(v.value) is str and v.semantic_type is None and not v.annotations for v in self.values)
        if not (plain and self.values and frame_name(self.attribute)):
            return None
        return FrameIO(reads=(), writes=((self.attribute, STRING if len(self.values) == 1 else STRINGS),))

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        def value() -> Any:
            texts = [F.lit(v.value) for v in self.values]
            return texts[0] if len(texts) == 1 else F.array(*texts)

        return frame.withColumn(self.attribute, cached_column(self, value))


class AddValues(_ValuesPipelet):
    """Append fixed values to an attribute (SMILA's ``AddValuesPipelet``).

    Parameters:
        attribute / outputAttribute: the attribute (or path) (required).
        values / valuesToAdd: one value or a list (required).
        type, semanticType: as for :class:`SetValue`.
    """

    parameters = frozenset({"attribute", "outputAttribute", "value", "values", "valuesToAdd",
                            "type", "semanticType"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self._read(config, plural=True)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        for value in self.values:
            blackboard.add_literal(rid, self.attribute, value)


class Copy(Pipelet):
    """Copy (or move) between attributes and attachments (SMILA's ``CopyPipelet``).

    Parameters:
        input / inputName: the source attribute or attachment (required).
        output / outputName: the target (required).
        inputType, outputType: ``attribute`` (default) or ``attachment``
            (SMILA's ``ATTRIBUTE``/``ATTACHMENT`` work too).
        mode: ``copy`` (default) or ``move`` (remove the source afterwards).
        encoding: text encoding between attachments and attributes (utf-8).
        separator: joins several string values written to an attachment ("\\n").

    Attribute to attribute copies every value with its annotations and
    sub-objects.  An attachment becomes one string value; bytes that do not
    decode fail the record.  Records without the source pass unchanged.
    """

    runs_in_service = True
    parameters = frozenset({"input", "inputName", "output", "outputName", "inputType",
                            "outputType", "mode", "encoding", "separator"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.input: str = s.name("input", "inputName")
        self.output: str = s.name("output", "outputName")
        kinds = ("attribute", "attachment")
        self.input_type: str = s.choice("inputType", kinds, default="attribute")
        self.output_type: str = s.choice("outputType", kinds, default="attribute")
        self.move: bool = s.choice("mode", ("copy", "move"), default="copy") == "move"
        self.encoding: str = s.name("encoding", default="utf-8")
        self.separator: str = s.text("separator", default="\n", empty=True)
        try:
            "".encode(self.encoding)
        except LookupError:
            raise s.error("encoding", f"unknown encoding {self.encoding!r}") from None
        if (self.input, self.input_type) == (self.output, self.output_type):
            raise s.error("output", "is the same as the input; nothing to copy")

    def process_record(self, bb: Blackboard, rid: str) -> None:
        if self.input_type == "attachment":
            if not bb.has_attachment(rid, self.input):
                return
            if self.output_type == "attachment":
                with bb.get_attachment_stream(rid, self.input) as stream:
                    bb.set_attachment_from_stream(rid, self.output, stream)
            else:
                data = bb.get_attachment(rid, self.input)
                try:
                    text = data.decode(self.encoding)
                except UnicodeDecodeError as e:
                    raise ValueError(f"attachment {self.input!r} is not {self.encoding} "
                                     f"text: {e}") from e
                bb.set_literal(rid, self.output, text)
            if self.move:
                bb.remove_attachment(rid, self.input)
            return
        if not bb.has_attribute(rid, self.input):
            return
        if self.output_type == "attachment":
            texts = [lit.value if isinstance(lit.value, str) else text_of(lit.value)
                     for lit in bb.get_literals(rid, self.input)]
            bb.set_attachment(rid, self.output, self.separator.join(texts).encode(self.encoding))
        else:
            copy_attribute(bb, rid, self.input, self.output)
        if self.move:
            bb.remove_attribute(rid, self.input)


def text_of(value: Any) -> str:
    """A value as SMILA writes it in text: booleans lowercase, dates in ISO form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


class Rename(Pipelet):
    """Rename an attribute, keeping its values, sub-objects and annotations.

    Parameters:
        from: the attribute (or path) to rename (required).
        to: its new name (or path) (required); an existing ``to`` is replaced.
    """

    runs_in_service = True
    parameters = frozenset({"from", "to"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.source: str = s.name("from")
        self.target: str = s.name("to")
        if self.source == self.target:
            raise s.error("to", "is the same as 'from'")

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        if blackboard.has_attribute(rid, self.source):
            copy_attribute(blackboard, rid, self.source, self.target)
            blackboard.remove_attribute(rid, self.source)


class RemoveAttribute(Pipelet):
    """Remove attributes (with all their values and annotations).

    Parameters:
        attribute / attributes: one name (or path) or a list; a string with
            commas names several (required).
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "attributes"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        self.attributes: list[str] = PipeletConfig(type(self).__name__, config).names(
            "attributes", "attribute")

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        for name in self.attributes:
            if blackboard.has_attribute(rid, name):
                blackboard.remove_attribute(rid, name)


class SubAttributeExtract(Pipelet):
    """Collect the values at a path through sub-objects into one attribute.

    SMILA's ``SubAttributeExtractorPipelet``: ``Authors/Name`` visits every
    sub-object of ``Authors`` and takes its ``Name`` values.

    Parameters:
        inputPath: the path (required); each step but the last walks all
            sub-objects unless it carries an index (``Authors[0]/Name``).
        outputPath: the attribute that receives the values (required).
        mode: ``ALL_AS_LIST`` (default: every value), ``FIRST``, ``LAST``,
            or ``ALL_AS_ONE`` (string values joined by ``separator``).
        separator: for ``ALL_AS_ONE`` (default one space).

    A record where the path finds nothing gets no output attribute.
    """

    runs_in_service = True
    parameters = frozenset({"inputPath", "outputPath", "mode", "separator"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.input: str = s.name("inputPath")
        self.output: str = s.name("outputPath")
        self.mode: str = s.choice("mode", ("ALL_AS_LIST", "ALL_AS_ONE", "FIRST", "LAST"),
                                  default="ALL_AS_LIST")
        self.separator: str = s.text("separator", default=" ", empty=True)
        self.steps = [step for step in self.input.split("/")]
        if any(not step.strip() for step in self.steps):
            raise s.error("inputPath", f"{self.input!r} has an empty step")

    def _collect(self, bb: Blackboard, rid: str, prefix: str, steps: list[str]) -> list[Literal]:
        step, rest = steps[0], steps[1:]
        here = f"{prefix}/{step}" if prefix else step
        if not rest:
            return bb.get_literals(rid, here) if bb.has_attribute(rid, here) else []
        if not bb.has_attribute(rid, here):
            return []
        if "[" in step:
            return self._collect(bb, rid, here, rest)
        out: list[Literal] = []
        for i in range(bb.object_size(rid, here)):
            out += self._collect(bb, rid, f"{here}[{i}]", rest)
        return out

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        found = self._collect(blackboard, rid, "", self.steps)
        if not found:
            return
        if self.mode == "FIRST":
            found = found[:1]
        elif self.mode == "LAST":
            found = found[-1:]
        elif self.mode == "ALL_AS_ONE":
            found = [Literal(self.separator.join(text_of(lit.value) for lit in found))]
        blackboard.set_literals(rid, self.output, found)


class SetAttributes(Pipelet):
    """Write every configured value onto each record, as an attribute of the same name.

    SMILA's ``bpel.pipelet.SimpleTestPipelet`` (its 2011 form copies its whole
    configuration into each record's metadata).  Values keep their shape: a
    ``rec:Val`` becomes one value, a ``rec:Seq`` several, a ``rec:Map`` a
    sub-object; an attribute of that name is replaced.  A value that is an
    :class:`~blackboard.Annotation` (a ``setAnnotations`` annotation with both
    anonymous and named values) becomes the record's annotation of that name
    instead, as SMILA's ``setAnnotations`` set it for the 2010 form, which
    read it there.  Takes any parameter names (they are the attributes).
    """

    runs_in_service = True

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        for name, value in config.items():
            if not isinstance(name, str) or not name.strip():
                raise PipeletConfig(type(self).__name__, config).error(str(name), "is not an attribute name")
            if not isinstance(value, Annotation):
                _check_value(type(self).__name__, name, value)
        self.values = {k: v for k, v in config.items() if not isinstance(v, Annotation)}
        self.annotations = {k: v for k, v in config.items() if isinstance(v, Annotation)}

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        if self.values:
            blackboard.set_attributes(rid, self.values)
        for name, annotation in self.annotations.items():
            blackboard.set_annotation(rid, None, name, annotation)


def _check_value(owner: str, name: str, value: Any) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _check_value(owner, f"{name}/{key}", inner)
    elif isinstance(value, list):
        for inner in value:
            _check_value(owner, name, inner)
    elif not isinstance(value, (str, int, float, bool)):
        raise PipeletConfig(owner, {}).error(name, f"cannot be written to a record: {value!r}")


class FileUri(Pipelet):
    """Write the ``file:`` URI of a file path (SMILA's ontology ``CreateFileUriPipelet``).

    The path comes from the ``filenameAttribute`` (SMILA's
    ``_filenameAttribute``), else from the record ID (SMILA guessed it from the
    ID key).  Relative paths are made absolute against the working directory,
    as Java's ``File.toURI`` does; Windows paths (``C:\\docs\\a.txt``) become
    ``file:/C:/docs/a.txt``.

    Parameters:
        filenameAttribute / _filenameAttribute: the attribute holding the path
            (default: use the record ID).
        output: the attribute written (default ``rdf:about``, as SMILA's
            ``SesameRecordHelper``).
    """

    runs_in_service = True
    parameters = frozenset({"filenameAttribute", "_filenameAttribute", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.source: str | None = s.name("filenameAttribute", "_filenameAttribute", default=None)
        self.output: str = s.name("output", default="rdf:about")

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        if self.source is None:
            path = rid
        elif blackboard.has_attribute(rid, self.source):
            path = text_of(blackboard.get_literals(rid, self.source)[0].value)
        else:
            raise ValueError(f"attribute {self.source!r} (the file name) is missing")
        blackboard.set_literal(rid, self.output, file_uri(path))


def file_uri(path: str) -> str:
    """``path`` as a ``file:`` URI in the form Java's ``File.toURI`` gives (``file:/abs/path``)."""
    import os

    text = path.strip()
    if len(text) > 1 and text[1] == ":" and text[0].isalpha():  # a Windows drive path
        parts = PureWindowsPath(text).as_posix()
        return "file:/" + quote(parts, safe="/:")
    posix = PurePosixPath(text.replace("\\", "/"))
    if not posix.is_absolute():
        posix = PurePosixPath(os.getcwd()) / posix
    return "file:" + quote(str(posix), safe="/")
