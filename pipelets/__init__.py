"""Pipelets: the ``Pipelet`` base API and the built-in pipelets.

Write your own by subclassing :class:`Pipelet` (see ``docs/pipelets.md``).
The built-in ones live in modules by idea (``text``, ``values``, ``html``,
``xml``, ``identify``, ``language``, ``split``, ``fingerprint``,
``filtering``, ``index``, and ``smila`` for SMILA's own test and example
pipelets); workflow files name them by dotted path, e.g.
``pipelets.text.Lowercase``.  ``pipelets.aliases.SMILA_ALIASES`` maps
Java SMILA pipelet classes to them.
"""

from pipelets._base import Pipelet, PipeletConfigurationError, PipeletError
from pipelets._config import PipeletConfig, Settings
from pipelets.aliases import SMILA_ALIASES
from pipelets.filtering import Filter
from pipelets.fingerprint import Fingerprint
from pipelets.html import HtmlToText
from pipelets.identify import MimeTypeIdentify
from pipelets.index import FullTextIndex, FullTextSearch
from pipelets.language import LanguageIdentify
from pipelets.smila import AddLiteral, ErrorOnDemand, HelloWorld, Splitter
from pipelets.split import DocumentSplitter, XmlSplit
from pipelets.text import Lowercase, NormalizeWhitespace, RegexExtract, Replace, WordCount
from pipelets.values import (
    AddValues,
    Copy,
    FileUri,
    RemoveAttribute,
    Rename,
    SetAttributes,
    SetValue,
    SubAttributeExtract,
)
from pipelets.xml import XPathExtract, XsltTransform

__all__ = [
    "SMILA_ALIASES",
    "AddLiteral",
    "AddValues",
    "Copy",
    "DocumentSplitter",
    "ErrorOnDemand",
    "FileUri",
    "Filter",
    "Fingerprint",
    "FullTextIndex",
    "FullTextSearch",
    "HelloWorld",
    "HtmlToText",
    "LanguageIdentify",
    "Lowercase",
    "MimeTypeIdentify",
    "NormalizeWhitespace",
    "Pipelet",
    "PipeletConfigurationError",
    "PipeletError",
    "RegexExtract",
    "RemoveAttribute",
    "Rename",
    "Replace",
    "SetAttributes",
    "SetValue",
    "PipeletConfig",
    "Settings",
    "Splitter",
    "SubAttributeExtract",
    "WordCount",
    "XPathExtract",
    "XmlSplit",
    "XsltTransform",
]
