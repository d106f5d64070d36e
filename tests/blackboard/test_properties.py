"""Property tests: random edits agree with a plain-Python model; records survive storage."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard import Annotation, Blackboard, Literal, PathError

# -- values -------------------------------------------------------------------
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
scalars = st.one_of(texts, st.integers(-2**63, 2**63 - 1), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False))
zones = st.sampled_from([None, dt.timezone.utc, dt.timezone(dt.timedelta(hours=5, minutes=30))])
datetimes = st.builds(lambda d, z: d.replace(tzinfo=z), st.datetimes(), zones)
annotations = st.recursive(
    st.builds(Annotation, st.lists(scalars, max_size=3),
              st.dictionaries(st.sampled_from("xyz"), scalars, max_size=2)),
    lambda inner: st.builds(Annotation, st.lists(scalars, max_size=2), st.none(),
                            st.dictionaries(st.sampled_from("mn"), st.lists(inner, max_size=2),
                                            max_size=2)),
    max_leaves=4)
literals = st.one_of(
    scalars, st.dates(), datetimes,
    st.builds(Literal, st.one_of(scalars, st.dates(), datetimes),
              st.one_of(st.none(), st.sampled_from(["t1", "t2"])),
              st.dictionaries(st.sampled_from(["p", "q"]), st.lists(annotations, max_size=2),
                              max_size=1)))


def lit(value: Any) -> Literal:
    return value if isinstance(value, Literal) else Literal(value)


# -- the reference model ----------------------------------------------------------
class Obj:
    """An object: attrs name → items (Literal or Obj), annotations, attribute annotations."""

    def __init__(self) -> None:
        self.attrs: dict[str, list[Any]] = {}
        self.ann: dict[str, list[Annotation]] = {}
        self.attr_ann: dict[str, dict[str, list[Annotation]]] = {}

    def objects(self, name: str) -> list[Obj]:
        return [v for v in self.attrs.get(name, []) if isinstance(v, Obj)]

    def literals(self, name: str) -> list[Literal]:
        return [v for v in self.attrs.get(name, []) if isinstance(v, Literal)]


NAMES = ["a", "b"]
# Paths: a top-level attribute, or an attribute of sub-object o[k].
value_paths = st.one_of(st.sampled_from(NAMES + ["o"]).map(lambda n: ((), n)),
                        st.tuples(st.integers(0, 2), st.sampled_from(NAMES))
                        .map(lambda kn: ((kn[0],), kn[1])))


def path_text(prefix: tuple[int, ...], name: str, index: int = 0) -> str:
    head = f"o[{prefix[0]}]/" if prefix else ""
    return f"{head}{name}[{index}]"


class Bad(Exception):
    """The model says this operation must raise PathError."""


def resolve(root: Obj, prefix: tuple[int, ...], create: bool) -> Obj:
    if not prefix:
        return root
    objs = root.objects("o")
    if prefix[0] < len(objs):
        return objs[prefix[0]]
    if create and prefix[0] == len(objs):
        new = Obj()
        root.attrs.setdefault("o", []).append(new)
        return new
    raise Bad()


def tidy(obj: Obj, name: str) -> None:
    if name in obj.attrs and not obj.attrs[name]:
        del obj.attrs[name]


ops = st.one_of(
    st.tuples(st.just("set_literals"), value_paths, st.lists(literals, max_size=3)),
    st.tuples(st.just("add_literal"), value_paths, literals),
    st.tuples(st.just("remove_literal"), value_paths, st.integers(0, 3)),
    st.tuples(st.just("remove_literals"), value_paths),
    st.tuples(st.just("add_object")),
    st.tuples(st.just("remove_object"), st.integers(0, 2)),
    st.tuples(st.just("remove_objects")),
    st.tuples(st.just("add_annotation"), st.sampled_from(["", "a[-1]", "o[0]", "o[1]", "o[3]"]),
              st.sampled_from(["n1", "n2"]), annotations),
    st.tuples(st.just("set_annotation"), st.sampled_from(["", "b[-1]", "o[0]"]),
              st.sampled_from(["n1", "n2"]), annotations),
    st.tuples(st.just("remove_annotation"), st.sampled_from(["", "a[-1]", "o[0]", "o[2]"]),
              st.sampled_from(["n1", "n2"])),
)


def ann_target(root: Obj, target: str, create: bool) -> dict[str, list[Annotation]]:
    if target == "":
        return root.ann
    if target.endswith("[-1]"):
        name = target[:-4]
        if create:
            return root.attr_ann.setdefault(name, {})
        return root.attr_ann.get(name, {})
    return resolve(root, (int(target[2:-1]),), create).ann


def apply_model(root: Obj, op: tuple) -> None:
    kind = op[0]
    if kind in ("set_literals", "add_literal"):
        (prefix, name), value = op[1], op[2]
        obj = resolve(root, prefix, create=True)
        if kind == "set_literals":
            kept = obj.objects(name)
            obj.attrs[name] = [lit(v) for v in value] + kept
        else:
            obj.attrs.setdefault(name, []).append(lit(value))
        tidy(obj, name)
    elif kind == "remove_literal":
        (prefix, name), index = op[1], op[2]
        obj = resolve(root, prefix, create=False)
        positions = [i for i, v in enumerate(obj.attrs.get(name, [])) if isinstance(v, Literal)]
        if index >= len(positions):
            raise Bad()
        del obj.attrs[name][positions[index]]
        tidy(obj, name)
    elif kind == "remove_literals":
        prefix, name = op[1]
        obj = resolve(root, prefix, create=False)
        if name in obj.attrs:
            obj.attrs[name] = obj.objects(name)
            tidy(obj, name)
    elif kind == "add_object":
        root.attrs.setdefault("o", []).append(Obj())
    elif kind == "remove_object":
        objs = [i for i, v in enumerate(root.attrs.get("o", [])) if isinstance(v, Obj)]
        if op[1] >= len(objs):
            raise Bad()
        del root.attrs["o"][objs[op[1]]]
        tidy(root, "o")
    elif kind == "remove_objects":
        if "o" in root.attrs:
            root.attrs["o"] = root.literals("o")
            tidy(root, "o")
    elif kind in ("add_annotation", "set_annotation"):
        target, name, ann = op[1:]
        annmap = ann_target(root, target, create=True)
        annmap[name] = (annmap.get(name, []) if kind == "add_annotation" else []) + [ann]
    elif kind == "remove_annotation":
        target, name = op[1:]
        ann_target(root, target, create=False).pop(name, None)


def apply_board(bb: Blackboard, rid: str, op: tuple) -> None:
    kind = op[0]
    if kind in ("set_literals", "add_literal", "remove_literal", "remove_literals"):
        (prefix, name) = op[1]
        path = path_text(prefix, name, op[2] if kind == "remove_literal" else 0)
        args = (op[2],) if kind in ("set_literals", "add_literal") else ()
        getattr(bb, kind)(rid, path, *args)
    elif kind == "add_object":
        bb.add_object(rid, "o")
    elif kind == "remove_object":
        bb.remove_object(rid, f"o[{op[1]}]")
    elif kind == "remove_objects":
        bb.remove_objects(rid, "o")
    elif kind in ("add_annotation", "set_annotation"):
        getattr(bb, kind)(rid, op[1] or None, op[2], op[3])
    elif kind == "remove_annotation":
        bb.remove_annotation(rid, op[1] or None, op[2])


def render_model(obj: Obj) -> dict:
    out: dict[str, Any] = {"ann": {k: v for k, v in obj.ann.items() if v}}
    for name in obj.attrs:
        out[name] = (obj.literals(name), [render_model(o) for o in obj.objects(name)])
    for name, annmap in obj.attr_ann.items():
        if any(annmap.values()):
            out[f"{name}[-1]"] = {k: v for k, v in annmap.items() if v}
    return out


def render_board(bb: Blackboard, rid: str, prefix: str = "") -> dict:
    out: dict[str, Any] = {"ann": {n: bb.get_annotations(rid, prefix or None, n)
                                   for n in bb.annotation_names(rid, prefix or None)}}
    for name in bb.attribute_names(rid, prefix or None):
        path = f"{prefix}/{name}" if prefix else name
        out[name] = (bb.get_literals(rid, path),
                     [render_board(bb, rid, f"{path}[{k}]") for k in range(bb.object_size(rid, path))])
    if not prefix:
        for name in NAMES + ["o"]:
            names = bb.annotation_names(rid, f"{name}[-1]")
            if names:
                out[f"{name}[-1]"] = {n: bb.get_annotations(rid, f"{name}[-1]", n) for n in names}
    return out


def run_ops(bb: Blackboard, rid: str, sequence: list[tuple]) -> Obj:
    model = Obj()
    for op in sequence:
        before = render_board(bb, rid)
        try:
            apply_model(model, op)
        except Bad:
            with pytest.raises(PathError):
                apply_board(bb, rid, op)
            assert render_board(bb, rid) == before  # a refused operation changes nothing
            continue
        apply_board(bb, rid, op)
        assert render_board(bb, rid) == render_model(model), op
    return model


@given(st.lists(ops, max_size=25))
def test_random_edits_agree_with_the_reference_model(sequence: list[tuple]) -> None:
    bb = Blackboard.local()
    bb.create("r")
    run_ops(bb, "r", sequence)


_ids = itertools.count()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, max_size=15), st.dictionaries(st.sampled_from(["n", "m"]), st.binary(max_size=50),
                                                   max_size=2))
def test_a_record_committed_to_sqlite_loads_back_equal(sqlite_url: str, sequence: list[tuple],
                                                       blobs: dict[str, bytes]) -> None:
    rid = f"rec-{next(_ids)}"
    with Blackboard.connect(sqlite_url) as writer:
        writer.create(rid)
        model = run_ops(writer, rid, sequence)
        for name, data in blobs.items():
            writer.set_attachment(rid, name, data)
        original = writer.export_records([rid])[0]
        writer.commit(rid)
    with Blackboard.connect(sqlite_url) as reader:
        reader.load(rid)
        loaded = reader.export_records([rid])[0]
        assert loaded["doc"] == original["doc"]
        assert loaded["attachments"] == original["attachments"] == blobs
        assert render_board(reader, rid) == render_model(model)


top_writes = st.lists(st.one_of(
    st.tuples(st.just("set_literals"), st.sampled_from(NAMES + ["o"]), st.lists(literals, max_size=3)),
    st.tuples(st.just("add_literal"), st.sampled_from(NAMES + ["o"]), literals),
    st.tuples(st.just("set_attributes"), st.sampled_from(NAMES + ["o"]),
              st.lists(st.one_of(texts, st.integers(-2**63, 2**63 - 1)), min_size=1, max_size=3)),
), max_size=8)


@given(st.lists(ops, max_size=15), top_writes)
def test_deferred_writes_on_an_unparsed_record_equal_the_same_writes_parsed(
        sequence: list[tuple], writes: list[tuple]) -> None:
    source = Blackboard.local()
    source.create("r")
    run_ops(source, "r", sequence)
    item = source.export_records(["r"], encoded=True)[0]
    lazy, parsed = Blackboard.local(), Blackboard.local()
    lazy.import_records([dict(item)], changed=False)
    parsed.import_records([dict(item)], changed=False)
    parsed.document("r")  # parse this one up front
    for board in (lazy, parsed):
        for kind, name, arg in writes:
            if kind == "set_attributes":
                board.set_attributes("r", {name: arg})
            else:
                getattr(board, kind)("r", name, arg)
    assert lazy._entries["r"]._doc is None
    shipped = lazy.export_records(["r"], encoded=True)[0]["doc"]  # replayed on a throw-away parse
    assert orjson.loads(shipped) == parsed.document("r")
    assert lazy.document("r") == parsed.document("r")             # replayed at the parse
