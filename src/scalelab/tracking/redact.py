"""Credentials in a tracking URI (``http://user:password@host``, ``postgresql://u:p@db/x``)
never reach a message, a log line, a tag or an artifact: everything that prints or records a
URI, or a command line that may hold one, passes it through :func:`redact` first."""

from __future__ import annotations

import re

# scheme://user:password@  ->  scheme://user:***@  (a bare user@ carries no secret)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*):[^/\s'\"]*@")


def redact(text: object) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    return _USERINFO.sub(r"\g<head>:***@", str(text))
