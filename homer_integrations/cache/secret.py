"""The secret of a keyed cache (``DocumentCache(keyed=True)``): the key of the HMAC-SHA256 that every
manifest it writes carries and every entry it reads must show.

Why: the manifest's sha256 binds a tensors file to its key, but anyone who can write to a shared
store can also recompute it: another document's tensors under this key, with the manifest rewritten,
pass. A keyed checksum cannot be recomputed without the secret.

Where: by default ``cache_root() / "cache.key"`` on this machine, never inside the store (whoever can
write a shared store can usually read it too); every process that shares the store's entries is given
the same file. It is made on first use (32 random bytes as hex, mode 600, created whole: linked into
place, so two processes starting at once agree on one secret) and trusted only while it is a regular
file of this user's that nobody else can read or write, in a directory nobody else can write;
otherwise ``CacheSecretError`` says why (it is an ``OSError``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import uuid
from pathlib import Path

from homer_integrations.cache.files import kind, read_regular
from homer_integrations.paths import not_private

SECRET_NAME = "cache.key"
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16


class CacheSecretError(PermissionError):
    """The cache's secret file cannot be trusted (not private, not this user's, a link) or read."""


def default_secret_path() -> Path:
    """``cache_root() / "cache.key"``: ``$HOMER_INTEGRATIONS_CACHE`` or the platform cache directory."""
    from homer_integrations.paths import cache_root

    return cache_root() / SECRET_NAME


def load_secret(path: Path) -> bytes:
    """The secret in ``path``, made first if there is none (see the module docstring)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not os.path.lexists(path):
        _create(path)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CacheSecretError(f"the cache secret {path} is {kind(st.st_mode)}, not a regular file")
    why = not_private(st, "chmod 600 it") or _open_directory(path.parent)
    if why:
        raise CacheSecretError(f"the cache secret {path} {why}")
    try:
        secret = bytes.fromhex(read_regular(path, 4096).decode("ascii").strip())
    except (ValueError, UnicodeDecodeError):
        secret = b""
    if len(secret) < MIN_SECRET_BYTES:
        raise CacheSecretError(
            f"the cache secret {path} does not hold at least {MIN_SECRET_BYTES} bytes as hex; remove it to make "
            f"a new one (entries signed with the old one are then recomputed)"
        )
    return secret


def entry_mac(secret: bytes, key: str, sha256: str) -> str:
    """The keyed checksum of an entry: HMAC-SHA256 over its key, a NUL byte and its manifest's sha256 of
    the tensors file (which the reader checks against the file itself)."""
    message = key.encode("utf-8", "surrogatepass") + b"\0" + sha256.encode("ascii", "replace")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _create(path: Path) -> None:
    """Write a new secret to a private temporary file and link it into place: whole or not at all, and
    if another process was first, its secret stays."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(SECRET_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not os.path.lexists(path):
                os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _open_directory(directory: Path) -> str | None:
    """Why others could replace a file in ``directory``, or None."""
    if not hasattr(os, "getuid"):
        return None
    st = os.stat(directory)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"is in {directory}, which others may write (mode {stat.S_IMODE(st.st_mode):o}): they could replace it"
    return None
