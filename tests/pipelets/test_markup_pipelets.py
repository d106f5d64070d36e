from __future__ import annotations

import pytest
from pipelets_helpers import configured, make, values

from blackboard import Blackboard
from pipelets import PipeletConfigurationError, PipeletError
from pipelets.html import HtmlToText
from pipelets.xml import XPathExtract, XsltTransform

PAGE = """<!DOCTYPE html><html><head><meta charset="windows-1252">
<title> Chalk
  news </title><meta name="Description" content="All about chalk">
<meta property="og:site_name" content="Chalk"><script>var hidden = 1;</script>
<style>p { color: red }</style></head>
<body><h1>Big  news</h1><p>First <b>bold</b> line,<br>second line.</p>
<!-- a comment --><ul><li>one</li><li>two</li></ul>
<table><tr><td>a</td><td>b</td></tr></table><p>Caf\xe9 &amp; more</p></body></html>"""


def test_html_to_text_from_an_attachment_smila_style(bb):
    make(bb, "a")
    bb.set_attachment("a", "Content", PAGE.encode("cp1252"))
    configured(HtmlToText, inputType="ATTACHMENT", outputType="ATTRIBUTE", inputName="Content",
               outputName="Content", **{"meta:title": "Title",
                                        "meta:description": "Description"}).process(bb, ["a"])
    assert values(bb, "a", "Content") == [
        "Big news\n\nFirst bold line,\nsecond line.\n\none\n\ntwo\n\na b\n\nCafé & more"]
    assert values(bb, "a", "Title") == ["Chalk news"]
    assert values(bb, "a", "Description") == ["All about chalk"]


def test_html_to_text_in_place_with_a_meta_map(bb):
    make(bb, "a", html="<p>x</p><meta property='og:site_name' content='Site'>")
    configured(HtmlToText, input="html", meta={"og:site_name": "site"}).process(bb, ["a"])
    assert values(bb, "a", "html") == ["x"]
    assert values(bb, "a", "site") == ["Site"]


def test_html_to_text_keeps_what_removeContentTags_does_not_name(bb):
    make(bb, "a", c="<div>a<nav>menu</nav>b</div><script>s</script>")
    configured(HtmlToText, input="c", removeContentTags="nav").process(bb, ["a"])
    assert values(bb, "a", "c") == ["a\n\nb\n\ns"]


def test_html_to_text_passes_records_without_input_and_empty_html(bb):
    make(bb, "none")
    make(bb, "empty", Content="  <!-- nothing -->  ")
    p = configured(HtmlToText)
    assert p.process(bb, ["none", "empty"]) == ["none", "empty"]
    assert not bb.has_attribute("none", "Content")
    assert values(bb, "empty", "Content") == [""]


def test_html_to_text_fails_only_on_binary_content_naming_the_record(bb):
    make(bb, "ok", Content="<p>fine</p>")
    make(bb, "bin")
    bb.set_attachment("bin", "Content", b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    with pytest.raises(PipeletError) as err:
        configured(HtmlToText, inputType="attachment").process(bb, ["bin"])
    assert err.value.record_id == "bin"
    assert "binary" in str(err.value)


def test_html_to_text_rejects_unknown_parameters_but_accepts_meta_keys():
    HtmlToText().configure({"meta:keywords": "Keywords"})
    with pytest.raises(PipeletConfigurationError) as err:
        HtmlToText().configure({"tag:h1": "H"})
    assert "tag:h1" in str(err.value)


XSL = """<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:param name="prefix" select="'-'"/>
  <xsl:output method="text"/>
  <xsl:template match="/"><xsl:for-each select="//item">
    <xsl:value-of select="concat($prefix, @name, ';')"/></xsl:for-each></xsl:template>
</xsl:stylesheet>"""


def test_xslt_transform_inline_with_parameters(bb):
    make(bb, "a", xml='<list><item name="a"/><item name="b"/></list>')
    configured(XsltTransform, stylesheet=XSL, input="xml", output="names",
               parameters={"prefix": "#"}).process(bb, ["a"])
    assert values(bb, "a", "names") == ["#a;#b;"]


def test_xslt_transform_from_a_file_to_an_attachment(bb, tmp_path):
    sheet = tmp_path / "copy.xsl"
    sheet.write_text("""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
      <xsl:template match="/"><out><xsl:copy-of select="//b"/></out></xsl:template>
    </xsl:stylesheet>""")
    make(bb, "a")
    bb.set_attachment("a", "Content", b"<?xml version='1.0' encoding='utf-8'?><a><b>x</b></a>")
    configured(XsltTransform, xslFile=str(sheet), inputType="attachment",
               outputType="attachment", output="out").process(bb, ["a"])
    assert b"<out><b>x</b></out>" in bb.get_attachment("a", "out")


def test_xslt_stylesheets_cannot_read_or_write_files(bb, tmp_path):
    secret = tmp_path / "secret.xml"
    secret.write_text("<s>TOP SECRET</s>")
    reader = f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
      <xsl:template match="/"><o><xsl:value-of select="document('{secret}')"/></o></xsl:template>
    </xsl:stylesheet>"""
    writer = f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
        xmlns:exsl="http://exslt.org/common" extension-element-prefixes="exsl">
      <xsl:template match="/"><exsl:document href="{tmp_path / 'out.txt'}">x</exsl:document><o/>
      </xsl:template></xsl:stylesheet>"""
    make(bb, "a", xml="<r/>")
    for sheet in (reader, writer):
        with pytest.raises(PipeletError) as err:
            configured(XsltTransform, stylesheet=sheet, input="xml", output="o").process(bb, ["a"])
        assert err.value.record_id == "a"
    assert not (tmp_path / "out.txt").exists()
    assert not bb.has_attribute("a", "o")


def test_xslt_transform_does_not_resolve_external_entities(bb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    make(bb, "a", xml=f'<!DOCTYPE r [<!ENTITY e SYSTEM "file://{secret}">]><r>&e;</r>')
    configured(XsltTransform, stylesheet="""<xsl:stylesheet version="1.0"
        xmlns:xsl="http://www.w3.org/1999/XSL/Transform"><xsl:output method="text"/>
        <xsl:template match="/"><xsl:value-of select="/r"/></xsl:template></xsl:stylesheet>""",
               input="xml", output="o").process(bb, ["a"])
    assert "SECRET" not in "".join(values(bb, "a", "o"))


@pytest.mark.parametrize("config, name", [
    ({}, "stylesheet"),
    ({"stylesheet": XSL, "xslFile": "x.xsl"}, "stylesheet"),
    ({"stylesheet": "<not-xsl/>"}, "stylesheet"),
    ({"stylesheet": "<broken"}, "stylesheet"),
    ({"xslFile": "/no/such/file.xsl"}, "xslFile"),
])
def test_xslt_transform_rejects_bad_stylesheets(config, name):
    with pytest.raises(PipeletConfigurationError) as err:
        XsltTransform().configure(config)
    assert repr(name) in str(err.value)


def test_xslt_transform_fails_the_record_with_bad_xml(bb):
    make(bb, "a", xml="<unclosed>")
    with pytest.raises(PipeletError) as err:
        configured(XsltTransform, stylesheet=XSL, input="xml", output="o").process(bb, ["a"])
    assert err.value.record_id == "a"
    assert "well-formed" in str(err.value)


def test_xpath_extract_from_an_xml_attachment(bb):
    make(bb, "a")
    bb.set_attachment("a", "Content",
                      b"<page><title>T</title><rev n='1'><text>one</text></rev>"
                      b"<rev n='2'><text>two</text></rev></page>")
    configured(XPathExtract, xpath="page/rev/text", output="texts").process(bb, ["a"])
    configured(XPathExtract, xpath="count(//rev)", output="n").process(bb, ["a"])
    configured(XPathExtract, xpath="//rev/@n", output="ns", separator=",").process(bb, ["a"])
    configured(XPathExtract, xpath="/page/title", output="xml", serialize="yes").process(bb, ["a"])
    assert values(bb, "a", "texts") == ["one", "two"]
    assert values(bb, "a", "n") == [2]
    assert values(bb, "a", "ns") == ["1,2"]
    assert values(bb, "a", "xml") == ["<title>T</title>"]


def test_xpath_extract_smila_configuration_from_an_attribute(bb):
    make(bb, "a", Content="<page><title>Title here</title></page>")
    configured(XPathExtract, inputType="ATTRIBUTE", outputType="ATTRIBUTE", inputName="Content",
               outputName="Title", xpath="page/title").process(bb, ["a"])
    assert values(bb, "a", "Title") == ["Title here"]


def test_xpath_extract_with_namespaces(bb):
    make(bb, "a", x='<r xmlns="urn:x"><v>1</v></r>')
    configured(XPathExtract, xpath="//x:v", namespaces={"x": "urn:x"}, input="x",
               inputType="attribute", output="v").process(bb, ["a"])
    assert values(bb, "a", "v") == ["1"]


@pytest.mark.parametrize("config", [
    {"xpath": "//[", "output": "o"},
    {"xpath": "//q:x", "output": "o"},
    {"xpath": "//x"},
])
def test_xpath_extract_rejects_bad_configuration(config):
    with pytest.raises(PipeletConfigurationError):
        XPathExtract().configure(config)


def test_xpath_extract_fails_the_record_with_bad_xml_only(bb):
    make(bb, "good", x="<a>1</a>")
    make(bb, "bad", x="<a>1</b>")
    p = configured(XPathExtract, xpath="/a", input="x", inputType="attribute", output="o")
    assert p.process(bb, ["good"]) == ["good"]
    with pytest.raises(PipeletError) as err:
        p.process(bb, ["bad"])
    assert err.value.record_id == "bad"


def test_markup_pipelets_on_a_stored_blackboard(sqlite_url):
    with Blackboard.connect(sqlite_url) as board:
        make(board, "p")
        board.set_attachment("p", "Content", b"<html><head><title>T</title></head>"
                                             b"<body><p>Hello</p></body></html>")
        board.commit("p")
    with Blackboard.connect(sqlite_url) as board:
        board.load("p")
        configured(HtmlToText, inputType="attachment", title="Title").process(board, ["p"])
        configured(XPathExtract, xpath="//title", output="T2").process(board, ["p"])
        board.commit("p")
    with Blackboard.connect(sqlite_url) as board:
        board.load("p")
        assert board.get_attributes("p") == {"Content": "Hello", "Title": "T", "T2": "T"}


@pytest.mark.parametrize("tag", ["include", "import"])
def test_xslt_transform_refuses_a_stylesheet_that_includes_a_file(bb, tmp_path, tag):
    secret = tmp_path / "secret.xsl"
    secret.write_text("""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
      <xsl:template match="/"><o>TOP SECRET</o></xsl:template></xsl:stylesheet>""")
    sheet = f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
      <xsl:{tag} href="{secret}"/>
    </xsl:stylesheet>"""
    with pytest.raises(PipeletConfigurationError) as err:
        configured(XsltTransform, stylesheet=sheet, input="xml", output="o")
    assert f"<xsl:{tag}" in str(err.value) and "line 2" in str(err.value)
    assert "may not read files" in str(err.value)
    (tmp_path / "main.xsl").write_text(sheet.replace(str(secret), "secret.xsl"))
    with pytest.raises(PipeletConfigurationError, match=f"<xsl:{tag}"):
        configured(XsltTransform, xslFile=str(tmp_path / "main.xsl"), input="xml", output="o")
