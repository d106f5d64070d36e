from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blackboard import Path, PathError, PathStep

names = st.text(st.characters(blacklist_characters="[]/", blacklist_categories=("Cs",)),
                min_size=1, max_size=8).filter(lambda s: s == s.strip() and s.strip() != "")
steps = st.builds(PathStep, names, st.integers(min_value=-1, max_value=50))
paths = st.lists(steps, max_size=6).map(Path)


@given(paths)
def test_a_path_prints_and_parses_back_to_itself(path: Path) -> None:
    text = str(path)
    assert Path(text) == path
    assert str(Path(text)) == text
    assert hash(Path(text)) == hash(path)


@given(paths)
def test_iteration_length_and_getters_agree(path: Path) -> None:
    items = list(path)
    assert len(path) == path.length() == len(items)
    for position, step in enumerate(items):
        assert path.get(position) == path[position] == step
        assert path.name(position) == step.name == step.get_name()
        assert path.index(position) == step.index == step.get_index()


def test_the_index_defaults_to_zero_and_prints_only_when_not_zero() -> None:
    path = Path("attr[1]/sub/leaf[2]")
    assert [(s.name, s.index) for s in path] == [("attr", 1), ("sub", 0), ("leaf", 2)]
    assert str(path) == "attr[1]/sub/leaf[2]"
    assert Path("a[0]") == Path("a")
    assert str(Path("a[0]")) == "a"


def test_attribute_annotation_index_is_minus_one() -> None:
    assert PathStep.ATTRIBUTE_ANNOTATION == -1
    path = Path("a/b[-1]")
    assert path.last == PathStep("b", PathStep.ATTRIBUTE_ANNOTATION)
    assert str(path) == "a/b[-1]"


def test_add_and_up_change_the_path_in_place_and_chain() -> None:
    path = Path()
    assert path.is_empty()
    same = path.add("level1").add("level2", 3).add(PathStep("leaf"))
    assert same is path
    assert str(path) == "level1/level2[3]/leaf"
    assert path.up() is path
    assert str(path.up().add("sibling")) == "level1/sibling"


def test_copy_constructor_child_and_parent_leave_the_original_alone() -> None:
    path = Path("a/b")
    copy = Path(path)
    copy.add("c")
    assert str(path) == "a/b"
    assert str(path.child("x", 2)) == "a/b/x[2]"
    assert str(path.parent()) == "a"
    assert str(path) == "a/b"


def test_paths_and_steps_are_hashable_values() -> None:
    assert {Path("a/b"): 1}[Path("a[0]/b")] == 1
    assert len({PathStep("a"), PathStep("a", 0), PathStep("a", 1)}) == 2
    assert Path("a") != "a"  # a string is not a Path
    assert PathStep("a") != "a"


def test_surrounding_slashes_and_spaces_are_tolerated() -> None:
    assert Path(" /a/b[1]/ ") == Path("a/b[1]")
    assert Path("") == Path() == Path("/")


@pytest.mark.parametrize("text", ["a//b", "a[", "a[x]", "a[1]b", "[1]", "a[-2]", "a/[0]",
                                  "a]b", "a[1][2]"])
def test_malformed_paths_raise_path_error_quoting_the_path(text: str) -> None:
    with pytest.raises(PathError) as caught:
        Path(text)
    assert repr(text) in str(caught.value) or text in str(caught.value)


@pytest.mark.parametrize("name, index", [("", 0), ("a/b", 0), ("a[", 0), (" a", 0), ("a", -2),
                                         ("a", True), ("a", 1.5), (3, 0)])
def test_bad_steps_raise_path_error(name: object, index: object) -> None:
    with pytest.raises(PathError):
        PathStep(name, index)  # type: ignore[arg-type]


def test_out_of_range_positions_and_empty_up_raise_path_error() -> None:
    with pytest.raises(PathError, match="no step 3"):
        Path("a/b").get(3)
    with pytest.raises(PathError, match="empty path"):
        Path().up()
    with pytest.raises(PathError, match="empty path has no last"):
        Path().last  # noqa: B018
    with pytest.raises(PathError):
        Path(42)  # type: ignore[arg-type]
    with pytest.raises(PathError, match="not both"):
        Path().add(PathStep("a"), 1)
