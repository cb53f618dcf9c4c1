"""Where the package keeps files: bundled data, and the user's cache directory."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PACKAGE_DATA = Path(__file__).parent / "data"
CACHE_ENV = "HOMER_INTEGRATIONS_CACHE"


def cache_root() -> Path:
    """Root of everything the package caches: ``$HOMER_INTEGRATIONS_CACHE`` or the platform cache dir."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path(platformdirs.user_cache_dir("homer-integrations"))


def bundled_text(name: str = "prideprejudice") -> str:
    """A bundled public-domain novel: ``prideprejudice`` or ``northangerabbey``."""
    path = PACKAGE_DATA / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"no bundled text named {name!r} (looked for {path})")
    return path.read_text(encoding="utf-8")
