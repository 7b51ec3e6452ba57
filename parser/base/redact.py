"""A URL's credentials never reach a message: `redact(text)` masks the password of every URL in it.

Why: a server behind basic auth is configured as `base_url: http://user:password@host:8000`
(aiohttp sends the userinfo as an Authorization header), and every line that named the server
(the preflight's refusal, a request's `BackendError`, the retry line on stderr, a pool's warning,
a calibration's source) printed the password into terminals, logs and results files. Each of
those messages is built through `redact`, which keeps what a reader needs to find the server
(scheme, user, host, port, path) and masks the secret:

    redact("cannot reach http://ann:s3cret@gpu1:8000/v1/models")  # 'cannot reach http://ann:***@gpu1:8000/v1/models'
    redact("GET https://TOKEN@host/health")                         # 'GET https://***@host/health'

A userinfo with no password is masked whole: a token passed as the user name is the secret.
It works on whole messages (an exception's own words may quote the URL), in one linear pass;
text with no `://...@` in it comes back unchanged. It lives on the ground floor because every
floor that names a server (serving, plan, data prep, the scripts) builds such messages.
"""
from __future__ import annotations

import re

# A URL's authority runs from `://` to the first `/`, `?`, `#` or space; its userinfo ends at the
# authority's last `@` (as urllib.parse splits a password holding a bare `@`).
_AUTHORITY_WITH_USERINFO = re.compile(r"://([^/?#\s]*)@")
MASK = "***"


def redact(text: str) -> str:
    """`text` with the password (or a lone user name) of each URL's userinfo replaced by `***`."""
    if "@" not in text:
        return text
    return _AUTHORITY_WITH_USERINFO.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    user, has_password, _ = match.group(1).partition(":")
    return f"://{user}:{MASK}@" if has_password else f"://{MASK}@"
