"""`open_store(spec)`: a store from its name (`oci:PATH`, a path, `http(s)://host:port`).

No spec means `$ROLLSTACK_STORE`, else `~/.local/share/rollstack/store` (an OCI layout).
Credentials for a registry come from the URL (`https://user:pass@host`) or from
`ROLLSTACK_REGISTRY_USERNAME` / `ROLLSTACK_REGISTRY_PASSWORD`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from rollstack.errors import InvalidRequest
from rollstack.store.base import ArtifactStore

DEFAULT_STORE = "~/.local/share/rollstack/store"


def default_store_spec(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("ROLLSTACK_STORE") or DEFAULT_STORE


def open_store(spec: str | None = None, *, env: Mapping[str, str] | None = None, **registry_options) -> ArtifactStore:
    """The store named by `spec` (see module docstring). Extra options go to `RegistryStore`."""
    env = os.environ if env is None else env
    spec = (default_store_spec(env) if spec is None else spec).strip()
    if not spec:
        raise InvalidRequest("empty store spec")
    if spec.startswith(("http://", "https://")):
        from rollstack.store.registry import RegistryStore

        parts = urlsplit(spec)
        username = unquote(parts.username) if parts.username else env.get("ROLLSTACK_REGISTRY_USERNAME")
        password = unquote(parts.password) if parts.password else env.get("ROLLSTACK_REGISTRY_PASSWORD")
        host = parts.hostname or ""
        if not host:
            raise InvalidRequest(f"registry URL has no host: {spec!r}")
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        return RegistryStore(url, username=username, password=password, **registry_options)
    if "://" in spec:
        raise InvalidRequest(f"unsupported store {spec!r} (want oci:PATH, a path, or http(s)://host:port)")
    from rollstack.store.ocilayout import OciLayoutStore

    path = spec[4:] if spec.startswith("oci:") else spec
    if not path:
        raise InvalidRequest("oci: store needs a path")
    root = Path(path).expanduser()
    if root.exists() and not root.is_dir():
        raise InvalidRequest(f"store path {root} is not a directory")
    return OciLayoutStore(root)
