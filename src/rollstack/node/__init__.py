"""The node agent: `NodeService` strings the stages together for many environments; `api` serves
it over HTTP (FastAPI); `models` is the wire contract; `agent` runs/starts/stops the daemon;
(The in-process `Node` with the SDK's interface is `rollstack.client.local`.) Nothing is imported eagerly.
"""
