"""Whether a file is this user's own private file: what the keyed cache's secret and ``homer-qa serve``'s
announcement must be before they are trusted. Standard library only: the ``ask`` client imports it."""

from __future__ import annotations

import os
import stat


def not_private(st: os.stat_result, fix: str) -> str | None:
    """Why a file of ``st`` is not this user's own private file (``fix`` ends the reason), or None."""
    if not hasattr(os, "getuid"):  # no POSIX owners and modes (Windows)
        return None
    if st.st_uid != os.getuid():
        return f"belongs to user {st.st_uid}, not to you (user {os.getuid()})"
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):o}: others may read or write it ({fix})"
    return None
