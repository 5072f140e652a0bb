"""The static part of grading's tampering rule: an `ast` walk of a student's exercise cell for
code that reaches the grading machinery instead of solving the exercise (IPython hooks, frames,
`gc`, `ctypes`, `sys.modules`, the graders' modules, assignments to attributes of imported
modules). What the course's own exercise cell imports, and the bases meant for students
(`minillm.checks.bases`), are the lesson's, not tampering. Run by `grade.py` on every exercise
cell before its verdict; the sandbox (`sandbox.py`) is what stops code the scan cannot see.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

MAGIC = re.compile(r"^(\s*)[%!].*$", re.M)


def python_source(source: str) -> str:
    """A cell's source as plain Python: IPython magics and shell lines become `pass`."""
    return MAGIC.sub(lambda m: m.group(1) + "pass", source)


def parse(source: str):
    try:
        return ast.parse(python_source(source))
    except SyntaxError:
        return None


def cell_imports(body) -> list:
    """A cell's import statements, those under a top-level `try` or `if` included (lesson 08
    imports triton in a try, to say how to install it when it is missing)."""
    out = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, (ast.Try, ast.If)):
            out += cell_imports(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
    return out


HOOKS = {"get_ipython", "set_custom_exc", "input_transformers_post", "input_transformers_cleanup",
         "input_transformer_manager", "ast_transformers", "custom_exceptions", "showtraceback",
         "_showtraceback", "register_magic_function", "_getframe", "settrace", "setprofile", "f_back",
         "f_globals", "f_locals", "gi_frame", "tb_frame",
         # what reaching behind a function takes (the answer guard's original, a copied source)
         "__code__", "__closure__", "cell_contents", "__wrapped__", "__kwdefaults__", "__globals__", "getsource",
         "getsourcelines"}
FORBIDDEN_MODULES = ("IPython", "ipykernel", "nbval", "nbformat", "nbclient", "jupyter_client", "gc", "ctypes",
                     "minillm.course")
ALLOWED_FROM_CHECKS = ("passed_or_reference", "CheckFailed")
STUDENT_BASES = "minillm.checks.bases"   # the abstract bases exercise classes subclass: for students


def import_keys(tree) -> set[tuple]:
    """What a cell imports, one key per name: ("from", module, name) or ("import", module)."""
    keys = set()
    for node in cell_imports(tree.body) if tree else []:
        if isinstance(node, ast.Import):
            keys.update(("import", a.name) for a in node.names)
        else:
            keys.update(("from", "." * node.level + (node.module or ""), a.name) for a in node.names)
    return keys


def _student_bases() -> set[tuple]:
    """("from", STUDENT_BASES, name) for each name of its `__all__`, read without importing it."""
    path = Path(__file__).resolve().parents[1] / "checks" / "bases.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), [])
    return {("from", STUDENT_BASES, name) for name in names}


STUDENT_IMPORTS = frozenset(_student_bases())


def _forbidden(module: str) -> bool:
    return module.startswith("minillm.checks.") or any(module == m or module.startswith(m + ".")
                                                       for m in FORBIDDEN_MODULES)
WORDS = ("minillm.checks", "minillm.course", "nbval", "raises-exception", "set_custom_exc", "input_transformers",
         "NBVAL_", "<notebook cell", "_minillm_answer")


def _base(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def scan(source: str, given: set[str] = frozenset(), course_imports: set[tuple] = frozenset()) -> list[str]:
    """What in an exercise cell reaches the grading machinery (empty for ordinary code). `given`:
    the module names the lesson's imports bind (torch, ...); `course_imports`: what the course's
    own exercise cell imports (`import_keys`), which is the lesson's, not tampering, as are the
    bases meant for students (`STUDENT_IMPORTS`, lesson 07's `DetokenizerBase`)."""
    tree = parse(source)
    if tree is None:
        return []
    modules = set(given)
    allowed = set(course_imports) | STUDENT_IMPORTS
    found = []

    def flag(node, what):
        found.append(f"{what} (line {getattr(node, 'lineno', '?')})")

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and import_keys(ast.Module([node], [])) <= allowed:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minillm"):
                modules.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                modules.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules.add((alias.asname or alias.name).split(".")[0])
                if _forbidden(alias.name) or alias.name == "minillm.checks":
                    flag(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("minillm"):
                modules.update(a.asname or a.name for a in node.names)
            if _forbidden(module):
                flag(node, f"imports from {module}")
            elif module == "minillm.checks" and any(a.name not in ALLOWED_FROM_CHECKS and not a.name.startswith("check_")
                                                    for a in node.names):
                flag(node, "imports minillm.checks' machinery")
            elif module == "minillm" and any(a.name in ("checks", "course") for a in node.names):
                flag(node, "imports minillm's graders")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in HOOKS:
            flag(node, node.id)
        elif isinstance(node, ast.Attribute) and node.attr in HOOKS:
            flag(node, node.attr)
        elif isinstance(node, ast.Attribute) and node.attr == "modules" and _base(node) == "sys":
            flag(node, "sys.modules")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = next((w for w in WORDS if w in node.value), None)
            if word:
                flag(node, f"the text {word!r}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and _base(t) in modules:
                        flag(node, f"assigns to {ast.unparse(t)}")
                        break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and _base(node.args[0]) in modules:
            flag(node, f"{node.func.id}({ast.unparse(node.args[0])}, ...)")
    return list(dict.fromkeys(found))
