"""The layer guard: every import inside ``legionpy/`` runs down the layer
table of DESIGN.md section 1 (and docs/layers.md), including imports inside
functions, and no module imports another module's private (``_x``) name.

The table, bottom up (a module may import its own group and any group of a
lower rank; groups of the same rank are siblings and never import each
other)::

    0  errors
    1  geometry
    2  atomic, progress, placement, data,    leaves
       collectives, pipeline
    3  regions
    4  ops
    5  runtime, optimizer                    siblings: neither imports the other
    6  probe, interrupt                      run real tasks / talk to the ranks
    7  mapper
    8  nn
    9  models, frontends
    10 measure
    11 commands (cli.py, __main__.py, commands/)
    12 legionpy/__init__.py                  lazy public names

Each allowed exception names the importing module, the imported module and
the reason; the list is meant to stay empty or nearly so. A new entry needs a
reason a reviewer would accept (an up-call that cannot be injected), not
"it was easier".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "legionpy"

#: group -> rank. Top-level module or subpackage name of ``legionpy``.
RANKS = {
    "errors": 0,
    "geometry": 1,
    "atomic": 2, "progress": 2, "placement": 2, "data": 2,
    "collectives": 2,  # the collective rule both halves share (docs/seam.md)
    "pipeline": 2,  # the pipeline rule both halves share (docs/pipeline.md)
    "affinity": 2,  # which cores each rank runs on: the runtime binds, the model shares them
    "regions": 3,
    "ops": 4,
    "runtime": 5, "optimizer": 5,
    "probe": 6, "interrupt": 6,
    "mapper": 7,
    "nn": 8,
    "models": 9, "frontends": 9,
    "measure": 10,
    "commands": 11, "cli": 11, "__main__": 11,
    "__init__": 12,
}
#: groups that are one layer although they are separate names
SAME_LAYER = {"cli": "commands", "__main__": "commands"}

#: (importing module, imported module) -> why this arrow against the table
#: is allowed. Module names are dotted, without the ``legionpy.`` prefix.
ALLOWED_ARROWS: dict[tuple[str, str], str] = {
    ("optimizer.machine", "probe.machine"):
        "Machine.local() is the README's spelling of the measured local machine; it "
        "only forwards to legionpy.probe.machine.local_machine (the optimizer never measures)",
    ("optimizer.kernel_timing", "runtime.gpu"):
        "tile_runner, the measured cost model's default runner (FlexFlow times each "
        "kernel), puts a GPU tile's arrays on the device through the runtime's array "
        "backend (CuPy or emulated); moving it to probe/ needs cost_model_from_spec to "
        "take the runner from its caller (follow-up to issue 23)",
    ("models", "frontends"):
        "a MODEL argument may be an .onnx path (models.build / models.graph, every "
        "command); the zoo hands it to the ONNX importer. frontends never import models, "
        "so the two stay acyclic",
}

#: (importing module, imported module, name) -> why the private name crosses.
ALLOWED_PRIVATE: dict[tuple[str, str, str], str] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts)


def resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute dotted module (without ``legionpy.``) of a from-import,
    or "" when it is outside the package."""
    if node.level == 0:
        mod = node.module or ""
        return mod[len("legionpy."):] if mod.startswith("legionpy.") else ""
    # "a/b/c.py" is module a.b.c and "a/b/__init__.py" is a.b.__init__: both
    # resolve "." to package a.b
    base = module_name(path).split(".")[:-1]
    up = node.level - 1
    if up > len(base):
        raise AssertionError(f"{path}: relative import beyond the package")
    base = base[: len(base) - up]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(path: Path):
    """Yield (imported module, [names], line) for every legionpy import in
    ``path``, at any depth. ``from . import x`` yields module ``pkg.x`` for
    each submodule name that exists, else ``pkg`` with the name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("legionpy."):
                    yield alias.name[len("legionpy."):], [], node.lineno
        elif isinstance(node, ast.Call) and _called(node) == "import_module" and node.args:
            dotted = _constant_prefix(node.args[0])
            if dotted.startswith("legionpy.") and _exists(dotted[len("legionpy."):]):
                yield dotted[len("legionpy."):], [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = resolve(path, node)
            if not target and node.level == 0 and node.module != "legionpy":
                continue
            if not target:
                # names from legionpy/__init__: its lazy exports stand for the
                # modules that define them; __version__ is a leaf
                for alias in node.names:
                    if _exists(alias.name):
                        yield alias.name, [], node.lineno
                    elif alias.name != "__version__":
                        yield _top_exports()[alias.name][len("legionpy."):], [alias.name], \
                            node.lineno
                continue
            names = [a.name for a in node.names]
            sub = [n for n in names if _exists(f"{target}.{n}" if target else n)]
            for n in sub:
                yield (f"{target}.{n}" if target else n), [], node.lineno
            rest = [n for n in names if n not in sub]
            if rest:
                yield target, rest, node.lineno


def _called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _constant_prefix(arg: ast.expr) -> str:
    """"legionpy.a.b" for a constant, the constant head of an f-string up to
    its last dot ("legionpy.commands" for f"legionpy.commands.{name}")."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        head = str(arg.values[0].value)
        return head.rsplit(".", 1)[0] if len(arg.values) > 1 else head
    return ""


def _top_exports() -> dict[str, str]:
    """legionpy/__init__.py's ``_EXPORTS`` (public name -> module), read
    from the source without importing the package."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            return ast.literal_eval(node.value)
    raise AssertionError("legionpy/__init__.py has no _EXPORTS table")


def _exists(dotted: str) -> bool:
    p = PACKAGE.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def group(dotted: str) -> str:
    head = dotted.split(".")[0] if dotted else "__init__"
    return SAME_LAYER.get(head, head)


def rank(dotted: str) -> int:
    g = dotted.split(".")[0] if dotted else "__init__"
    if g not in RANKS:
        raise AssertionError(f"module legionpy.{dotted} is in no layer: add its package to "
                             "RANKS here, to DESIGN.md section 1 and to docs/layers.md")
    return RANKS[g]


def all_modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def against_table(src: str, dst: str) -> bool:
    """True when module ``src`` importing ``dst`` runs up or sideways."""
    return group(dst) != group(src) and rank(dst) >= rank(src)


def scan():
    """(arrows, privates): every import against the table and every private
    name imported across modules, as found in the source today."""
    arrows, privates = {}, {}
    for path in all_modules():
        me = module_name(path)
        me_mod = me[: -len(".__init__")] if me.endswith(".__init__") else me
        me_mod = "" if me_mod == "__init__" else me_mod
        for target, names, line in imports(path):
            if against_table(me_mod, target):
                arrows.setdefault((me_mod, target), line)
            if target != me_mod:
                for n in names:
                    if n.startswith("_") and not n.startswith("__"):
                        privates.setdefault((me_mod, target, n), line)
    return arrows, privates


def test_every_module_has_a_layer():
    for path in all_modules():
        rank(module_name(path))


def test_imports_run_down_the_table():
    arrows, _ = scan()
    bad = [f"legionpy/{src.replace('.', '/')}.py:{line} imports legionpy.{dst} "
           f"(layer {group(src)} rank {rank(src)} -> {group(dst)} rank {rank(dst)})"
           for (src, dst), line in sorted(arrows.items()) if (src, dst) not in ALLOWED_ARROWS]
    assert not bad, ("imports against the layer table (DESIGN.md section 1); pass the "
                     "policy in as an argument or move the code down:\n" + "\n".join(bad))


def test_no_private_names_cross_modules():
    _, privates = scan()
    bad = [f"legionpy/{src.replace('.', '/')}.py:{line} imports {name} from legionpy.{dst}"
           for (src, dst, name), line in sorted(privates.items())
           if (src, dst, name) not in ALLOWED_PRIVATE]
    assert not bad, ("private names imported from another module; make them public "
                     "(drop the underscore) where they are a real interface:\n" + "\n".join(bad))


def test_exceptions_are_still_needed():
    """An exception that no import uses any more must leave the list."""
    arrows, privates = scan()
    stale = [k for k in ALLOWED_ARROWS if k not in arrows]
    stale += [k for k in ALLOWED_PRIVATE if k not in privates]
    assert not stale, f"stale layer exceptions, remove them: {stale}"


@pytest.mark.parametrize("src,expect", [
    ("from ..runtime import core\n", ("runtime.core", [])),
    ("from ..runtime.core import Runtime\n", ("runtime.core", ["Runtime"])),
    ("def f():\n    from legionpy.optimizer.machine import _x\n",
     ("optimizer.machine", ["_x"])),
    ("import legionpy.nn.model\n", ("nn.model", [])),
])
def test_parser_sees_every_form(tmp_path, monkeypatch, src, expect):
    """The scanner resolves relative, absolute and function-level imports
    (checked on a file placed at legionpy/mapper/x.py)."""
    path = PACKAGE / "mapper" / "_layers_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: src)
    found = [(t, n) for t, n, _ in imports(path)]
    assert expect in found


def _loaded_after(code: str) -> list[str]:
    """The legionpy modules a fresh interpreter has loaded after ``code``."""
    import subprocess
    import sys

    code += ("\nimport sys\n"
             "print(' '.join(sorted(m for m in sys.modules if m.startswith('legionpy.'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    return [m[len("legionpy."):] for m in out]


def test_runtime_loads_neither_optimizer_nor_application_mappers():
    """Starting the runtime imports only what is below it (the mapper
    interface is the runtime's own, runtime/mapping.py)."""
    loaded = _loaded_after("import legionpy as lp\n"
                           "lp.runtime.Runtime(cpus=2, executor='serial').shutdown()")
    above = [m for m in loaded if rank(m) > rank("runtime")]
    assert not above, f"Runtime() imported modules above the runtime: {above}"


def test_optimizer_runs_without_the_runtime():
    """Search and simulation on a CPU machine model load no runtime module
    (the coherence rules they replay live in regions/)."""
    loaded = _loaded_after(
        "from legionpy.optimizer import Graph, Machine, Simulator, Strategy\n"
        "from legionpy.optimizer.search import search_for_model\n"
        "g = Graph(8); y = g.dense(g.input((16,)), 4)\n"
        "m = Machine.local(2)\n"
        "Simulator(g, m).simulate(Strategy.data_parallel(g, m))\n")
    assert not [m for m in loaded if group(m) == "runtime"], loaded


@pytest.mark.parametrize("src,dst,bad", [
    ("optimizer.taskgraph", "runtime.core", True),     # siblings
    ("runtime.core", "optimizer.strategy", True),
    ("regions.region", "runtime", True),               # upward
    ("runtime.core", "mapper", True),
    ("mapper.strategy", "nn.model", True),
    ("models", "frontends", True),                     # siblings
    ("runtime.core", "regions.coherence", False),      # downward
    ("probe.machine", "optimizer.machine", False),
    ("nn.model", "mapper.resolve", False),
    ("runtime.core", "runtime.mapping", False),        # inside a package
    ("cli", "commands.train", False),                  # one layer
])
def test_the_table_judges_arrows(src, dst, bad):
    assert against_table(src, dst) is bad
