"""Full check of a layer blob: footer, TOC digest and structure, every stored chunk's digest.

Collects problems instead of stopping at the first one, so `rollstack layer verify` can report
everything that is wrong; `ok` holds only if nothing is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollstack.errors import FormatError
from rollstack.format.chunk import decode_chunk
from rollstack.format.reader import read_toc
from rollstack.format.source import BlobSource
from rollstack.format.toc import EntryType


@dataclass
class VerifyReport:
    ok: bool = True
    blob_size: int = 0
    toc_size: int = 0
    entries: int = 0
    chunks_checked: int = 0
    problems: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.ok = False
        self.problems.append(message)

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "blob_size": self.blob_size, "toc_size": self.toc_size,
                "entries": self.entries, "chunks_checked": self.chunks_checked, "problems": self.problems}


def verify_layer(source: BlobSource) -> VerifyReport:
    report = VerifyReport(blob_size=source.size())
    try:
        opened = read_toc(source)
        toc = opened.toc
        entries = toc.entries  # materialise all: structural errors surface here
    except FormatError as exc:
        report.fail(f"{exc.code}: {exc}")
        return report
    report.toc_size = opened.footer.toc_length
    report.entries = len(entries)
    payload_end = opened.footer.toc_offset
    checked: dict[tuple[int, int, str], bool] = {}
    for e in entries:
        if e.type is EntryType.HARDLINK:
            try:
                toc.resolve(e)
            except FormatError as exc:
                report.fail(str(exc))
            continue
        if e.type is not EntryType.REG:
            if e.chunks:
                report.fail(f"{e.path!r}: a {e.type.value} entry must not have chunks")
            continue
        expect = 0
        for c in e.chunks:
            if c.offset != expect:
                report.fail(f"{e.path!r}: chunk table has a gap or overlap at file offset {c.offset}")
            expect = c.offset + c.size
            if c.blob_offset + c.blob_size > payload_end:
                report.fail(f"{e.path!r}: chunk at {c.blob_offset} lies outside the payload area")
                continue
            key = (c.blob_offset, c.blob_size, c.digest)
            if key not in checked:  # deduplicated chunks are checked once
                try:
                    decode_chunk(c, source.read_at(c.blob_offset, c.blob_size))
                    checked[key] = True
                except FormatError as exc:
                    checked[key] = False
                    report.fail(f"{e.path!r}: {exc}")
                report.chunks_checked += 1
            elif not checked[key]:
                report.fail(f"{e.path!r}: shares the corrupt chunk at blob offset {c.blob_offset}")
        if expect != e.size:
            report.fail(f"{e.path!r}: chunks cover {expect} bytes but the size is {e.size}")
    return report
