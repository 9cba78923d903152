"""The package's layout: memengine's modules import one another in one direction only.

Every import counts, including those under ``if TYPE_CHECKING:`` and those
inside functions: a cycle hidden from the interpreter still ties the modules
together for a reader, and for the next change that needs the import at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memengine

PACKAGE = Path(memengine.__file__).parent


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The memengine modules ``module`` imports: ``from .x import y`` names ``x.y`` when it is a module, else ``x``."""
    package = module if _is_package(path) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            named = [f"{source}.{alias.name}" for alias in node.names]
            targets = [name if name in modules else source for name in named]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import memengine.x.y` where y is a name
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _module_names()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # Allowed: a package's __init__ re-exporting its modules' names (memengine/__init__.py is the public
    # surface; memengine/cli/__init__.py gathers the subcommands). An edge into a package __init__ from one
    # of its own modules would still close a cycle and is kept, so such a module is reported.
    for name, path in modules.items():
        if _is_package(path):
            graph[name] = {target for target in graph[name] if not target.startswith(name + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    # Plain, relative (one and two levels up), and TYPE_CHECKING-only imports are all edges.
    assert "memengine.session.messages" in graph["memengine.session.actor"]
    assert "memengine.store.base" in graph["memengine.session.actor"]
    assert "memengine.engine" in graph["memengine.replay"]  # only under TYPE_CHECKING
    # Re-exports by a package's __init__ are left out; its imports of other packages are not.
    assert "memengine.engine" not in graph["memengine"]


def test_find_cycle_finds_a_cycle_through_a_type_checking_import() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_memengine_modules_import_one_another_without_a_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_replay_drives_the_engine_and_the_engine_does_not_know_replay() -> None:
    graph = import_graph()
    engine = {module for module in graph if module == "memengine.engine" or module.startswith("memengine.engine.")}
    assert "memengine.engine.activations" in engine  # the engine is a package of parts
    for module in engine:
        assert "memengine.replay" not in graph[module], module
    assert "memengine.engine" not in graph["memengine.session.handle"]
    for module, targets in graph.items():
        if module.startswith("memengine.session."):
            assert "memengine.replay" not in targets, module
            assert not targets & engine, module


def _event_loop_imports(path: Path) -> set[str]:
    """The event loop libraries (asyncio, trio, sniffio) a module imports directly, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found.update(name.partition(".")[0] for name in names if name.partition(".")[0] in EVENT_LOOPS)
    return found


EVENT_LOOPS = {"asyncio", "trio", "sniffio"}


def test_only_the_wakeup_talks_to_an_event_loop_directly() -> None:
    """memengine talks to anyio, with two exceptions: one measured shim and one asyncio-only framework.

    The wake-up every add waits on twice (actor/wakeup.py) parks on the loop's
    own primitive; the OpenAI Agents SDK runs on asyncio only, and so does its adapter.
    """
    direct = {name: imported for name, path in _module_names().items() if (imported := _event_loop_imports(path))}
    assert direct == {"memengine.actor.wakeup": EVENT_LOOPS, "memengine.integrations.openai_agents": {"asyncio"}}, (
        direct
    )


def test_nothing_above_the_store_imports_a_backend() -> None:
    # open_store (and the store's other entry points) choose the backend; the engine, the sessions,
    # retain, privacy, the command line and the integrations know only the store's interface.
    backends = ("memengine.store.sqlite", "memengine.store.postgres")
    above = {
        module: sorted(t for t in targets if any(t == b or t.startswith(b + ".") for b in backends))
        for module, targets in import_graph().items()
        if not (module == "memengine.store" or module.startswith("memengine.store."))
    }
    assert {module: targets for module, targets in above.items() if targets} == {}


def test_each_backend_has_the_same_module_names_for_the_same_concerns() -> None:
    store = PACKAGE / "store"
    sqlite = {path.name for path in (store / "sqlite").glob("*.py")}
    postgres = {path.name for path in (store / "postgres").glob("*.py")}
    shared = {"__init__.py", "store.py", "connection.py", "schema.py", "recall.py", "readonly.py"}
    assert shared <= sqlite and shared <= postgres
