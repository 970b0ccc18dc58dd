"""The package's layers, held.

Every module of megatron_zeppelin is parsed (not imported) with ``ast``; every import in it counts,
at module level or inside a function, and so does a string import through ``importlib`` (its module
named by a literal, an f-string's prefix with the module's own strings, or the module's strings
that name package modules). From that graph:

(a) no import cycles among the modules (a function-level import that only hides a cycle is still one);
(b) no module imports from a layer above its own, with the layers below, lowest first;
(c) ``import megatron_zeppelin.planner`` and planning one batch (a subprocess) loads neither torch,
    megatron, nor any package module above the planner (dp_study, integration...);
(d) only integration/ imports megatron;
(e) every import of a package module names a module, or a name that module defines.

The layers, lowest first (each entry a package or a module; a module belongs to its longest entry).
Within a layer any direction is allowed; (a) still forbids cycles there.

- errors, spec, presets: leaf types and package data, read by everything.
- data (workloads, tokenizers) and integration.indexed_lengths: the document lengths. The indexed
  reader is megatron's adapter for data/: it lives in integration/ because it imports megatron
  (inside its function, when a Megatron indexed dataset is read), and it imports nothing of the
  package but errors, so data/ may read through it without reaching the rest of integration/.
- the planner, in its own order: the Plan (planner.errors, meta, plan_digest, types, program); pricing and
  building a Plan (cost/, build/, context: the prediction prices the remap's layout, assembly calls
  the prediction, so they are one layer); the pick's comparisons (planner.choice: ties and the
  memory rule); the strategies' protocol, registry and pick (planner.strategies); the baselines;
  the portfolio of fixed shapes (their shapes, and the memory-first entry built on the pick); the
  paper's partitioner (proposes those shapes too); the package (planner/__init__.py imports the
  strategies' modules, so the registry is full once ``megatron_zeppelin.planner`` is imported).
- distributed (launch, groups, p2p, the step executor): runs a Plan's CommOps;
- attention (engine, runner, kernels) and remapping: the layer's two halves on a Plan;
- sim: the event simulator of a Plan (and its run matrices, reading data/);
- calibrate, validation: measuring profiles, and the simulator against CPU engine runs;
- integration: the only code importing megatron (the trainer, the layer spec, the Megatron-LM entry);
- features: dp_study, advise, slurm;
- reports, plots, flags: what the sub-commands print, draw and share as flags;
- commands (one module per sub-command), then cli.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set

import pytest

import megatron_zeppelin

PKG = "megatron_zeppelin"
ROOT = Path(megatron_zeppelin.__file__).resolve().parent

LAYERS: List[List[str]] = [
    ["", "errors", "spec", "presets"],
    ["data", "integration.indexed_lengths"],
    ["planner.errors", "planner.meta", "planner.plan_digest", "planner.types", "planner.program"],
    ["planner.cost", "planner.build", "planner.context", "planner.testing"],
    ["planner.choice"],
    ["planner.strategies"],
    ["planner.baselines"],
    ["planner.portfolio"],
    ["planner.partitioner"],
    ["planner"],
    ["distributed"],
    ["attention", "remapping"],
    ["sim"],
    ["calibrate", "validation"],
    ["integration"],
    ["dp_study", "advise", "slurm"],
    ["reports", "plots", "flags"],
    ["commands"],
    ["cli"],
]
PLANNER_TOP = LAYERS.index(["planner"])

IMPORTERS = {"import_module", "__import__"}  # importlib.import_module(...), __import__(...)


def _modules() -> Dict[str, Path]:
    """Dotted name (without the package's) -> file; the package itself is ''."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _local(dotted: str):
    """The package-relative name of an absolute module name, or None outside the package."""
    if dotted == PKG:
        return ""
    return dotted[len(PKG) + 1:] if dotted.startswith(PKG + ".") else None


def _strings(tree) -> Set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _string_imports(tree, call: ast.Call) -> Set[str]:
    """The package modules a call to importlib.import_module / __import__ may load."""
    if not call.args:
        return set()
    arg, names = call.args[0], _strings(tree)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        found = {_local(arg.value)}
    elif isinstance(arg, ast.JoinedStr):  # f"megatron_zeppelin.commands.{name}": the prefix and the module's strings
        prefix = "".join(v.value for v in arg.values[:next((i for i, v in enumerate(arg.values)
                                                            if not isinstance(v, ast.Constant)), len(arg.values))])
        local = _local(prefix.rstrip("."))
        if local is None:
            return set()
        base = local + "." if local else ""
        found = {base + s for s in names if base + s in MODULES} or {m for m in MODULES if m.startswith(base)}
    else:  # a variable: any of the module's strings that names a package module
        found = {_local(s) for s in names}
    return {m for m in found if m is not None and m in MODULES}



def _from_source(node: ast.ImportFrom, here: list, is_pkg: bool):
    """The package module a ``from X import ...`` reads from (relative imports resolved against the
    importing module ``here``), '' for the package itself, None when X is outside the package."""
    if node.level:
        base = here if is_pkg else here[:-1]
        return ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
    return _local(node.module or "")

def _imports(name: str) -> Dict[str, int]:
    """Package modules ``name`` imports (module level, functions, importlib) -> first line."""
    tree, is_pkg = TREES[name], MODULES[name].name == "__init__.py"
    out: Dict[str, int] = {}

    def add(target: str, line: int):
        while target not in MODULES and "." in target:  # `import a.b.c` of a name: its module
            target = target.rsplit(".", 1)[0]
        if target in MODULES and target != name:
            out.setdefault(target, line)

    here = name.split(".") if name else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                local = _local(a.name)
                if local is not None:
                    add(local, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            src = _from_source(node, here, is_pkg)
            if src is None:
                continue
            for a in node.names:
                full = f"{src}.{a.name}" if src else a.name
                add(full if full in MODULES else src, node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in IMPORTERS:
                for m in _string_imports(tree, node):
                    add(m, node.lineno)
    out.pop("", None)  # the package's own __init__ (its version) is no layer's concern
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def layer_of(name: str) -> int:
    best, where = -1, None
    for i, group in enumerate(LAYERS):
        for entry in group:
            if (name == entry or entry == "" or name.startswith(entry + ".")) and len(entry) > best:
                best, where = len(entry), i
    return where


def _show(name: str) -> str:
    return f"{PKG}.{name}" if name else PKG


def _cycles():
    """Strongly connected components of more than one module (Tarjan), each with one cycle through it."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(MODULES)))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:  # one concrete cycle: breadth-first from the first module back to itself
        members, start = set(comp), comp[0]
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in GRAPH[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(GRAPH[v]):
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in GRAPH[v])
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycles.append((comp, list(reversed(path)) + [start]))
    return cycles


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_no_import_cycles():
    cycles = _cycles()
    lines = [f"{len(comp)} modules ({', '.join(comp)}), e.g. "
             + " -> ".join(f"{c[i]} (line {GRAPH[c[i]][c[i + 1]]})" for i in range(len(c) - 1)) + f" -> {c[-1]}"
             for comp, c in cycles]
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(lines)


def test_no_import_from_a_higher_layer():
    bad = [f"{_show(a)} (layer {layer_of(a)}, line {line}) imports {_show(b)} (layer {layer_of(b)})"
           for a in sorted(GRAPH) for b, line in sorted(GRAPH[a].items()) if layer_of(b) > layer_of(a)]
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_only_integration_imports_megatron():
    bad = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(m == "megatron" or m.startswith("megatron.") for m in mods) and not name.startswith("integration."):
                bad.append(f"{_show(name)} line {node.lineno}")
    assert not bad, "megatron imported outside integration/: " + ", ".join(bad)


def _top_names(tree) -> Set[str]:
    """Names a module defines at its top level (under if/try too), or '*' if it has __getattr__."""
    out = set()

    def scan(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                scan(node.body)
                scan(node.orelse)
                for h in getattr(node, "handlers", ()):
                    scan(h.body)
                scan(getattr(node, "finalbody", ()))
    scan(tree.body)
    if "__getattr__" in out:
        out.add("*")
    return out


def test_every_package_import_names_something_that_exists():
    names = {m: _top_names(t) for m, t in TREES.items()}
    bad = []
    for name, tree in TREES.items():
        is_pkg = MODULES[name].name == "__init__.py"
        here = name.split(".") if name else []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    local = _local(a.name)
                    if local is not None and local not in MODULES:
                        bad.append(f"{_show(name)} line {node.lineno}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                src = _from_source(node, here, is_pkg)
                if src is None:
                    continue
                for a in node.names:
                    full = f"{src}.{a.name}" if src else a.name
                    if full in MODULES or (src in MODULES and ({a.name, "*"} & names[src])):
                        continue
                    bad.append(f"{_show(name)} line {node.lineno}: from {_show(src)} import {a.name}")
    assert not bad, "imports of modules or names that do not exist:\n" + "\n".join(bad)


PLAN_ONE_BATCH = textwrap.dedent("""
    import json, sys
    import megatron_zeppelin.planner as planner
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology
    prof = load_profile("a800")
    topo = Topology(2, 8, prof.nics_per_node, prof.gpu_to_nic)
    plan = planner.plan_batch([30000, 900, 1200, 4000] * 8, topo, prof, load_model("llama-7b"))
    assert plan.world_size == 16
    print(json.dumps({"file": planner.__file__, "modules": sorted(sys.modules)}))
""")


def test_planning_loads_no_torch_megatron_or_higher_layer():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT.parent)] + [p for p in
               os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    res = subprocess.run([sys.executable, "-c", PLAN_ONE_BATCH], env=env, capture_output=True, text=True,
                         timeout=300, cwd=str(ROOT.parent))
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().parent == ROOT / "planner"  # the tree this test parsed
    loaded = out["modules"]
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "megatron")]
    assert not heavy, f"planning loaded {heavy[:5]}"
    above = [m for m in loaded if _local(m) is not None and _local(m) in MODULES and layer_of(_local(m)) > PLANNER_TOP]
    assert not above, f"planning loaded modules above the planner: {above}"
    assert not [m for m in loaded if m.startswith(f"{PKG}.dp_study")]
