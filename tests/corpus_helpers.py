"""The small demo corpus, built (cached) and published to the shared test store (cached): what the
demo end-to-end test and the in-environment harness test both start from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

CACHE = Path(os.environ.get("ROLLSTACK_DEMO_TEST_CACHE", "/var/cache/rollstack/demo-test"))


def published_corpus(log: Callable[[str], None]) -> tuple[object, str]:
    """(the corpus, the store spec it is published to)."""
    from rollstack_corpus.cache import ensure_corpus
    from rollstack_corpus.publish import publish_corpus_groups
    from rollstack.store import open_store

    corpus = ensure_corpus(None, True, log)
    spec = f"oci:{CACHE / 'store'}"
    store = open_store(spec)
    try:
        publish_corpus_groups(corpus, store, spec, CACHE / "published.json", CACHE / "scratch", log)
    finally:
        store.close()
    return corpus, spec
