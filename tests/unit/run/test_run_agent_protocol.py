"""The host side of rollstack-execd's wire protocol: request encoding, reply parsing, exit codes."""

from __future__ import annotations

import os
import signal
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack.errors import RuntimeFailure
from rollstack.run.agent import encode_request, exit_code, parse_replies

_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)


def _decode(frame: bytes) -> tuple[list[str], dict[str, str], str | None]:
    """What execd's parser reads from a request (the same record rules, in Python)."""
    assert frame[:4] == b"RSX1"
    (size,) = struct.unpack_from("<I", frame, 4)
    body = frame[8:]
    assert len(body) == size
    argv, env, cwd = [], {}, None
    i = 0
    while i < len(body):
        end = body.index(b"\0", i + 1)
        tag, value = chr(body[i]), os.fsdecode(body[i + 1:end])
        if tag == "a":
            argv.append(value)
        elif tag == "e":
            k, _, v = value.partition("=")
            env[k] = v
        elif tag == "c":
            cwd = value
        i = end + 1
    return argv, env, cwd


@given(st.lists(_text, min_size=1, max_size=8),
       st.dictionaries(_text.filter(lambda k: k and "=" not in k), _text, max_size=4),
       st.one_of(st.none(), _text.map(lambda s: "/" + s)))
def test_request_round_trips(argv, env, cwd):
    assert _decode(encode_request(argv, cwd, env)) == (argv, env, cwd or None)


def test_replies_are_parsed_incrementally():
    status = struct.pack("<i", 7 << 8)
    buf = bytearray(b"X" + struct.pack("<I", 4) + status[:2])
    assert parse_replies(buf) == [] and len(buf) == 7  # incomplete: kept
    buf.extend(status[2:] + b"E" + struct.pack("<I", 3) + b"bad")
    assert parse_replies(buf) == [("X", status), ("E", b"bad")] and buf == b""


@pytest.mark.parametrize("frame", [
    b"Z" + struct.pack("<I", 0),                       # unknown tag
    b"X" + struct.pack("<I", 8) + b"\0" * 8,           # a status is 4 bytes
    b"E" + struct.pack("<I", 1 << 30),                 # absurd length from a hostile peer
])
def test_garbage_replies_are_a_runtime_failure(frame):
    with pytest.raises(RuntimeFailure):
        parse_replies(bytearray(frame))


def test_exit_codes_follow_the_shell_convention():
    assert exit_code(0) == 0
    assert exit_code(3 << 8) == 3
    assert exit_code(signal.SIGKILL) == 128 + signal.SIGKILL


def test_spec_starts_execd_without_catatonits_pause_flag():
    from rollstack.run.ocispec import INIT_PATH, InitBinaries, SpecParams, build_spec

    execd = InitBinaries("/x/rollstack-execd", "/t", "/b", init_args=(), agent=True)
    assert build_spec("/r", SpecParams("e1", init=execd))["process"]["args"] == [INIT_PATH]
    assert build_spec("/r", SpecParams("e1"))["process"]["args"] == [INIT_PATH, "-P"]
