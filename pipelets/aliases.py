"""Java pipelet classes of Eclipse SMILA → the Chalk pipelets that do the same job.

Real SMILA workflow files name Java classes (``<proc:pipelet
class="org.eclipse.smila.processing.pipelets.HtmlToTextPipelet"/>``).  The
engine looks class names up here (dotted paths, so nothing is imported until
used); the Python pipelets accept the Java pipelets' parameter names
(``inputType``/``inputName``/``valuesToAdd``/``MimeTypeAttribute``/``_indexing``…),
so those files load unchanged.  ``docs/smila.md`` lists every mapping with
its differences from the Java pipelet.

SMILA pipelets without an equivalent are deliberately absent: those that
need a server (Solr, the Sesame ontology store), search-only ones
(``HighlightingPipelet``, the search test pipelets), project pipelets of
third parties, and SMILA's ``UnknownPipelet`` (its tests expect it to be
unknown).  A workflow naming them fails validation as an unknown pipelet
class; ``chalk validate --summary`` lists them.
"""

from __future__ import annotations

__all__ = ["SMILA_ALIASES", "SMILA_SERVICES"]

_P = "org.eclipse.smila.processing.pipelets."
_BPEL = "org.eclipse.smila.processing.bpel.pipelet."

SMILA_ALIASES: dict[str, str] = {
    _P + "HtmlToTextPipelet": "pipelets.html.HtmlToText",
    _P + "MimeTypeIdentifyPipelet": "pipelets.identify.MimeTypeIdentify",
    _P + "AddValuesPipelet": "pipelets.values.AddValues",
    _P + "SetValuePipelet": "pipelets.values.SetValue",
    _P + "CopyPipelet": "pipelets.values.Copy",
    _P + "SubAttributeExtractorPipelet": "pipelets.values.SubAttributeExtract",
    _P + "xmlprocessing.XPathExtractorPipelet": "pipelets.xml.XPathExtract",
    _P + "xmlprocessing.XslTransformationPipelet": "pipelets.xml.XsltTransform",
    _P + "xmlprocessing.XmlSplitterPipelet": "pipelets.split.XmlSplit",
    _P + "LanguageIdentifyPipelet": "pipelets.language.LanguageIdentify",
    # SMILA's own test pipelets and its tutorial pipelet (its test pipelines use them)
    _BPEL + "SplitterPipelet": "pipelets.smila.Splitter",
    _BPEL + "AddLiteralPipelet": "pipelets.smila.AddLiteral",
    _BPEL + "ErrorPipelet": "pipelets.smila.ErrorOnDemand",
    _BPEL + "SimpleTestPipelet": "pipelets.values.SetAttributes",
    "org.eclipse.smila.integration.helloworld.HelloWorldPipelet": "pipelets.smila.HelloWorld",
    # embedded Lucene in SMILA; a local SQLite full-text index here
    "org.eclipse.smila.lucene.pipelets.LuceneIndexPipelet": "pipelets.index.FullTextIndex",
    "org.eclipse.smila.lucene.pipelets.LuceneSearchPipelet": "pipelets.index.FullTextSearch",
    "org.eclipse.smila.ontology.pipelets.CreateFileUriPipelet": "pipelets.values.FileUri",
}

#: SMILA's processing services (``<proc:invokeService><proc:service name=...>``,
#: SMILA 0.9) -> the Chalk pipelets doing the same job.  SMILA named its
#: services in each deployment's OSGi configuration, so there is no fixed list
#: to ship: map yours in ``[workflows.services]``.
SMILA_SERVICES: dict[str, str] = {}
