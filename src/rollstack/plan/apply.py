"""Computing a file's new content from its old content and a `FilePatch`. Pure: bytes in, bytes out.

Text hunks apply exactly as `git apply` does by default: no fuzz, no whitespace leniency; a hunk
may land at an offset from its stated line (searching outward from it), except that a hunk
starting at line 1 must match at the beginning and a hunk without trailing context must match
at the end of the file. Binary patches: `literal` replaces the content, `delta` is a git delta
against the old content (whose git blob id must match the `index` line).
"""

from __future__ import annotations

import hashlib

from rollstack.errors import MutationFailed
from rollstack.plan.patch import BinaryPatch, FilePatch, Hunk


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their '\\n' (only '\\n' ends a line, as in git); the last may lack one."""
    if not data:
        return []
    lines = [line + b"\n" for line in data.split(b"\n")]
    last = lines.pop()
    if last != b"\n":
        lines.append(last[:-1])
    return lines


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _find(image: list[bytes], pre: list[bytes], hint: int, at_start: bool, at_end: bool) -> int:
    n = len(pre)
    if at_start and at_end:
        return 0 if image == pre else -1
    if at_start:
        return 0 if image[:n] == pre else -1
    if at_end:
        pos = len(image) - n
        return pos if pos >= 0 and image[pos:] == pre else -1
    last = len(image) - n
    if last < 0:
        return -1
    hint = min(max(hint, 0), last)
    # outward from the hint, like git's find_pos: hint, hint-1, hint+1, hint-2, ...
    for distance in range(0, max(hint, last - hint) + 1):
        for pos in (hint - distance, hint + distance) if distance else (hint,):
            if 0 <= pos <= last and image[pos : pos + n] == pre:
                return pos
    return -1


def _context_counts(hunk: Hunk) -> tuple[int, int]:
    leading = 0
    for op, _ in hunk.lines:
        if op != " ":
            break
        leading += 1
    trailing = 0
    for op, _ in reversed(hunk.lines):
        if op != " ":
            break
        trailing += 1
    return leading, trailing


def apply_hunks(old: bytes, hunks: list[Hunk], path: str) -> bytes:
    """`old` with every hunk applied, or MutationFailed naming the file and the hunk."""
    image = split_lines(old)
    for hunk in hunks:
        pre, post = hunk.preimage, hunk.postimage
        leading, trailing = _context_counts(hunk)
        if leading == len(hunk.lines):  # a hunk of pure context changes nothing
            continue
        at_start = hunk.old_start == 0 or hunk.old_start == 1
        at_end = trailing == 0
        hint = hunk.new_start - 1 if hunk.new_start else 0
        pos = _find(image, pre, hint, at_start, at_end)
        if pos < 0:
            raise MutationFailed(
                f"{path}: hunk #{hunk.number} ({hunk.header}) does not apply",
                path=path, hunk=hunk.number,
            )
        image[pos : pos + len(pre)] = post
    return b"".join(image)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated delta header")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def apply_git_delta(base: bytes, delta: bytes) -> bytes:
    """git's pack delta format (patch-delta.c): copy-from-base and insert instructions."""
    src_size, i = _varint(delta, 0)
    dst_size, i = _varint(delta, i)
    if src_size != len(base):
        raise ValueError(f"delta is for a {src_size}-byte base, file has {len(base)} bytes")
    out = bytearray()
    while i < len(delta):
        cmd = delta[i]
        i += 1
        if cmd & 0x80:
            offset = size = 0
            for bit, shift in ((0x01, 0), (0x02, 8), (0x04, 16), (0x08, 24)):
                if cmd & bit:
                    offset |= delta[i] << shift
                    i += 1
            for bit, shift in ((0x10, 0), (0x20, 8), (0x40, 16)):
                if cmd & bit:
                    size |= delta[i] << shift
                    i += 1
            size = size or 0x10000
            if offset + size > len(base):
                raise ValueError("delta copies past the end of the base")
            out += base[offset : offset + size]
        elif cmd:
            if i + cmd > len(delta):
                raise ValueError("delta insert past its end")
            out += delta[i : i + cmd]
            i += cmd
        else:
            raise ValueError("delta opcode 0 is reserved")
    if len(out) != dst_size:
        raise ValueError(f"delta produced {len(out)} bytes, expected {dst_size}")
    return bytes(out)


def _apply_binary(old: bytes, binary: BinaryPatch, patch: FilePatch) -> bytes:
    if patch.old_oid and patch.old_path is not None and not set(patch.old_oid) <= {"0"}:
        if not git_blob_id(old).startswith(patch.old_oid):
            raise MutationFailed(f"{patch.path}: binary patch does not apply (the file differs from its preimage)",
                                 path=patch.path)
    if binary.method == "literal":
        return binary.data
    try:
        return apply_git_delta(old, binary.data)
    except (ValueError, IndexError) as exc:
        raise MutationFailed(f"{patch.path}: binary delta does not apply: {exc}", path=patch.path) from None


def new_content(old: bytes, patch: FilePatch) -> bytes:
    """The file's content after `patch` (b"" for a deletion, which must consume everything)."""
    if patch.binary_without_data:
        raise MutationFailed(
            f"{patch.path}: binary change without data (make the diff with `git diff --binary`)",
            path=patch.path,
        )
    if patch.binary is not None:
        data = _apply_binary(old, patch.binary, patch)
    else:
        data = apply_hunks(old, patch.hunks, patch.path)
    if patch.is_delete and data:
        raise MutationFailed(f"{patch.path}: removal patch leaves file contents", path=patch.path)
    return data
