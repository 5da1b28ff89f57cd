"""The layout shows the architecture, and the code keeps to it: shared parts import no method, methods import no
other method, and no public function takes more than 8 parameters besides configuration objects."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "labmod"
METHODS = ("s2s", "dreamgym", "webgym")
SHARED = ("core", "agent", "rollout", "models", "envs", "rl")
MAX_PARAMS = 8


def modules():
    "(dotted name, parsed tree) of every module of the package but nbdev's index."
    for p in sorted(PKG.rglob("*.py")):
        if p.name == "_modidx.py": continue
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield name, ast.parse(p.read_text())


def imported(name: str, tree: ast.AST) -> set[str]:
    "The labmod modules `name` imports (relative imports resolved)."
    pkg = name.split(".") if (PKG.parent / Path(*name.split("."))).is_dir() else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import): out |= {a.name for a in node.names if a.name.startswith("labmod")}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[:len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x) if node.level else (node.module or "")
            if mod.startswith("labmod"): out.add(mod)
    return out


def part(module: str) -> str:
    "The top-level part of the package a module belongs to (`labmod.rl.run` -> `rl`)."
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "labmod"


def test_the_layout_shows_the_parts():
    dirs = {p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert {"envs", "rl", "lab", *METHODS} <= dirs, sorted(dirs)
    assert {"core.py", "agent.py", "rollout.py", "models.py"} <= {p.name for p in PKG.glob("*.py")}


def test_shared_parts_import_no_method():
    bad = [(m, i) for m, t in modules() if part(m) in SHARED for i in imported(m, t) if part(i) in METHODS]
    assert not bad, f"shared modules import method packages: {bad}"


def test_methods_import_no_other_method():
    bad = [(m, i) for m, t in modules() if part(m) in METHODS for i in imported(m, t)
           if part(i) in METHODS and part(i) != part(m)]
    assert not bad, f"a method imports another method's internals: {bad}"


def _public_functions(tree: ast.AST):
    "Public functions and methods (and `__init__`s of public classes), with their parameter count."
    def params(fn):
        a = fn.args
        return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node.lineno, params(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and (sub.name == "__init__" or not sub.name.startswith("_")):
                    yield f"{node.name}.{sub.name}", sub.lineno, params(sub)


def test_no_public_function_over_eight_parameters():
    offenders = [f"{m}.{f} (line {ln}): {len(ps)} parameters" for m, t in modules()
                 for f, ln, ps in _public_functions(t) if len(ps) > MAX_PARAMS]
    assert not offenders, "group these parameters into configuration dataclasses:\n  " + "\n  ".join(offenders)


def test_every_notebook_cell_has_an_id():
    """nbdev-export names each exported cell by its id; a cell without one gets a new random id per export, so `labmod/`
    would differ from what the notebooks export in every fresh clone (make test's export check)."""
    import json
    missing = [f"{p.relative_to(PKG.parent)} cell {i}" for p in sorted((PKG.parent / "nbs").rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts
               for i, c in enumerate(json.loads(p.read_text())["cells"]) if not c.get("id")]
    assert not missing, f"give these cells an id (open and save the notebook in JupyterLab, or add one): {missing}"
