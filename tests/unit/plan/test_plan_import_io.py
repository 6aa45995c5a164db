"""`visible`: what a path shows in the overlay of converted lower layers (import's copy-up rules)."""

from __future__ import annotations

from rollstack.format.toc import EntryType, Toc, TocEntry
from rollstack.plan.import_io import visible


def D(path: str, mode: int = 0o755, opaque: bool = False) -> TocEntry:  # noqa: N802
    return TocEntry(path, EntryType.DIR, mode, opaque=opaque)


def F(path: str, mode: int = 0o644) -> TocEntry:  # noqa: N802
    return TocEntry(path, EntryType.REG, mode)


def W(path: str) -> TocEntry:  # noqa: N802
    return TocEntry(path, EntryType.WHITEOUT, 0)


def layers(*specs: list[TocEntry]) -> list[Toc]:
    return [Toc([D(""), *spec]) for spec in specs]


def test_top_layer_wins_and_directories_report_the_top_metadata() -> None:
    tocs = layers([D("a", 0o700), F("a/x", 0o600)], [D("a", 0o750), F("a/y")])
    assert visible(tocs, "a/x") == (0, tocs[0].lookup("a/x"))
    assert visible(tocs, "a")[0] == 1 and visible(tocs, "a")[1].mode == 0o750  # type: ignore[index]
    assert visible(tocs, "a/nope") is None and visible(tocs, "") == (1, tocs[1].lookup(""))


def test_whiteouts_opaque_dirs_and_non_directories_hide_what_is_below() -> None:
    tocs = layers([D("a"), F("a/x"), D("b"), F("b/x"), D("c"), F("c/x"), D("d"), F("d/x")],
                  [W("a"), D("b", opaque=True), F("c"), W("d/x")])
    assert visible(tocs, "a/x") is None and visible(tocs, "a") is None
    assert visible(tocs, "b/x") is None and visible(tocs, "b")[0] == 1  # type: ignore[index]
    assert visible(tocs, "c/x") is None and visible(tocs, "c")[1].type is EntryType.REG  # type: ignore[index]
    assert visible(tocs, "d/x") is None and visible(tocs, "d")[0] == 0  # type: ignore[index]


def test_a_hardlink_resolves_to_its_target_in_the_same_layer() -> None:
    target = TocEntry("t", EntryType.REG, 0o755, size=3)
    link = TocEntry("l", EntryType.HARDLINK, 0o755, link="t", size=3)
    tocs = layers([target, link])
    index, entry = visible(tocs, "l")  # type: ignore[misc]
    assert index == 0 and entry.path == "t" and entry.type is EntryType.REG
