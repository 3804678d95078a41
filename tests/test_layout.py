"""The tree as a reader finds it: libmojoccl's folders are floors in the
order calls go down, and a file includes only its own floor or those below;
no Python module of torch_mojo imports, at its top or inside a function, one
that imports it back; no unit (x.cc with its header, or a Python module)
grows past what one reader takes in."""

import ast
import re
from pathlib import Path

from tests.harness import ROOT

PACKAGE = ROOT / "python" / "torch_mojo"
CCL = ROOT / "cpp" / "ccl"

# libmojoccl, top to bottom: the communicator (api.cc, comm.cc and the
# rank-order path it chooses), the hierarchy that composes a call across
# nodes, the node's collectives, what moves the bytes, the transports that
# carry them, device memory, and what every floor stands on.
FLOORS = ["", "hierarchy", "node", "algorithms", "transports", "device", "base"]

MAX_UNIT_LINES = 600


def floor_of(path) -> str:
    relative = path.relative_to(CCL)
    return relative.parts[0] if len(relative.parts) > 1 else ""


def libmojoccl_sources():
    return sorted(p for p in CCL.rglob("*") if p.suffix in (".cc", ".h") and "include" not in p.relative_to(CCL).parts)


def test_libmojoccl_includes_name_their_floor_and_never_point_up():
    up = []
    for source in libmojoccl_sources():
        for target in re.findall(r'^#include "([^"]+)"', source.read_text(), re.M):
            if target.startswith("mojoccl/"):  # the public header
                continue
            included = CCL / target
            assert included.exists(), f"{source.relative_to(CCL)} includes {target}: name it from cpp/ccl/"
            assert floor_of(included) in FLOORS, f"{target}: a folder that is no floor (FLOORS)"
            if FLOORS.index(floor_of(included)) < FLOORS.index(floor_of(source)):
                up.append(f"{source.relative_to(CCL)} -> {target}")
    assert not up, "includes that point up a floor: " + ", ".join(up)


def test_every_libmojoccl_folder_is_a_floor():
    folders = {p.name for p in CCL.iterdir() if p.is_dir()} - {"include"}
    assert folders == set(FLOORS) - {""}


def module_name(path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the torch_mojo modules it imports}. `from torch_mojo import
    x` imports the module torch_mojo.x where there is one (the compiled _C
    is none of ours to follow), else the package."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("torch_mojo"):
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    imported.add(submodule if submodule in modules or alias.name == "_C" else node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name.startswith("torch_mojo")}
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle, each once (from its smallest module name)."""
    found = []

    def walk(start, path):
        for module in sorted(graph[path[-1]]):
            if module == start:
                found.append(path + [start])
            elif module > start and module not in path:
                walk(start, path + [module])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_no_module_imports_one_that_imports_it():
    graph = import_graph()
    assert {"torch_mojo.doctor.facts", "torch_mojo.doctor.variables"} <= set(graph)
    assert cycles(graph) == [], "\n".join(" -> ".join(cycle) for cycle in cycles(graph))


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def units() -> dict[str, int]:
    """Each C++ source with the header it implements (its first include,
    when the source's name starts with the header's: fabric_post.cc
    implements transports/fabric.h), each header alone, each Python module."""
    lines = {}
    for path in sorted((ROOT / "cpp").rglob("*")):
        if path.suffix in (".h", ".hpp"):
            lines[str(path.relative_to(ROOT))] = len(path.read_text().splitlines())
    for path in sorted((ROOT / "cpp").rglob("*.cc")):
        text = path.read_text()
        unit = len(text.splitlines())
        first = re.search(r'^#include "([^"]+)"', text, re.M)
        if first:
            header = next((p for p in (path.parent / Path(first.group(1)).name, ROOT / "cpp" / first.group(1),
                                       ROOT / "cpp" / "ccl" / first.group(1)) if p.exists()), None)
            if header and path.stem.startswith(header.stem):
                unit += len(header.read_text().splitlines())
        lines[str(path.relative_to(ROOT))] = unit
    for path in PACKAGE.rglob("*.py"):
        lines[str(path.relative_to(ROOT))] = len(path.read_text().splitlines())
    return lines


def test_no_unit_past_what_one_reader_takes_in():
    large = {unit: count for unit, count in units().items() if count > MAX_UNIT_LINES}
    assert not large, f"split these where their names say so: {large}"
