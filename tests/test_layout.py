"""The tree as a reader finds it: no Python module of torch_mojo imports,
at its top or inside a function, one that imports it back."""

import ast

from tests.harness import ROOT

PACKAGE = ROOT / "python" / "torch_mojo"


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
