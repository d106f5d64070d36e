"""The keys delta processing adds to a ``[[listener]]`` rule."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router._keys import rule_keys, setting
from listener_router.delta._hash import Content

__all__ = ["DeltaKeys", "STEP"]

STEP = "unchanged"     # what the job log calls a message whose records were all unchanged


@rule_keys("listener", "delta", "Delta processing: a record whose content is the same as at "
           "its last commit through the rule's workflow is not run again "
           "([operations.md](operations.md#delta-processing)).")
@dataclass(frozen=True)
class DeltaKeys:
    """A listener rule's delta processing (``rule.extra("delta")``)."""

    delta: str | None = setting(
        None, "`hash`: a record whose content hash (`delta_attributes`, `delta_attachments`) "
        "equals the one at its last commit through this workflow is not run again; unset: "
        "every message runs", choices=("hash",))
    delta_attributes: tuple[str, ...] | None = setting(
        None, "the attributes that are a record's content; unset (and no "
        "`delta_attachments`): every attribute and attachment")
    delta_attachments: tuple[str, ...] | None = setting(
        None, "the attachments that are a record's content; unset (and no "
        "`delta_attributes`): every attribute and attachment")
    delta_unchanged: str = setting(
        "skip", "an unchanged record: `skip` (sends nothing) or `route` (to the router rules, "
        "as it is stored)", choices=("skip", "route"))

    @property
    def on(self) -> bool:
        return self.delta == "hash"

    @property
    def content(self) -> Content:
        return Content.of(self.delta_attributes, self.delta_attachments)

    def problem(self) -> str | None:
        if not self.on and (self.delta_attributes is not None or
                            self.delta_attachments is not None or
                            self.delta_unchanged != "skip"):
            return ("delta_attributes, delta_attachments and delta_unchanged take effect with "
                    "delta = \"hash\" only; add it")
        return None
