"""Pipelets: the ``Pipelet`` base API and the built-in pipelets.

Write your own by subclassing :class:`Pipelet` (see ``docs/pipelets.md``).
The built-in ones live in modules by idea (``text``, ``values``, ``html``,
``xml``, ``identify``, ``language``, ``split``, ``fingerprint``,
``filtering``); workflow files name them by dotted path, e.g.
``pipelets.text.Lowercase``.  ``pipelets.aliases.SMILA_ALIASES`` maps
Java SMILA pipelet classes to them.
"""

from pipelets._base import Pipelet, PipeletConfigurationError, PipeletError
from pipelets._config import Settings
from pipelets.aliases import SMILA_ALIASES
from pipelets.filtering import Filter
from pipelets.fingerprint import Fingerprint
from pipelets.html import HtmlToText
from pipelets.identify import MimeTypeIdentify
from pipelets.language import LanguageIdentify
from pipelets.split import DocumentSplitter
from pipelets.text import Lowercase, NormalizeWhitespace, RegexExtract, Replace, WordCount
from pipelets.values import AddValues, Copy, RemoveAttribute, Rename, SetValue, SubAttributeExtract
from pipelets.xml import XPathExtract, XsltTransform

__all__ = [
    "SMILA_ALIASES",
    "AddValues",
    "Copy",
    "DocumentSplitter",
    "Filter",
    "Fingerprint",
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
    "SetValue",
    "Settings",
    "SubAttributeExtract",
    "WordCount",
    "XPathExtract",
    "XsltTransform",
]
