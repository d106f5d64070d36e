"""XML: XSLT transformations and XPath extraction, with safe parsers.

Parsers here never resolve entities, never load DTDs and never touch the
network; stylesheets may not read or write files or the network.
"""

from __future__ import annotations

import os
import re
from typing import Any

from lxml import etree

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._io import read_endpoints

__all__ = ["XPathExtract", "XsltTransform", "from_document", "parse_xml", "safe_parser"]

_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
_XSL = "http://www.w3.org/1999/XSL/Transform"


def safe_parser() -> etree.XMLParser:
    """An XML parser without entity resolution, DTD loading or network access."""
    return etree.XMLParser(resolve_entities=False, load_dtd=False, no_network=True,
                           dtd_validation=False, huge_tree=False)


def parse_xml(source: bytes | str, what: str) -> Any:
    """Parse a document with :func:`safe_parser`; ``ValueError`` naming ``what`` when bad."""
    if isinstance(source, str):
        # lxml refuses str with an encoding declaration; the text is decoded already
        source = _XML_DECL.sub("", source, count=1)
    try:
        return etree.fromstring(source, safe_parser())
    except etree.XMLSyntaxError as e:
        raise ValueError(f"{what} is not well-formed XML: {e}") from e


_NODE_TYPES = ("node", "text", "comment", "processing-instruction")
_STEP_START = re.compile(r"[A-Za-z_*@.]")
_FUNCTION = re.compile(r"([A-Za-z_][\w.-]*(?::[A-Za-z_][\w.-]*)?)\s*\(")


def from_document(expression: str) -> str:
    """Rewrite ``expression`` so that evaluated on the root element it means
    what it means evaluated on the document node.

    lxml evaluates on elements; SMILA (and XPath over a document) starts at
    the document node, where ``page/title`` finds the root ``<page>``'s
    title.  Top-level relative location paths (at the start and after
    ``|``) get a leading ``/``; everything inside predicates and function
    calls keeps its own context.
    """
    out: list[str] = []
    depth = 0
    quote = ""
    operand_start = True
    i = 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
            operand_start = False
        elif ch in "([":
            depth += 1
            operand_start = False
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == "|":
            operand_start = True
        elif depth == 0 and operand_start and not ch.isspace():
            operand_start = False
            function = _FUNCTION.match(expression, i)
            is_call = function is not None and function.group(1) not in _NODE_TYPES \
                and "::" not in expression[i:function.end()]
            if _STEP_START.match(ch) and not is_call:
                out.append("/")
        out.append(ch)
        i += 1
    return "".join(out)


class XsltTransform(Pipelet):
    """Transform XML with an XSLT stylesheet (SMILA's ``XslTransformationPipelet``).

    Parameters:
        stylesheet: the stylesheet itself (inline XML text), or
        stylesheetFile / xslFile: a path to it (relative to the working
            directory); exactly one of them (required).
        input / inputName: the attribute or attachment holding the XML (default ``Content``).
        inputType: ``attribute`` (default) or ``attachment``.
        output / outputName: where the result goes (default: the input name).
        outputType: ``attribute`` (default: the result as text, without an
            XML declaration) or
            ``attachment`` (the serialized bytes, in the stylesheet's output encoding).
        parameters: a map of XSLT parameter name → string value.

    The stylesheet is compiled once; it may not read or write files or use
    the network (``document()`` and ``exsl:document`` fail the record,
    ``xsl:include`` and ``xsl:import`` are refused when it is configured).  XML that does not parse, or a transformation that fails,
    fails the record.
    """

    parameters = frozenset({"stylesheet", "stylesheetFile", "xslFile", "input", "inputName",
                            "inputType", "output", "outputName", "outputType", "parameters"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.input, self.output = read_endpoints(s, default_input="Content")
        if s.has("stylesheet") == s.has("stylesheetFile", "xslFile"):
            raise s.error("stylesheet", "give either the stylesheet inline or "
                                        "stylesheetFile (xslFile), exactly one")
        if s.has("stylesheet"):
            used, text = "stylesheet", s.text("stylesheet")
            try:
                doc = etree.fromstring(_XML_DECL.sub("", text, count=1).encode("utf-8"),
                                       safe_parser())
            except etree.XMLSyntaxError as e:
                raise s.error(used, f"not well-formed XML: {e}") from e
        else:
            used, path = s.raw("stylesheetFile", "xslFile")
            path = s.name(used)
            if not os.path.isfile(path):
                raise s.error(used, f"no file {path!r} (relative paths start at "
                                    f"{os.getcwd()!r})")
            try:
                doc = etree.parse(path, safe_parser()).getroot()
            except (OSError, etree.XMLSyntaxError) as e:
                raise s.error(used, f"cannot read stylesheet {path!r}: {e}") from e
        # libxslt reads xsl:include and xsl:import while it compiles, whatever the access
        # control says (it governs the run): refuse them before
        for found in doc.iter(f"{{{_XSL}}}include", f"{{{_XSL}}}import"):
            tag = etree.QName(found).localname
            raise s.error(used, f"line {found.sourceline}: <xsl:{tag} href="
                                f"{found.get('href')!r}> is refused: a stylesheet may not read "
                                "files; put what it needs into this one")
        try:
            self.stylesheet = etree.XSLT(doc, access_control=etree.XSLTAccessControl.DENY_ALL)
        except etree.XSLTParseError as e:
            raise s.error(used, f"not a usable XSLT stylesheet: {e}") from e
        params = s.mapping("parameters", default={})
        for key, value in params.items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise s.error("parameters", f"{key!r}: expected a text value, got {value!r}")
        self.params = {str(k): etree.XSLT.strparam(str(v)) for k, v in params.items()}

    def process_record(self, bb: Blackboard, rid: str) -> None:
        results = []
        for source in self.input.read_bytes(bb, rid):
            doc = parse_xml(source, f"{self.input}")
            try:
                results.append(self.stylesheet(doc, **self.params))
            except etree.XSLTApplyError as e:
                log = "; ".join(str(entry.message) for entry in self.stylesheet.error_log)
                raise ValueError(f"XSLT failed on {self.input}: {log or e}") from e
        if not results:
            return
        if self.output.kind == "attachment":
            bb.set_attachment(rid, self.output.name, b"".join(bytes(r) for r in results))
        else:
            # an attribute holds text: no XML declaration, no trailing newline
            bb.set_literals(rid, self.output.name,
                            [_XML_DECL.sub("", str(r), count=1).strip() for r in results])


class XPathExtract(Pipelet):
    """Write the results of an XPath over an XML document to an attribute.

    SMILA's ``XPathExtractorPipelet`` configurations load unchanged.

    Parameters:
        xpath: an XPath 1.0 expression (required).
        input / inputName: the attachment or attribute with the XML (default ``Content``).
        inputType: ``attachment`` (default) or ``attribute``.
        output / outputName: the attribute that receives the results (required).
        namespaces / namespace: a map of prefix → namespace URI for the expression.
        separator: join all results into one string with this separator
            (default: one value per result).
        serialize: elements as XML markup instead of their text (default false).

    The expression is evaluated on the document, as in SMILA: ``page/title``
    finds the title of a root ``<page>`` element.  Elements give their text (or markup), attributes and text nodes their
    string, numbers an int or float, booleans a bool.  The output is
    replaced, and removed when the expression finds nothing.
    """

    runs_in_service = True
    parameters = frozenset({"xpath", "input", "inputName", "inputType", "output",
                            "outputName", "outputType", "namespaces", "namespace",
                            "separator", "serialize"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        s.name("output", "outputName")   # required here
        self.input, self.output = read_endpoints(s, default_input="Content",
                                                 default_input_type="attachment")
        if self.output.kind != "attribute":
            raise s.error("outputType", "XPathExtract writes attributes only")
        namespaces = s.mapping("namespaces", "namespace", default={})
        self.serialize = s.boolean("serialize", default=False)
        self.separator = s.text("separator", default=None, empty=True)
        expression = s.text("xpath")
        try:
            self.xpath = etree.XPath(from_document(expression), namespaces=namespaces,
                                     smart_strings=False)
            self.xpath(etree.Element("probe"))  # unknown prefixes and functions show here
        except (etree.XPathError, TypeError) as e:
            raise s.error("xpath", f"{expression!r} is not usable XPath: {e}") from e

    def _value(self, item: Any) -> Any:
        if isinstance(item, etree._Element):
            if self.serialize:
                return etree.tostring(item, encoding="unicode", with_tail=False)
            return "".join(item.itertext())
        if isinstance(item, bool):
            return item
        if isinstance(item, float):
            return int(item) if item.is_integer() else item
        return str(item)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        sources = self.input.read_bytes(blackboard, rid)
        if not sources:
            return
        values: list[Any] = []
        for source in sources:
            doc = parse_xml(source, f"{self.input}")
            result = self.xpath(doc)
            items = result if isinstance(result, list) else [result]
            values += [self._value(i) for i in items]
        if self.separator is not None and values:
            values = [self.separator.join(str(v) for v in values)]
        blackboard.set_literals(rid, self.output.name, values)
