"""The import rules of docs/architecture.md ("Layout"), checked over the source.

* Inside ``storage_service`` a package imports only packages of a lower layer (the
  order below, lowest first); ``app`` is the composition root, ``cli`` and ``launch``
  the process entry points above it.
* No import cycle between modules, lazy (function-level) imports included.
* The client (``rmq_spark``) imports from ``storage_service`` only its shared kernel:
  ``protocol`` and the generated ``proto``; the demo and the notebooks' helper, which
  start an embedded cluster (``rmq-spark[server]``), also ``local``.
"""
from __future__ import annotations

import ast
import os

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# storage_service's packages (and top-level modules), lowest layer first; one layer may
# hold packages that do not import each other.
LAYERS = [
    {"proto", "protocol"},
    {"security"},
    {"log"},
    {"raft"},
    {"statemachine"},
    {"metrics", "cluster"},
    {"server"},
    {"http"},
    {"app", "local"},
    {"cli"},
    {"launch"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules(package: str) -> dict[str, str]:
    """module name -> file, for every .py under ``package`` (generated stubs left out)."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py") and not f.startswith("rmq_pb2"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _imports(module: str, path: str) -> set[str]:
    """The modules (or packages) ``module`` imports, relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not path.endswith("__init__.py"):
                    base = base[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)     # "from pkg import module"
    return found


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)
    return {m: {t for t in _imports(m, p) if t in mods and t != m} for m, p in mods.items()}


def _layer_of(module: str) -> str:
    return module.split(".")[1]


def test_storage_service_imports_only_downwards():
    graph = _graph("storage_service")
    unknown = sorted({_layer_of(m) for m in graph if "." in m} - set(RANK))
    assert not unknown, f"packages missing from LAYERS (and docs/architecture.md): {unknown}"
    upward = sorted(f"{m} -> {t}" for m, ts in graph.items() if "." in m for t in ts
                    if "." in t and _layer_of(t) != _layer_of(m) and RANK[_layer_of(t)] >= RANK[_layer_of(m)])
    assert not upward, "imports from a lower layer to a higher one (or across one layer):\n" + "\n".join(upward)


@pytest.mark.parametrize("package", ["storage_service", "rmq_spark"])
def test_no_import_cycles(package):
    graph = _graph(package)
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):          # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            # a package and its own modules (``__init__`` re-exports) are not a cycle
            if len(part) > 1 and not all(p == min(part, key=len) or p.startswith(min(part, key=len) + ".")
                                         for p in part):
                cycles.append(sorted(part))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_client_imports_only_the_shared_kernel_of_the_server():
    starts_a_cluster = {"rmq_spark.demo", "rmq_spark.history"}
    used = sorted({f"{m} -> {t}" for m, p in _modules("rmq_spark").items() for t in _imports(m, p)
                   if t.startswith("storage_service.")
                   and not t.startswith(("storage_service.protocol", "storage_service.proto"))
                   and not (m in starts_a_cluster and t.startswith("storage_service.local"))})
    assert not used, f"rmq_spark imports server modules: {used}"
