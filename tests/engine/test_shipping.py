"""What a cluster master needs beyond local[*], without a cluster: which pipelet
modules travel to executors, the zips they travel in, the working directory
of a partition, and the session's settings for a cluster master."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import BPEL_HEADER

from engine import load_workflow
from engine._session import _cores
from engine._shipping import _zip, local_modules
from engine._worker import working_directory

PIPELET = '''from pipelets import Pipelet


class Tag(Pipelet):
    def process(self, blackboard, ids):
        return ids
'''


def _invoke(name: str, cls: str, **params: str) -> str:
    conf = "".join(f'<proc:param name="{k}">{v}</proc:param>' for k, v in params.items())
    return (f'<extensionActivity><proc:invokePipelet name="{name}"><proc:pipelet class="{cls}"/>'
            f"<proc:configuration>{conf}</proc:configuration></proc:invokePipelet></extensionActivity>")


@pytest.fixture
def restore_imports() -> Any:
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_only_the_workflows_own_pipelet_modules_travel(tmp_path: Path, restore_imports: Any) -> None:
    (tmp_path / "ship_me_module.py").write_text(PIPELET)
    package = tmp_path / "ship_me_package"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "tags.py").write_text(PIPELET)
    (package / "inner" / "words.txt").write_text("data next to code travels too\n")
    path = tmp_path / "wf.xml"
    path.write_text(BPEL_HEADER.format(name="Ship") + "<sequence>"
                    + _invoke("a", "ship_me_module.Tag")
                    + _invoke("b", "ship_me_package.inner.tags.Tag")
                    + _invoke("c", "pipelets.text.Lowercase", attribute="t")  # installed: the workers have it
                    + "</sequence></process>")
    modules = local_modules(load_workflow(path))
    assert modules == {
        "ship_me_module": [str((tmp_path / "ship_me_module.py").resolve())],
        "ship_me_package": [str(package.resolve())],
    }
    target = tmp_path / "zips"
    zipped = _zip("ship_me_package", modules["ship_me_package"], str(target))
    assert Path(zipped).name.startswith("chalk-ship_me_package-")
    with zipfile.ZipFile(zipped) as z:
        names = set(z.namelist())
    assert {"ship_me_package/", "ship_me_package/inner/", "ship_me_package/inner/tags.py",
            "ship_me_package/inner/words.txt"} <= names
    assert _zip("ship_me_package", modules["ship_me_package"], str(target)) == zipped  # same content, same zip


def test_a_partition_runs_in_the_workflows_directory_with_relative_imports_kept(
    tmp_path: Path, restore_imports: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = tmp_path / "executor"
    executor.mkdir()
    with zipfile.ZipFile(executor / "shipped.zip", "w") as z:
        z.writestr("shipped_here.py", "WHERE = 'zip'\n")
    driver = tmp_path / "driver"
    driver.mkdir()
    monkeypatch.chdir(executor)
    sys.path.insert(1, "./shipped.zip")  # as Spark adds files shipped with the job
    with working_directory(str(driver)):
        assert os.getcwd() == str(driver)
        import shipped_here  # type: ignore[import-not-found]

        assert shipped_here.WHERE == "zip"
    assert os.getcwd() == str(executor)
    assert str(executor / "shipped.zip") in sys.path
    with working_directory(str(tmp_path / "not-on-this-host")):
        assert os.getcwd() == str(executor)


def test_a_cluster_master_leaves_parallelism_to_the_executors_cores() -> None:
    assert _cores("local[3]") == 3
    assert _cores("local[*]") == (os.cpu_count() or 2)
    assert _cores("spark://10.0.0.1:7077") is None
    assert _cores("yarn") is None
