from __future__ import annotations

import io
import zipfile

import pytest
from pipelets_helpers import configured, make, values

from pipelets import PipeletConfigurationError
from pipelets.identify import MimeTypeIdentify, extension_of, sniff
from pipelets.language import LanguageIdentify, identify_language


def _zip(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name in names:
            z.writestr(name, "<x/>")
    return buffer.getvalue()


@pytest.mark.parametrize("head, mime", [
    (b"%PDF-1.7\n", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "image/png"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg"),
    (b"GIF89a\x01\x00", "image/gif"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"\x1f\x8b\x08\x00", "application/gzip"),
    (b"  <!DOCTYPE html><html><body>x", "text/html"),
    (b"<?xml version='1.0'?>\n<!-- c --><rss version='2.0'>", "application/rss+xml"),
    (b"<?xml version='1.0'?><root/>", "application/xml"),
    (b'{"a": [1, 2]}', "application/json"),
    ("plain words, grüße".encode(), "text/plain"),
    (b"\x00\x01\x02\x03binary", "application/octet-stream"),
    (b"", None),
])
def test_sniff_knows_common_formats_by_their_first_bytes(head, mime):
    assert sniff(head) == mime


def test_sniff_looks_inside_zip_containers():
    assert sniff(_zip("[Content_Types].xml", "word/document.xml")).endswith(
        "wordprocessingml.document")
    assert sniff(_zip("a.txt")) == "application/zip"


@pytest.mark.parametrize("name, ext", [("report.PDF", "pdf"), ("html", "html"), (".txt", "txt"),
                                       ("http://x.org/a/b.htm?q=1#f", "htm"),
                                       ("C:\\docs\\x.docx", "docx"), ("http://x.org/", None)])
def test_extension_of_file_names_paths_and_urls(name, ext):
    assert extension_of(name) == ext


def test_mime_type_from_content_beats_a_wrong_extension(bb):
    make(bb, "a", FileExtension="txt")
    bb.set_attachment("a", "Content", b"%PDF-1.4 ...")
    configured(MimeTypeIdentify).process(bb, ["a"])
    assert values(bb, "a", "MimeType") == ["application/pdf"]


def test_mime_type_extension_refines_plain_text_but_never_makes_it_binary(bb):
    make(bb, "csv", FileExtension="csv")
    make(bb, "fake", FileExtension="pdf")
    for rid in ("csv", "fake"):
        bb.set_attachment(rid, "Content", b"a,b\n1,2\n")
    configured(MimeTypeIdentify).process(bb, ["csv", "fake"])
    assert values(bb, "csv", "MimeType") == ["text/csv"]
    assert values(bb, "fake", "MimeType") == ["text/plain"]


def test_mime_type_from_extension_alone_with_smila_parameter_names(bb):
    make(bb, "a", Extension="html")
    make(bb, "b", Extension=".docx")
    make(bb, "none", Other="x")
    configured(MimeTypeIdentify, FileExtensionAttribute="Extension", MetaDataAttribute="MetaData",
               MimeTypeAttribute="Type").process(bb, ["a", "b", "none"])
    assert values(bb, "a", "Type") == ["text/html"]
    assert values(bb, "b", "Type")[0].endswith("wordprocessingml.document")
    assert not bb.has_attribute("none", "Type")


def test_mime_type_from_declared_content_type_and_file_name(bb):
    make(bb, "a", MetaData=["Server: x", "Content-Type: text/html; charset=utf-8"])
    make(bb, "b", Url="http://example.org/files/data.json?x=1")
    configured(MimeTypeIdentify, metaDataAttribute="MetaData",
               filenameAttribute="Url").process(bb, ["a", "b"])
    assert values(bb, "a", "MimeType") == ["text/html"]
    assert values(bb, "b", "MimeType") == ["application/json"]


def test_mime_type_from_text_content_in_an_attribute(bb):
    make(bb, "a", body="<html><body><p>x</p></body></html>")
    configured(MimeTypeIdentify, contentAttribute="body").process(bb, ["a"])
    assert values(bb, "a", "MimeType") == ["text/html"]


def test_mime_type_identify_rejects_unknown_parameters():
    with pytest.raises(PipeletConfigurationError) as err:
        MimeTypeIdentify().configure({"MimeTypAttribute": "x"})
    assert "MimeTypAttribute" in str(err.value)


TEXTS = {
    "en": "The committee said that it would publish the report when all of the members "
          "have read it, but nobody knows when that will be.",
    "de": "Der Ausschuss sagte, dass er den Bericht veröffentlichen wird, wenn alle Mitglieder "
          "ihn gelesen haben, aber niemand weiß, wann das sein wird.",
    "fr": "Le comité a dit qu'il publierait le rapport lorsque tous les membres l'auront lu, "
          "mais personne ne sait quand ce sera.",
    "es": "El comité dijo que publicaría el informe cuando todos los miembros lo hayan leído, "
          "pero nadie sabe cuándo será.",
    "it": "Il comitato ha detto che pubblicherà la relazione quando tutti i membri "
          "l'avranno letta, ma nessuno sa quando sarà.",
    "nl": "De commissie zei dat zij het rapport zou publiceren wanneer alle leden het hebben "
          "gelezen, maar niemand weet wanneer dat zal zijn.",
    "pt": "O comitê disse que publicaria o relatório quando todos os membros o tivessem lido, "
          "mas ninguém sabe quando isso será.",
}


@pytest.mark.parametrize("lang", sorted(TEXTS))
def test_identify_language_of_a_sentence(lang):
    assert identify_language(TEXTS[lang]) == lang


def test_identify_language_declines_without_evidence():
    assert identify_language("12345 67890") is None
    assert identify_language("") is None


def test_language_identify_writes_the_code_and_the_default(bb):
    make(bb, "de", Content=TEXTS["de"])
    make(bb, "x", Content="4711")
    make(bb, "none")
    configured(LanguageIdentify, default="unknown").process(bb, ["de", "x", "none"])
    assert values(bb, "de", "language") == ["de"]
    assert values(bb, "x", "language") == ["unknown"]


def test_language_identify_restricted_to_some_languages(bb):
    make(bb, "a", title=TEXTS["pt"])
    configured(LanguageIdentify, attribute="title", languages="en, es",
               output="lang").process(bb, ["a"])
    assert values(bb, "a", "lang") == ["es"]


def test_language_identify_rejects_unsupported_languages():
    with pytest.raises(PipeletConfigurationError) as err:
        LanguageIdentify().configure({"languages": ["en", "xx"]})
    assert "xx" in str(err.value)
