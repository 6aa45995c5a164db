"""plan/lowers.py: which descriptors of a group manifest are layers and which are the EROFS
images published beside them; anything odd about an image descriptor makes it ignored."""

from __future__ import annotations

from rollstack.format import LAYER_MEDIA_TYPE
from rollstack.plan import lowers

A, B, IA, IB = ("sha256:" + c * 64 for c in "abcd")


def test_manifest_layers_put_the_images_after_the_layers_and_parse_back() -> None:
    docs = lowers.manifest_layers([(A, 10), (B, 20)], {A: (IA, 4096)})
    assert [d["digest"] for d in docs] == [A, B, IA]
    doc = {"layers": docs}
    assert [(d["digest"], d["size"]) for d in lowers.layer_descriptors(doc)] == [(A, 10), (B, 20)]
    assert all(d["mediaType"] == LAYER_MEDIA_TYPE for d in lowers.layer_descriptors(doc))
    assert lowers.image_descriptors(doc) == {A: (IA, 4096)}


def test_odd_image_descriptors_are_ignored() -> None:
    layer = {"mediaType": LAYER_MEDIA_TYPE, "digest": A, "size": 10}

    def image(**kw: object) -> dict[str, object]:
        d = lowers.descriptor(A, IA, 4096)
        d.update(kw)
        return d

    for odd in (
        image(mediaType="application/vnd.rollstack.erofs.v999"),  # another format version
        image(annotations={lowers.ANN_LAYER: B}),  # names a layer the manifest does not have
        image(annotations={}),
        image(digest="sha256:short"),
        image(size=0),
        image(size=lowers.MAX_IMAGE_BYTES + 1),
        image(size="4096"),
    ):
        doc = {"layers": [layer, odd]}
        assert lowers.image_descriptors(doc) == {}, odd
        assert lowers.layer_descriptors(doc) == [layer]  # never mistaken for a layer either


def test_an_inexpressible_layer_has_no_image() -> None:
    from rollstack.format.toc import EntryType, Toc, TocEntry

    toc = Toc([TocEntry(path="", type=EntryType.DIR, mode=0o755),
               TocEntry(path="x" * 300, type=EntryType.REG, mode=0o644)])  # a name over 255 bytes
    assert lowers.image_for(toc, A) is None
