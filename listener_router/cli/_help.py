"""What ``chalk COMMAND --help`` says: a description and examples per subcommand.

Kept apart from the parser so a new subcommand adds its text here; a test
checks that every subcommand has both and that every example parses.
"""

from __future__ import annotations

import argparse
import shlex
import textwrap

__all__ = ["HELP", "describe", "examples"]

# command: (description, examples — one "chalk …" line each, a comment after " # ")
HELP: dict[str, tuple[str, str]] = {
    "run": (
        "Run the service: consume record-ID messages from the listener queues, run each "
        "message's workflow on its records, commit them and route the results.  Ctrl-C or "
        "SIGTERM finishes the batch in hand and stops.",
        "chalk run                                # chalk.toml in this directory\n"
        "chalk run --config prod.toml --http 127.0.0.1:9187   # with metrics and the dashboard\n"
        "chalk run --local --idle-exit 30         # no Spark, stop after 30 s without messages",
    ),
    "push": (
        "Store records from a JSON Lines file on the blackboard and publish their IDs to a "
        "queue, one message per --per-message IDs (or publish IDs alone with --id).  Without "
        "--queue it publishes to the queue the listener rules read (with several, say "
        "which); a queue no rule reads takes --force.  --ids prints the message IDs (what "
        "chalk jobs cancel takes).",
        "chalk push records.jsonl                 # store, publish to the listened queue\n"
        "chalk push records.jsonl --ids           # ...and print each message's ID\n"
        "chalk push records.jsonl --queue orders.in --per-message 100\n"
        "chalk push crawl.jsonl --queue web.in --source web   # records of source web (a crawl sees them)\n"
        "chalk push --id doc-1 --id doc-2 --operation DELETE   # IDs only, no records stored",
    ),
    "process": (
        "Run one workflow over a JSON Lines file of records without a broker: load, run, "
        "commit to the configured store, and optionally write the results.",
        "chalk process --workflow Demo --input records.jsonl --output out.jsonl\n"
        "chalk process --workflow Demo --input records.jsonl --local   # no Spark",
    ),
    "queue": (
        "Pause or resume a queue's lane on every member of the cluster, or list the lanes "
        "with their flow control (priority, rate limit, order, back-pressure).  A paused lane "
        "finishes its batches in flight and takes nothing new: its messages wait in "
        "RabbitMQ, also across restarts, until it is resumed.",
        "chalk queue list                         # every lane, paused or running\n"
        "chalk queue pause orders.in --reason 'supplier API down'\n"
        "chalk queue resume orders.in\n"
        "chalk queue list --json                  # one JSON object per lane",
    ),
    "validate": (
        "Check workflow files (one file, or every *.xml and *.bpel under a directory); "
        "prints each error as file:line: message and exits 1 when there is any.",
        "chalk validate workflows/\n"
        "chalk validate --summary legacy/pipelines/   # unknown pipelets grouped: the migration list",
    ),
    "graph": (
        "Draw a workflow's control-flow graph; the output file's extension picks the format "
        "(.dot, .svg, .png).  A workflow with errors is drawn too, each error on the activity "
        "it is in (an <if> with a bad <condition>) in red, and exits 1 as chalk validate "
        "does; errors in no activity (a <variable>) are in a note.",
        "chalk graph workflows/demo.xml           # dot text on stdout\n"
        "chalk graph workflows/demo.xml -o demo.svg",
    ),
    "status": (
        "Show queue depths and rates (a dead-letter queue counts its letters in the queue and "
        "those moved into the store), the store (records, processed and unsent messages, "
        "leases), the cluster's members and leader, each workflow's running version, and the "
        "job log's statistics per queue and workflow.  --json prints it all as one object.",
        "chalk status\n"
        "chalk status --since 30m\n"
        "chalk status --config prod.toml --json",
    ),
    "jobs": (
        "The job log: each message's steps (received, each attempt, retried, dead-lettered, "
        "replayed, committed) and chalk process runs, oldest first, filtered by state, queue, "
        "workflow, record, message and time; --follow then prints new entries as they come.  "
        "Attempts are numbered from 1; --json prints one array of steps, --json-lines one a line.  "
        "chalk jobs cancel cancels messages (by ID, by record, or a scheduled job's tick) on "
        "every member: one not yet run is acked without running, one in flight ends before "
        "its next pipelet call and nothing of it is committed; the cancellation is kept, so "
        "neither a restart nor a redelivery brings the message back.  A message ID Chalk "
        "does not know (a typo, or one not yet published: --ahead) is refused.  A record's "
        "cancellation holds for the messages naming it queued now; --lasting (or --for) "
        "also for later ones.  chalk jobs cancellations lists those in force; chalk jobs "
        "uncancel withdraws one, uncancel --all every one.",
        "chalk jobs\n"
        "chalk jobs --record doc-17               # every step of the messages naming doc-17\n"
        "chalk jobs --state dead,retrying --since 2h\n"
        "chalk jobs --queue chalk.in --follow --json-lines\n"
        "chalk jobs cancel push:3f2a9c push:77b1e0   # these messages\n"
        "chalk jobs cancel --record doc-17           # the messages naming doc-17 queued now\n"
        "chalk jobs cancel --record doc-17 --for 2h  # ...and those published in 2 hours\n"
        "chalk jobs cancel batch-42 --ahead          # a message not published yet\n"
        "chalk jobs cancellations                    # those in force\n"
        "chalk jobs uncancel --all\n"
        "chalk jobs cancel --schedule nightly --tick 2026-11-27T02:00:00Z   # one tick's messages",
    ),
    "schedules": (
        "List the scheduled jobs ([[schedule]] entries) with their queue, workflow, last run "
        "and next run; the cluster's leader runs them.  --json prints one array of schedules.",
        "chalk schedules\n"
        "chalk schedules --config prod.toml --json",
    ),
    "dlq": (
        "Dead letters of the listener queues: list, show one in full, replay (back to its "
        "queue, attempts reset) or purge.  Browsing moves them into the store; nothing is "
        "redelivered by looking.  A message ID may be given by a unique start of it (whole, "
        "or after a ':'); list and show take --json (one array) and --json-lines.  Replaying "
        "or purging every dead letter takes --all, and a yes on the terminal (or --yes).",
        "chalk dlq list\n"
        "chalk dlq list --json\n"
        "chalk dlq show 3f2a9c                    # one dead letter by (the start of) its ID\n"
        "chalk dlq replay 3f2a9c                  # that one, after fixing the cause\n"
        "chalk dlq replay --all --queue chalk.in  # every one of chalk.in (asks first)\n"
        "chalk dlq purge --all --yes --queue chalk.in",
    ),
    "events": (
        "Print the cluster's events (records committed or invalidated, messages dead-lettered, "
        "topology changes) as they are published on the events exchange; events are not "
        "stored, so only those published while following are shown.",
        "chalk events --follow                    # everything, one line each; Ctrl-C stops\n"
        "chalk events --follow --pattern 'message.dead_lettered.#' --json-lines\n"
        "chalk events --follow --pattern topology.changed --count 1",
    ),
    "reprocess": (
        "Send stored records through a workflow again (a fixed workflow, a new pipelet): "
        "walk the store by ID prefix, source or XPath, or the IDs listed in a file, and "
        "publish one message a record to a queue whose listener rule runs the workflow, at "
        "most --rate a second.  The run's cursor is saved after every confirmed part: after a "
        "crash or Ctrl-C the same command (or --resume RUN) goes on from it, and the service "
        "drops what is published twice, so each record runs once per run.",
        "chalk reprocess --workflow Welcome                   # every stored record\n"
        "chalk reprocess --workflow Welcome --prefix doc- --rate 500\n"
        "chalk reprocess --workflow Welcome --xpath '$record/Val[@key=\"lang\"] = \"de\"'\n"
        "chalk reprocess --workflow Welcome --ids-from failed.txt --queue hello.in\n"
        "chalk reprocess --resume 3f2a9c1e                    # go on after Ctrl-C or a crash\n"
        "chalk reprocess --list --json",
    ),
    "delta": (
        "Crawls of a source, for delta processing: start marks a full crawl, every record of "
        "the source pushed (chalk push --source) or brought by a message through a rule with "
        "delta = \"hash\" is seen in it; finish publishes a DELETE message to the crawl's "
        "queue for each stored record of the source it did not see, behind the crawl's own "
        "messages, and the service deletes (and routes) each exactly once — one whose record "
        "was seen by then (its message was still queued) is dropped.  finish resumes where a "
        "killed one stopped.  abandon ends a crawl without deleting anything for it.  status "
        "shows the crawls: seen, looked at, deletions published, deleted, kept, pending.",
        "chalk delta start web                     # a crawl of source web begins\n"
        "chalk delta start web --queue web.in --restart   # abandon the running one, begin anew\n"
        "chalk delta finish web                    # delete what the crawl did not see\n"
        "chalk delta abandon web                   # or give it up: nothing is deleted\n"
        "chalk delta status\n"
        "chalk delta status web --json",
    ),
    "demo": (
        "Push sample records through the shipped demo workflow on a local broker and Spark, "
        "and report what happened: the cold start (Spark, and warm-up records in small jobs) "
        "and the steady rate of the records timed after it, apart.  CHALK_BROKER_URL points "
        "it at another broker.",
        "chalk demo                               # 20,000 records timed, after 3,000 warming up\n"
        "chalk demo --records 100000 --warmup 10000",
    ),
    "subscribe": (
        "Run a journal subscriber agent: read the journal's stream from the subscriber's "
        "stored offset, apply the entries in batches through a Python callable or a "
        "workflow, and store the offset in the same transaction as the effects, so each "
        "entry is applied exactly once.  A failing entry goes to the subscriber's error "
        "queue after its retries, or blocks it.",
        "chalk subscribe --subscriber index      # a [[subscriber]] of the configuration\n"
        "chalk subscribe --journal search --subscriber lake --store sqlite:///lake.db "
        "--apply lake:apply --start first\n"
        "chalk subscribe --subscriber index --idle-exit 5",
    ),
    "journal": (
        "Look after journal subscribers: status (running, blocked, stopped or silent; offset, "
        "lag, errors, last seen; a [[subscriber]] of the configuration is shown stopped, with "
        "its lag, while no agent runs it), "
        "rewind one to a point (first, last, next, an offset or a time; it applies again "
        "from there, once), skip or retry the entry a blocked one is stuck on, list its "
        "errors.",
        "chalk journal status\n"
        "chalk journal status --journal search --json\n"
        "chalk journal rewind --subscriber index --to first\n"
        "chalk journal skip --subscriber index\n"
        "chalk journal errors --subscriber index --limit 20 --json",
    ),
}


def examples(command: str) -> list[list[str]]:
    """The example command lines of ``command`` as arguments (after ``chalk``, no comment)."""
    return [shlex.split(line.split(" # ")[0])[1:] for line in HELP[command][1].splitlines()]


def describe(subparsers: argparse._SubParsersAction) -> None:
    """Give every subcommand its description and examples (``--help`` shows them)."""
    for command, parser in subparsers.choices.items():
        if command in HELP:
            description, lines = HELP[command]
            parser.description = textwrap.fill(description, 78)
            parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines.splitlines())
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
