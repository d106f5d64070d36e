"""Java pipelet classes of Eclipse SMILA → the Chalk pipelets that do the same job.

Real SMILA workflow files name Java classes (``<proc:pipelet
class="org.eclipse.smila.processing.pipelets.HtmlToTextPipelet"/>``).  The
engine looks class names up here (dotted paths, so nothing is imported until
used); the Python pipelets accept the Java pipelets' parameter names
(``inputType``/``inputName``/``valuesToAdd``/``MimeTypeAttribute``…), so those
files load unchanged.

SMILA pipelets without an equivalent are deliberately absent (indexers for
Lucene/Solr, the ontology store, SMILA's own test pipelets, the streaming
``XmlSplitterPipelet``); a workflow naming them fails validation as an
unknown pipelet class.
"""

from __future__ import annotations

__all__ = ["SMILA_ALIASES", "SMILA_SERVICES"]

_P = "org.eclipse.smila.processing.pipelets."

SMILA_ALIASES: dict[str, str] = {
    _P + "HtmlToTextPipelet": "pipelets.html.HtmlToText",
    _P + "MimeTypeIdentifyPipelet": "pipelets.identify.MimeTypeIdentify",
    _P + "AddValuesPipelet": "pipelets.values.AddValues",
    _P + "SetValuePipelet": "pipelets.values.SetValue",
    _P + "CopyPipelet": "pipelets.values.Copy",
    _P + "SubAttributeExtractorPipelet": "pipelets.values.SubAttributeExtract",
    _P + "xmlprocessing.XPathExtractorPipelet": "pipelets.xml.XPathExtract",
    _P + "xmlprocessing.XslTransformationPipelet": "pipelets.xml.XsltTransform",
    _P + "LanguageIdentifyPipelet": "pipelets.language.LanguageIdentify",
}

#: SMILA's processing services (``<proc:invokeService><proc:service name=...>``,
#: SMILA 0.9) -> the Chalk pipelets doing the same job.
SMILA_SERVICES: dict[str, str] = {}
