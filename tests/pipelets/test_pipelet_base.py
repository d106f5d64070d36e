from __future__ import annotations

import pytest

from pipelets import Pipelet, PipeletConfig, PipeletConfigurationError, PipeletError


def test_settings_convert_text_from_xml():
    s = PipeletConfig("P", {"b": "Yes", "n": " 3 ", "names": "a, b ,", "one": "x", "m": {"k": "v"}})
    assert s.boolean("b") is True
    assert s.integer("n") == 3
    assert s.names("names") == ["a", "b"]
    assert s.values("one") == ["x"]
    assert s.mapping("m") == {"k": "v"}
    assert s.integer("missing", default=None) is None


def test_settings_errors_name_the_pipelet_and_parameter():
    with pytest.raises(PipeletConfigurationError) as err:
        PipeletConfig("MyPipelet", {"n": "3.5"}).integer("n")
    assert str(err.value).startswith("MyPipelet: parameter 'n'")


def test_settings_refuse_a_setting_given_under_two_names():
    with pytest.raises(PipeletConfigurationError) as err:
        PipeletConfig("P", {"input": "a", "inputName": "b"}).name("input", "inputName")
    assert "given twice" in str(err.value)


def test_base_configure_rejects_unknown_names_and_non_mappings():
    class P(Pipelet):
        parameters = frozenset({"a"})

    with pytest.raises(PipeletConfigurationError) as err:
        P().configure({"a": 1, "b": 2})
    assert "b" in str(err.value)
    with pytest.raises(PipeletConfigurationError):
        P().configure(["a"])  # type: ignore[arg-type]


def test_record_context_names_the_record_and_keeps_the_cause():
    p = Pipelet()
    with pytest.raises(PipeletError) as err:
        with p.record("doc-17"):
            raise KeyError("boom")
    assert err.value.record_id == "doc-17"
    assert "'doc-17'" in str(err.value)
    assert isinstance(err.value.__cause__, KeyError)


def test_process_names_the_failing_record_and_keeps_the_cause():
    class Picky(Pipelet):
        def process_record(self, blackboard, record_id):
            if record_id == "b":
                raise ValueError("no b here")
            if record_id == "c":
                raise PipeletError("c is bad")  # its own error, without a record ID
            return None

    with pytest.raises(PipeletError) as err:
        Picky().process(None, ["a", "b"])  # type: ignore[arg-type]
    assert err.value.record_id == "b" and err.value.pipelet == "Picky"
    assert str(err.value) == "Picky: record 'b': no b here"
    assert isinstance(err.value.__cause__, ValueError)
    with pytest.raises(PipeletError) as err:
        Picky().process(None, ["a", "c"])  # type: ignore[arg-type]
    assert err.value.record_id == "c" and str(err.value) == "c is bad"
