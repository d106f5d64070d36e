"""Headers Chalk writes are Chalk's: ``x-chalk-*`` headers signed with the cluster's secret.

The service reads its own headers back: ``x-chalk-attempts`` on a retry
copy says how many attempts were made, ``x-chalk-queue`` and
``x-chalk-error`` on a dead letter say where it goes back and why it died,
``x-chalk-replays`` counts replays, a crawl's DELETE messages carry
``x-chalk-delta-*``.  A publisher could set any of them: skip the retries,
pick the queue a replay goes to, put words in an operator's error column.
So every message Chalk publishes with ``x-chalk-*`` headers that it reads
back carries ``x-chalk-signature``: an HMAC-SHA256, with the cluster's key
(``chalk_secrets``, made by the first member), of the message ID, the
body's SHA-256 and the ``x-chalk-*`` headers.  On consume (the gather
stage) and when dead letters are moved off ``Q.dlq``, ``x-chalk-*``
headers whose signature does not hold are dropped: the message is taken as
a publisher's first attempt.  Routed messages carry ``x-chalk-source``
unsigned: nothing reads it back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from listener_router.broker import OutMessage
    from listener_router.store import ServiceStore

__all__ = ["PREFIX", "SIGNATURE_HEADER", "HeaderSigner"]

PREFIX = "x-chalk-"
SIGNATURE_HEADER = "x-chalk-signature"
SECRET = "headers"          # the name of the key in chalk_secrets


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=_text)
    return str(value)


def ours(headers: Mapping[str, Any]) -> bool:
    """Whether any header is an ``x-chalk-`` one."""
    return any(key.startswith(PREFIX) for key in headers)


class HeaderSigner:
    """Signs and checks ``x-chalk-*`` headers with one key (see the module doc)."""

    def __init__(self, key: bytes):
        self._key = key

    @classmethod
    def of(cls, store: ServiceStore) -> HeaderSigner:
        """The signer of the cluster whose store this is."""
        return cls(store.secrets.key(SECRET))

    def _digest(self, headers: Mapping[str, Any], message_id: str | None, body: bytes) -> str:
        lines = [message_id or "", hashlib.sha256(body).hexdigest()]
        lines += sorted(f"{k}={_text(v)}" for k, v in headers.items()
                        if k.startswith(PREFIX) and k != SIGNATURE_HEADER)
        return hmac.new(self._key, "\n".join(lines).encode(), hashlib.sha256).hexdigest()

    def signed(self, headers: Mapping[str, Any], message_id: str | None,
               body: bytes) -> dict[str, Any]:
        """``headers`` with the signature of their ``x-chalk-*`` ones (none to sign: as is)."""
        out = {k: v for k, v in headers.items() if k != SIGNATURE_HEADER}
        if ours(out):
            out[SIGNATURE_HEADER] = self._digest(out, message_id, body)
        return out

    def sign(self, message: OutMessage) -> OutMessage:
        """``message`` with its ``x-chalk-*`` headers signed."""
        if not ours(message.headers):
            return message
        return dataclasses.replace(message, headers=self.signed(
            message.headers, message.message_id, message.body))

    def holds(self, headers: Mapping[str, Any], message_id: str | None, body: bytes) -> bool:
        """Whether the ``x-chalk-*`` headers are signed with this key (none: True)."""
        if not ours(headers):
            return True
        given = _text(headers.get(SIGNATURE_HEADER, ""))
        return hmac.compare_digest(given, self._digest(headers, message_id, body))

    def trusted(self, headers: dict[str, Any], message_id: str | None,
                body: bytes) -> dict[str, Any]:
        """``headers`` when their ``x-chalk-*`` ones are signed with this key; else the
        others only (what a publisher set is not taken for Chalk's)."""
        if not headers or not ours(headers) or self.holds(headers, message_id, body):
            return headers
        return {k: v for k, v in headers.items() if not k.startswith(PREFIX)}
