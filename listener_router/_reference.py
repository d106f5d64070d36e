"""docs/configuration.md, written from the settings' declarations (``_settings``, ``_keys``,
and each plug-in's sections).

``docs/config_doc.py`` writes the file; ``tests/test_docs.py`` fails when the
file differs from :func:`configuration_reference`, so the reference cannot
drift from the code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from listener_router._keys import Key, env_names, key_of, kind_of, toml_text, type_name
from listener_router._loader import Part, parts
from listener_router._settings import rule_extras

__all__ = ["configuration_reference"]

_INTRO = """\
# Configuration reference

<!-- Written by `.venv/bin/python docs/config_doc.py` from the settings' declarations in
listener_router/_settings.py and each feature's settings module; tests/test_docs.py fails
when it is stale. Do not edit. -->

Every `chalk` command reads `chalk.toml` in the working directory (or the
file `--config FILE` names) and then the environment. Every key is
optional: with no file at all Chalk runs on one machine (SQLite
`chalk.db`, Spark `local[*]`, RabbitMQ on localhost). Unknown sections and
keys are errors that name the file, the line and the known keys; a file
with several mistakes reports every one of them at once.

**Environment.** Each key can be set as `CHALK_<SECTION>_<KEY>` (upper
case), which wins over the file: strings as they are
(`CHALK_BROKER_URL=amqp://user:pw@host/%2F`), other types in TOML's
syntax (`CHALK_ENGINE_LOCAL_BELOW=1000`, `CHALK_ENGINE_DATAFRAME_FORMS=false`,
`CHALK_SPARK_CONF='{ "spark.executor.memory" = "4g" }'`). The lists of rules
are one variable each, a TOML array of inline tables that replaces the
file's rules (`CHALK_LISTENER='[{ queue = "in", workflow = "Add" }]'`). An
empty variable counts as unset. A variable that starts like a section
(`CHALK_ENGINE_…`) but names no key of it is ignored with a warning.

Settings are read once, when a command starts; a running service picks up
changed workflow files, but not a changed configuration or changed pipelet
code: restart it for those.
"""


def _rule_of(kind: Any, key: Key) -> str:
    text = type_name(kind)
    if key.parse is not None:  # read from another form as well (``every = "30s"``)
        text = f"{getattr(key.parse, 'accepts', 'string')} or {text}"
    if key.choices:
        text += ": " + " or ".join(f"`{toml_text(c)}`" for c in key.choices)
    if key.minimum is not None:
        text += f", {'>' if key.positive else '≥'} {key.minimum:g}"
    return text


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _shown(value: Any, section: str = "") -> str:
    if value is dataclasses.MISSING:
        return f"`{section}<N>` (the rule's position)"
    if value is None:
        return "unset"
    return f"`{_cell(toml_text(value))}`"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    heads: tuple[str, ...] = ("key", "type", "default", "environment", "meaning")
    if rows and len(rows[0]) == 4:
        heads = ("key", "type", "default", "meaning")
    lines = [f"| {' | '.join(heads)} |", "|" + " --- |" * len(heads)]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return lines


def _example(section: str, items: list[tuple[str, Any]], array: bool) -> list[str]:
    lines = [f"[[{section}]]" if array else f"[{section}]"]
    for name, value in items:
        if value is None or value is dataclasses.MISSING:
            lines.append(f"# {name} = …")
        elif isinstance(value, dict):
            lines.append(f"{name} = {{}}" if not value else f"{name} = {toml_text(value)}")
        else:
            lines.append(f"{name} = {toml_text(value)}")
    return lines


def _list(part: Part) -> tuple[list[str], list[str]]:
    """The reference and the example of a ``[[section]]`` list."""
    section, rules = part.name, part.rules
    assert rules is not None
    (env_key,) = part.env_keys()
    out = [f"## [[{section}]]", "", part.doc, "",
           f"Without any `[[{section}]]`: {part.empty}. Environment: "
           f"`{env_names(env_key)[0]}` (every rule at once).", ""]
    rows: list[tuple[str, ...]] = []
    items = []
    default_rules = part.default or ()
    for rf in dataclasses.fields(rules):
        rkey = key_of(rf)
        if rkey is None:
            continue
        kind = kind_of(rules, rf.name)
        rows.append((f"`{rf.name}`", _rule_of(kind, rkey), _shown(_default(rf), section),
                     _cell(rkey.doc)))
        items.append((rf.name, getattr(default_rules[0], rf.name) if default_rules
                      else _default(rf)))
    notes: list[str] = []
    has_extras = "extras" in {f.name for f in dataclasses.fields(rules)}
    for extra in rule_extras(section) if has_extras else []:
        names = []
        for rf, rkey in extra.keys():
            rows.append((f"`{rf.name}`", _rule_of(kind_of(extra.cls, rf.name), rkey),
                         _shown(_default(rf), section), _cell(rkey.doc)))
            items.append((rf.name, _default(rf)))
            names.append(f"`{rf.name}`")
        notes += [f"{', '.join(names)}: the `{extra.name}` plug-in's keys. {extra.doc}", ""]
    lines = _example(section, items, array=True)
    if not default_rules:  # none by default: the example is commented out
        lines = [line if line.startswith("#") else f"# {line}" for line in lines]
    return out + _table(rows) + [""] + notes, lines


def _table_section(part: Part) -> tuple[list[str], list[str]]:
    """The reference and the example of a ``[section]`` table."""
    section = part.name
    out = [f"## [{section}]", "", part.doc, ""]
    out += _table([(f"`{k.name}`", _rule_of(kind_of(part.owner, g.name), k),
                    _shown(_default(g)), ", ".join(f"`{n}`" for n in env_names(k)),
                    _cell(k.doc)) for g, k in part.keys]) + [""]
    return out, _example(section, [(k.name or g.name, _default(g)) for g, k in part.keys],
                         array=False)


def configuration_reference() -> str:
    """The text of docs/configuration.md."""
    out = [_INTRO]
    example: list[str] = []
    for part in parts():
        text, lines = _list(part) if part.rules is not None else _table_section(part)
        out += text
        example += [""] + lines
    out += ["## Every key with its default", "",
            "The file below is what Chalk uses when there is none (commented keys have no "
            "default).", "", "```toml", *example[1:], "```", ""]
    return "\n".join(out)
