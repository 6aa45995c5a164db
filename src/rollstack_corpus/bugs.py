"""Bug injection: find small source mutations inside functions and render them as diffs.

Pure (text in, text out). SWE-smith's "procedural modification" in miniature: flip a comparison
(`<` <-> `<=`, `==` <-> `!=`, ...), swap `+`/`-` or `and`/`or`, bump a small integer constant,
negate a boolean constant. Each `Mutation` is a single-line replacement at an exact column range,
located with `ast` so it never touches strings or comments. Which mutations make named tests fail
is decided by running the tests (see rollstack_corpus.discovery).
"""

from __future__ import annotations

import ast
import difflib
import random
from dataclasses import asdict, dataclass

_CMP_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_BIN_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True, slots=True)
class Mutation:
    """Replace `old` by `new` on `line` (1-based) at columns [col, col+len(old))."""

    path: str  # relative to the repository workdir
    line: int
    col: int
    old: str
    new: str
    kind: str  # "op_swap" | "const_change" | "bool_swap"
    function: str  # qualified name of the enclosing function

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate mutation inside a function body of `source`, in source order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found: list[Mutation] = []
    for func, qualname in _functions(tree):
        for node in ast.walk(func):
            found.extend(_node_mutations(path, lines, node, qualname))
    # Nested functions are walked twice (inside their parent too): keep the first, deepest name wins.
    unique: dict[tuple[int, int], Mutation] = {}
    for m in found:
        key = (m.line, m.col)
        if key not in unique or len(m.function) > len(unique[key].function):
            unique[key] = m
    return sorted(unique.values(), key=lambda m: (m.line, m.col))


def _functions(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    out: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((child, name))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _between(lines: list[str], a: ast.AST, b: ast.AST) -> tuple[int, int, str] | None:
    """(line, col, text) of the source between the end of `a` and the start of `b`, one line only."""
    if a.end_lineno != b.lineno or a.end_col_offset is None:
        return None
    text = _line_bytes(lines, b.lineno)[a.end_col_offset : b.col_offset]
    return b.lineno, a.end_col_offset, text.decode("utf-8")


def _line_bytes(lines: list[str], lineno: int) -> bytes:
    # ast column offsets are UTF-8 byte offsets.
    return lines[lineno - 1].encode("utf-8")


def _op_in_gap(lines: list[str], a: ast.AST, b: ast.AST, old: str, new: str, kind: str,
               path: str, func: str) -> list[Mutation]:
    gap = _between(lines, a, b)
    if gap is None:
        return []
    line, col, text = gap
    stripped = text.strip()
    # Parentheses or comments between operands make the gap ambiguous: skip rather than guess.
    if stripped != old:
        return []
    col_chars = len(_line_bytes(lines, line)[:col].decode("utf-8")) + text.index(old)
    return [Mutation(path, line, col_chars, old, new, kind, func)]


def _node_mutations(path: str, lines: list[str], node: ast.AST, func: str) -> list[Mutation]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_TEXT:
        old = _CMP_TEXT[type(node.ops[0])]
        return _op_in_gap(lines, node.left, node.comparators[0], old, _CMP_SWAP[old], "op_swap", path, func)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
        old, new = _BIN_SWAP[type(node.op)]
        return _op_in_gap(lines, node.left, node.right, old, new, "op_swap", path, func)
    if isinstance(node, ast.BoolOp) and type(node.op) in _BOOL_SWAP and len(node.values) == 2:
        old, new = _BOOL_SWAP[type(node.op)]
        return _op_in_gap(lines, node.values[0], node.values[1], old, new, "bool_swap", path, func)
    if isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
        seg = _line_bytes(lines, node.lineno)[node.col_offset : node.end_col_offset].decode("utf-8")
        col = len(_line_bytes(lines, node.lineno)[: node.col_offset].decode("utf-8"))
        if isinstance(node.value, bool) and seg in ("True", "False"):
            return [Mutation(path, node.lineno, col, seg, "False" if seg == "True" else "True", "bool_swap", func)]
        if type(node.value) is int and seg.isdigit() and 0 <= node.value <= 16:
            return [Mutation(path, node.lineno, col, seg, str(node.value + 1), "const_change", func)]
    return []


def apply_mutation(source: str, m: Mutation) -> str:
    """`source` with `m` applied; raises ValueError if the text at the location is not `m.old`."""
    lines = source.splitlines(keepends=True)
    if not 1 <= m.line <= len(lines):
        raise ValueError(f"line {m.line} out of range")
    line = lines[m.line - 1]
    if line[m.col : m.col + len(m.old)] != m.old:
        raise ValueError(f"{m.path}:{m.line}:{m.col}: expected {m.old!r}, found {line[m.col:m.col + len(m.old)]!r}")
    lines[m.line - 1] = line[: m.col] + m.new + line[m.col + len(m.old) :]
    mutated = "".join(lines)
    ast.parse(mutated)  # a mutation must keep the module importable
    return mutated


def unified_diff(path: str, before: str, after: str, context: int = 3) -> str:
    """A git-style unified diff of one file (`a/`/`b/` prefixes), relative to the workdir."""
    if not before.endswith("\n") or not after.endswith("\n"):
        raise ValueError("files without a final newline are not supported")
    body = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}", n=context,
    )
    text = "".join(body)
    if not text:
        raise ValueError("no change")
    return f"diff --git a/{path} b/{path}\n" + text


def sample_mutations(mutations: list[Mutation], k: int, seed: str) -> list[Mutation]:
    """Up to `k` mutations, at most one per function, chosen deterministically from `seed`."""
    rng = random.Random(seed)
    shuffled = list(mutations)
    rng.shuffle(shuffled)
    chosen: list[Mutation] = []
    used: set[tuple[str, str]] = set()
    for m in shuffled:
        key = (m.path, m.function)
        if key in used:
            continue
        used.add(key)
        chosen.append(m)
        if len(chosen) == k:
            break
    return chosen
