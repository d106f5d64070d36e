"""The docs site builds: ``mkdocs build --strict`` over docs/, as mkdocs.yml at the root says.

Strict mode turns mkdocs' warnings into a failed build, and mkdocs.yml makes a warning of
every link to a missing page or file, every link to an anchor a page does not have, and
every page under docs/ missing from the navigation.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_strictly_with_every_page_in_the_nav(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    for page in pages:
        built = site / (page.removesuffix(".md") + "/index.html"
                        if page != "index.md" else "index.html")
        assert built.is_file(), page
    assert (site / "dashboard.png").is_file()          # images travel with their pages


def test_the_configuration_makes_every_problem_fail_the_build() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    checks = config["validation"]
    assert {checks[k] for k in ("omitted_files", "absolute_links", "unrecognized_links",
                                "anchors")} == {"warn"}
    assert checks["links"]["not_found"] == "warn"
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(_nav_pages(config["nav"])) == pages
