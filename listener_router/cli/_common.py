"""What every subcommand shares: its settings, read once from ``--config`` and its options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from listener_router._loader import load_settings
from listener_router._settings import Settings

__all__ = ["JOB_STATES", "cmd_with_settings", "settings_for"]

# What ``chalk jobs --state`` takes: each step a message's life can show (``received`` the
# taking up of an attempt; ``deleted`` a delta crawl's DELETE that committed; ``replayed``
# and ``purged`` also a dead letter replayed or purged since).
JOB_STATES = ("received", "committed", "unchanged", "deleted", "retrying", "dead", "duplicate",
              "cancelled", "replayed", "purged", "processed", "failed", "crashed")


def settings_for(args: argparse.Namespace) -> Settings:
    """The settings of ``--config`` (or ``./chalk.toml``), with the command's options over them
    (``--workflows``, ``--local``, ``--blackboard``, ``--http``)."""
    settings = load_settings(args.config)
    overrides: dict[str, Any] = {}
    if getattr(args, "workflows", None):
        overrides["workflows_dir"] = args.workflows
    if getattr(args, "local", False):
        overrides["runner"] = "local"
    if getattr(args, "blackboard", None):
        overrides["blackboard_url"] = args.blackboard
    if getattr(args, "http", None):
        overrides["http_listen"] = args.http  # [http] listen
    return settings.with_overrides(**overrides)


def cmd_with_settings(command: Callable[[Settings, argparse.Namespace], int]
                      ) -> Callable[[argparse.Namespace], int]:
    """A subcommand of another module, called with the settings read for its options."""
    return lambda args: command(settings_for(args), args)
