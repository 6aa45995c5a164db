"""The daemon's one config document (lazystore/config.py): what the client sends is what the daemon runs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pydantic
import pytest

from rollstack.fetch import FetchConfig
from rollstack.lazystore.config import SUN_PATH_MAX, DaemonConfig, LazyStoreSettings, daemon_argv
from rollstack.lazystore.daemon import parse_config
from rollstack.node.config import NodeConfig


def test_defaults_are_the_fetch_config_defaults():
    cfg = DaemonConfig.of("/m", "/s", "oci:/x")
    assert cfg.fetch == FetchConfig() and cfg.control_socket == Path("/s/control.sock")


def test_of_routes_fields_to_the_daemon_or_its_fetch_config():
    cfg = DaemonConfig.of("/m", "/s", "oci:/x", background_grace=0.0, link_rate=1e9, fetch_on_open=True,
                          holder_grace=60, share_traces=False, peers=["http://a:1"])
    assert cfg.fetch.background_grace == 0.0 and cfg.fetch.link_rate == 1e9 and cfg.fetch.fetch_on_open is True
    assert cfg.holder_grace == 60 and cfg.share_traces is False and cfg.peers == ("http://a:1",)
    with pytest.raises(TypeError, match="no field 'cache_budgett'"):
        DaemonConfig.of("/m", "/s", "oci:/x", cache_budgett=1)


def test_the_command_line_document_round_trips(monkeypatch):
    cfg = DaemonConfig.of("/m", "/s", "oci:/x", neighbor_bytes=0, no_open=False, fuse_priority="nice")
    argv = daemon_argv(sys.executable, cfg)
    assert argv[1:3] == ["-m", "rollstack.lazystore.daemon"] and len(argv) == 4  # one document, nothing else
    assert parse_config(argv[3:]) == cfg
    monkeypatch.setattr(sys, "stdin", io.StringIO(cfg.model_dump_json()))
    assert parse_config(["-"]) == cfg


@pytest.mark.parametrize("doc", [
    {"mountpoint": "/m", "state_dir": "/s"},  # no store
    {"mountpoint": "/m", "state_dir": "/s", "store": "oci:/x", "cache_budget": 1},  # unknown field
    {"mountpoint": "/m", "state_dir": "/s", "store": "oci:/x", "fetch": {"deadline": "soon"}},
    {"mountpoint": "/m", "state_dir": "/s", "store": "oci:/x", "fuse_priority": "realtime"},
])
def test_bad_documents_are_refused(doc):
    with pytest.raises(pydantic.ValidationError):
        parse_config([json.dumps(doc)])


def test_a_socket_path_over_the_unix_limit_is_refused_before_anything_runs():
    fits = "/" + "s" * (SUN_PATH_MAX - len("/fuse-holder.sock") - 1)
    DaemonConfig.of("/m", fits, "oci:/x")
    with pytest.raises(pydantic.ValidationError, match="unix socket path .* more than the 107"):
        DaemonConfig.of("/m", fits + "s", "oci:/x")
    with pytest.raises(pydantic.ValidationError, match="control"):
        DaemonConfig.of("/m", "/s", "oci:/x", control=Path("/") / ("c" * 100) / "control.sock")


def test_paths_are_absolute():
    cfg = DaemonConfig.of("m", "s", "oci:/x")
    assert cfg.mountpoint.is_absolute() and cfg.state_dir.is_absolute()


def test_the_node_embeds_the_settings_with_its_own_cache_budget():
    node = NodeConfig()
    assert node.lazy.fetch.disk_budget == 20 << 30
    again = NodeConfig.model_validate_json(node.model_dump_json())
    assert again.lazy == node.lazy
    custom = NodeConfig(lazy={"listen": "127.0.0.1:9", "fetch": {"neighbor_bytes": 0}})
    daemon = DaemonConfig.of("/m", "/s", "oci:/x", custom.lazy)
    assert daemon.listen == "127.0.0.1:9" and daemon.fetch.neighbor_bytes == 0
    assert isinstance(custom.lazy, LazyStoreSettings)
