"""The small core every stage may import: units, statistics (no I/O, no rollstack imports)."""
