"""README's Layout section against the tree: every package and every module at the package's
root is named there, nothing named there is missing, the root stays small, and each
subpackage opens with a docstring saying what its files do.

Files inside a subpackage may come and go without touching README: the section names
packages, not every file."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "minillm"
MAX_ROOT_MODULES = 8


def layout_entries() -> list[str]:
    """The first word of each line of the fenced block under README's `## Layout`."""
    readme = (REPO / "README.md").read_text()
    section = re.search(r"^## Layout\n(.*?)^## ", readme, re.S | re.M)
    assert section, "README.md has no '## Layout' section followed by another section"
    block = re.search(r"^```\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "README's Layout section has no fenced block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert all(not line[0].isspace() for line in lines), \
        "one line per entry: every line of the Layout block starts with a path"
    return [line.split()[0] for line in lines]


def subpackages() -> set[str]:
    return {f"minillm/{p.parent.relative_to(PACKAGE).as_posix()}/"
            for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE and "__pycache__" not in p.parts}


def root_modules() -> set[str]:
    return {f"minillm/{p.name}" for p in PACKAGE.glob("*.py")}


def test_every_package_and_root_module_is_named_in_the_layout():
    named = set(layout_entries())
    missing = sorted((subpackages() | root_modules()) - named)
    assert not missing, f"README's Layout section does not name {missing}: add one line for each"


def test_everything_the_layout_names_exists():
    entries = layout_entries()
    assert len(entries) == len(set(entries)), "an entry is named twice"
    for entry in entries:
        path = REPO / entry
        if entry.endswith("/"):
            assert path.is_dir(), f"README's Layout names {entry}, which is not a folder here"
            if entry.startswith("minillm/"):
                assert (path / "__init__.py").is_file(), f"{entry} is named as a package but has no __init__.py"
        else:
            assert path.is_file(), f"README's Layout names {entry}, which is not a file here"


def test_the_package_root_stays_small():
    modules = sorted(root_modules())
    assert len(modules) <= MAX_ROOT_MODULES, \
        f"{len(modules)} modules at minillm/'s root (at most {MAX_ROOT_MODULES}): {modules}; put new ones in a subpackage"


def test_every_subpackage_opens_with_a_docstring():
    for package in sorted(subpackages()):
        init = REPO / package / "__init__.py"
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{package}__init__.py does not open with a docstring saying what it holds"
