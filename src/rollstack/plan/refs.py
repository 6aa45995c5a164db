"""Group references: `repo/attrs:23.2.0` (a tag) or `repo/attrs@sha256:<hex>` (a digest).

Pure parsing, no I/O. A group named `repo/attrs` lives in the store repository `repo/attrs`;
the tag or digest selects one manifest in it. Names follow the OCI distribution grammar
(lowercase path components separated by `/`, each `[a-z0-9]+([._-][a-z0-9]+)*`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollstack.errors import InvalidRequest

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class InvalidReference(InvalidRequest):
    """A group reference that does not parse (raised as `invalid_request`)."""


@dataclass(frozen=True, slots=True)
class GroupRef:
    name: str  # the store repository, e.g. "repo/attrs"
    tag: str | None = None  # e.g. "23.2.0" (None when pinned by digest)
    digest: str | None = None  # "sha256:<hex>" when pinned

    @classmethod
    def parse(cls, text: str) -> "GroupRef":
        """`NAME:TAG`, `NAME@sha256:HEX` or `NAME:TAG@sha256:HEX` (the digest wins).

        A bare NAME means tag `latest`, as with container images."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidReference("a group reference must be a non-empty string")
        text = text.strip()
        digest = None
        if "@" in text:
            text, digest = text.split("@", 1)
            if not _DIGEST_RE.match(digest):
                raise InvalidReference(f"{digest!r} is not a sha256 digest (sha256:<64 hex>)")
        name, tag = text, None
        # A ':' after the last '/' separates the tag (a ':' before it would be a registry port,
        # which group names never carry: the store is chosen separately).
        last = text.rsplit("/", 1)[-1]
        if ":" in last:
            name, tag = text.rsplit(":", 1)
            if not _TAG_RE.match(tag):
                raise InvalidReference(f"{tag!r} is not a valid tag")
        if not _NAME_RE.match(name):
            raise InvalidReference(
                f"{name!r} is not a valid group name (lowercase letters, digits, '.', '_', '-', '/')"
            )
        if digest is None and tag is None:
            tag = "latest"
        return cls(name=name, tag=None if digest else tag, digest=digest)

    @property
    def ref(self) -> str:
        """What to ask the store for: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def __str__(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}"
