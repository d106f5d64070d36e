"""The journal page's complete example runs: its configuration, its callable and its commands."""

from __future__ import annotations

import shlex
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from journal_helpers import (  # noqa: F401  (journal_fixture: the journal fixture)
    Journal,
    journal_fixture,
)
from test_docs import blocks_of

from listener_router import load_settings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "journal.md"


def _journal_section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("\n## A complete example\n")
    return text[start:text.index("\n## ", start + 1)]


def _blocks(language: str) -> list[str]:
    return blocks_of(_journal_section(), language)


def _chalk(cwd: Path, line: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line, comments=True)
    assert words[0] == ".venv/bin/chalk", line
    return subprocess.run([sys.executable, "-m", "listener_router", *words[1:]], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def _titles(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT id, title FROM titles"))


def test_the_journal_page_example_runs(journal: Journal, tmp_path: Path) -> None:
    [config_block] = _blocks("toml")
    [callable_block] = _blocks("python")
    [commands] = _blocks("bash")
    # The page's configuration, on this test's broker, database and stream.
    (tmp_path / "chalk.toml").write_text(
        f'[blackboard]\nurl = "{journal.db}"\n[broker]\nurl = "{journal.settings.broker_url}"\n'
        + config_block.replace('name = "search"\n',
                               f'name = "search"\nstream = "{journal.rule.stream}"\n', 1))
    (tmp_path / "search_index.py").write_text(callable_block)
    settings = load_settings(tmp_path / "chalk.toml", env={})
    [rule] = settings.journals
    [sub] = settings.subscribers
    assert (rule.attributes, sub.apply, sub.on_error) == \
        (("title", "lang"), "search_index:apply", "queue")
    journal.rule = rule
    journal.settings = replace(journal.settings, journals=(rule,))
    journal.subscribers.append(sub.id)

    journal.publish([{"id": "a", "attributes": {"title": "Hello", "lang": "en"}},
                     {"id": "b", "attributes": {"title": "Hallo", "lang": "de"}},
                     {"id": "c", "attributes": {"title": "World", "lang": "en"}}])
    journal.publish([{"id": "c", "attributes": {}}], operation="DELETE")

    lines = [line for line in commands.splitlines() if line.strip()]
    assert [shlex.split(line)[1:3] for line in lines] == [
        ["subscribe", "--subscriber"], ["journal", "status"], ["journal", "rewind"],
        ["journal", "errors"], ["journal", "skip"]]
    done = _chalk(tmp_path, lines[0])                       # subscribe
    assert done.returncode == 0, done.stderr
    assert "subscriber index: applied=3" in done.stdout     # a, c, c deleted (b: not English)
    assert _titles(tmp_path / "search-index.db") == {"a": "Hello"}
    done = _chalk(tmp_path, lines[1])                       # status
    assert done.returncode == 0, done.stderr
    assert "index" in done.stdout and "stopped" in done.stdout   # its agent has exited
    done = _chalk(tmp_path, lines[2])                       # rewind to first
    assert done.returncode == 0, done.stderr
    assert "rewound to first" in done.stdout
    done = _chalk(tmp_path, lines[0])                       # applied again, once
    assert "subscriber index: applied=3" in done.stdout, done.stderr
    assert _titles(tmp_path / "search-index.db") == {"a": "Hello"}
    done = _chalk(tmp_path, lines[3])                       # errors: none
    assert done.returncode == 0, done.stderr
    done = _chalk(tmp_path, lines[4])                       # skip: only a blocked one
    assert done.returncode != 0
    assert "subscriber 'index' of journal 'search' is not blocked" in done.stderr


def test_the_entry_in_docs_journal_is_one_a_subscriber_reads() -> None:
    import orjson

    from listener_router.journal import AttachmentRef, Entry

    text = PAGE.read_text(encoding="utf-8")
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    entry = Entry.parse(5, block.encode())
    assert (entry.key, entry.id, entry.op, entry.version) == ("search:17", "doc-1", "UPDATE", 3)
    assert entry.attachment("thumb") == b"hello"
    assert entry.attachments["content"] == AttachmentRef("doc-1", "content", 3, 209715200)
    known = {"seq", "published_at", "journal", "id", "version", "op", "origin", "workflow",
             "committed_at", "attributes", "attachments"}
    assert set(orjson.loads(block)) == known
