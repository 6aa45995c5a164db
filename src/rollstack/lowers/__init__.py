"""Layer stack -> ordered lower dirs (after the lazy store, beside run/).

- `stack.Lowers`: the node's one owner of the choice per layer (materialized copy > EROFS mount
  > lazy-store FUSE directory) and of the workers that make the faster forms;
- `erofs`: EROFS metadata images of layers, built or fetched, mounted over the lazy store's blobs;
- `materialize` + `extract`: hot layers extracted into local directories, in their own process;
- `config.LowersConfig`: their settings (`NodeConfig.lowers`).
"""
