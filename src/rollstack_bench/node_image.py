"""`rollstack bench node --image REF`: the fan-out and burst parts on an imported image.

The image (an OCI layout `oci:DIR[:TAG]`, or a registry reference copied with skopeo, as in
`bench init-image`) is imported as a layer group into the bench's store (`group import`'s
`import_image`) for rollstack, and given as it is to the private containerd (`ctr images
import` of an OCI archive of the layout). Both then run `true` in it: rollstack through
`create(plan)` of a plan over the group (no mutation, agent-sized quotas), containerd through
`ctr run --rm`.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

GROUP = "bench-image/image:1"
CTR_NAME = "docker.io/rollstack/bench-image:1"


def import_group(image: str, spec: str, work: Path) -> dict[str, Any]:
    """Import `image` as the layer group GROUP into the store `spec`."""
    from rollstack.plan.imports import import_image
    from rollstack.store import open_store

    store = open_store(spec)
    try:
        res = import_image(image, GROUP, store, cache_dir=work / "import-cache", work_dir=work)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return {"ref": image, "group": GROUP, "layers": len(res.layers),
            "unpacked_bytes": int(res.payload_bytes)}


def image_plan(resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": "image-task", "groups": [GROUP], "workdir": "/", "resources": resources,
            "timeout": 600}


def layout_archive(image: str, work: Path) -> Path:
    """An OCI archive of the image's layout whose index names it CTR_NAME (for `ctr images
    import`)."""
    from rollstack_bench.init_image import _layout_of

    layout, tag = _layout_of(image, work)
    index = json.loads((layout / "index.json").read_text())
    manifests = [m for m in index["manifests"]
                 if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag] \
        or index["manifests"][:1]
    for m in manifests:
        m["annotations"] = {**(m.get("annotations") or {}),
                            "org.opencontainers.image.ref.name": CTR_NAME,
                            "io.containerd.image.name": CTR_NAME}
    out = Path(tempfile.mkdtemp(prefix="rs-bench-image-", dir=work)) / "image.tar"
    with tarfile.open(out, "w") as t:
        t.add(layout / "oci-layout", arcname="oci-layout")
        t.add(layout / "blobs", arcname="blobs")
        data = json.dumps({**index, "manifests": manifests}).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        import io

        t.addfile(info, io.BytesIO(data))
    return out
