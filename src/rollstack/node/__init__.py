"""The node agent: `NodeService` strings the stages together for many environments; `api` serves
it over HTTP (FastAPI); `models` is the wire contract; `agent` runs/starts/stops the daemon;
`local.Node` is the in-process node with the SDK's interface. Nothing is imported eagerly.
"""
