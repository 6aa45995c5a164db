"""rollstack's cluster layer: many node agents as one pool (see docs/cluster.md).

Kept import-light: `rollstack.cluster.placement` is pure and never imports Ray.
"""
