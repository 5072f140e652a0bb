"""A student's function, graded from outside the sandbox, whose code the grader also reads
(lesson 13's `check_chain_root` refuses Python's salted `hash()` by reading `fn.__code__`).

A proxy (`proxy.py`) reaches no `__dunder__` across the sandbox, and what the sandbox would say
about its own code could be anything. So the code is read here, from the exercise cells' source
the judge already holds: compiled (never run) under the same `<notebook cell N>` names, the
last top-level `def` of the name is the function's code (else, the name bound some other way,
the cells' whole code, nested functions included). Calls still go to the sandbox.
"""
from __future__ import annotations

import ast
import builtins
import types

from .cells import CELL_FILE


class ReadHere:
    """Calls go to `remote` (the student's function in the sandbox); `__code__` and `__globals__`
    (only whether the cells rebind `hash`) are read from the cells' source here."""

    def __init__(self, remote, name: str, code: types.CodeType, globals_: dict):
        self._remote, self.__name__, self.__code__, self.__globals__ = remote, name, code, globals_

    def __call__(self, *args, **kwargs):
        return self._remote(*args, **kwargs)

    def __repr__(self):
        return f"<function {self.__name__} across the sandbox>"


def _binds(tree: ast.Module, name: str) -> bool:
    """Whether the cell binds `name` at its top level (assignment, def, class, import, `global`),
    looking into if/for/with/try blocks but not into function or class bodies."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store) or \
                isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name or \
                isinstance(node, ast.Global) and name in node.names:
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def read_here(remote, name: str, cells: list[dict]) -> ReadHere:
    """`remote` with the code of `name` as the exercise cells define it."""
    found, whole, rebinds_hash = None, [], False
    for cell in cells:
        try:
            tree = ast.parse(cell["source"])
            module = compile(tree, CELL_FILE.format(cell["index"]), "exec")
        except (SyntaxError, ValueError):
            continue
        rebinds_hash = rebinds_hash or _binds(tree, "hash")
        if not _binds(tree, name):
            continue
        whole.append(module)
        defs = [c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
        last = next((s for s in reversed(tree.body) if _binds(ast.Module(body=[s], type_ignores=[]), name)), None)
        found = defs[-1] if defs and isinstance(last, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if found is None:             # bound some other way: all of the binding cells' code is what it may run
        found = compile("pass", "<the exercise cells>", "exec").replace(co_consts=tuple(whole) + (None,))
    return ReadHere(remote, name, found, {"hash": object()} if rebinds_hash else {"hash": builtins.hash})
