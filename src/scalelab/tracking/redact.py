"""Credentials in a tracking URI (``http://user:password@host``, ``postgresql://u:p@db/x``)
never reach a message, a log line, a tag or an artifact: everything that prints or records a
URI, or a command line that may hold one, passes it through :func:`redact` first."""

from __future__ import annotations

import logging
import re

# scheme://user:password@  ->  scheme://user:***@  (a bare user@ carries no secret); also in
# Hydra's escaped form of an override, scheme\://user\:password@, as a multirun prints it
_USERINFO = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*\\?://[^:/@\s'\"\\]*)(?P<sep>\\?:)[^/\s'\"]*@")


def redact(text: object) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    return _USERINFO.sub(r"\g<head>\g<sep>***@", str(text))


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message: Hydra's launch lines (``#0 : <the
    job's overrides>``) and any library's log line (conf/hydra/default.yaml attaches it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True
