"""The service's errors: one family, split by whose fault it is.

::

    ChalkServiceError
    ├── UserError              the input is wrong: fix it (never retried as it is)
    │   ├── ConfigError        chalk.toml or an option
    │   ├── BadMessage         a message that cannot be a unit of work: dead-lettered at once
    │   ├── RecordFileError    a line of a JSON Lines record file
    │   └── CommitRefused      the database refused a batch's data: the batch is split until
    │                          the message that causes it stands alone, and that one fails
    └── InfrastructureError    the input is fine, something around it is not: retry later
        ├── BrokerUnavailable  RabbitMQ unreachable, a lost connection, a publish not confirmed
        ├── StoreUnavailable   the database is down or failed (an outage)
        ├── RecordsBusy        another owner holds or changed records of the batch (leases)
        ├── ExtensionFailed    a commit extension failed: its batch is held, nothing written
        ├── NotLeader          leader work refused: another member leads now (fencing)
        └── RunnerUnusable     the workflow runner cannot run anything any more (stop)

"Retry later" or "dead-letter now" is decided by the class.  Third-party
errors (SQLAlchemy, pika, the blackboard's storage errors) become members of
the family where they are caught: ``store`` for the database,
``broker`` for the broker.  The older names keep their second base
(``ValueError``, ``ConnectionError``, ``RuntimeError``) so code that caught
those still does.
"""

from __future__ import annotations

__all__ = [
    "BadMessage",
    "BrokerUnavailable",
    "ChalkServiceError",
    "CommitRefused",
    "ConfigError",
    "ExtensionFailed",
    "InfrastructureError",
    "NotLeader",
    "RecordFileError",
    "RecordsBusy",
    "RunnerUnusable",
    "StoreUnavailable",
    "UserError",
]


class ChalkServiceError(Exception):
    """Base of every error the listener/router raises on purpose."""


class UserError(ChalkServiceError):
    """The input (configuration, a message, a record file, a record's data) is wrong.

    Retrying it as it is cannot help: a message with it is dead-lettered, a
    command with it exits with the message.
    """


class InfrastructureError(ChalkServiceError):
    """Not the input's fault: the broker, the database or another process. Retry later."""


# -- the user's --------------------------------------------------------------------------
class ConfigError(UserError, ValueError):
    """The configuration file or an option is not usable; the message names the key."""


class BadMessage(UserError, ValueError):
    """The message cannot be processed as sent; the text says why."""


class RecordFileError(UserError, ValueError):
    """A line of a record file is not a record; the message names file and line."""


class CommitRefused(UserError):
    """The database refused to commit a batch's records for their data (not an outage)."""


# -- the infrastructure's ----------------------------------------------------------------
class BrokerUnavailable(InfrastructureError, ConnectionError):
    """The broker cannot be reached, the connection was lost, or a publish was not confirmed."""


class StoreUnavailable(InfrastructureError):
    """The database is unreachable or failed while working (an outage, not the data)."""


class RecordsBusy(InfrastructureError):
    """Another owner holds (or changed) records of the batch; they are tried again later."""


class ExtensionFailed(InfrastructureError):
    """A commit extension raised: the batch's transaction is rolled back and held."""


class NotLeader(InfrastructureError):
    """Leader work refused: this process no longer leads the cluster (its fencing
    epoch is over; another member took over while it was frozen or cut off)."""


class RunnerUnusable(InfrastructureError, RuntimeError):
    """The workflow runner cannot run anything any more (e.g. the SparkContext died)."""
