"""A database URL as it may be printed: never with its password.

Every message that names a store (errors, logs, ``chalk status``) goes
through :func:`safe_url`: SQLAlchemy renders the URL with the password as
``***``, and query parameters that carry a secret (psycopg takes
``?password=…``) lose their value too.  A string SQLAlchemy cannot read is
not printed at all (it may be a password pasted in the wrong place).
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

__all__ = ["hide_url", "safe_url"]

_SECRET_KEYS = ("password", "passwd", "secret", "token", "sslkey")


def safe_url(url: str) -> str:
    """``url`` with its password (and secret query values) shown as ``***``."""
    try:
        parsed = make_url(url)
    except Exception:  # not a URL: say what kind of thing it was, nothing of it
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://(unreadable URL)" if scheme.isidentifier() else "(unreadable URL)"
    hidden = {k: "***" for k in parsed.query if any(s in k.lower() for s in _SECRET_KEYS)}
    if hidden:
        parsed = parsed.update_query_dict(hidden)
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def hide_url(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with ``url`` and its password taken out."""
    if not url:
        return text
    text = text.replace(url, safe_url(url))
    try:
        password = make_url(url).password
    except Exception:
        return text
    return text.replace(str(password), "***") if password else text
