"""The import graph of the tuner package, read from its source with ``ast``.

The data flows one way: the families build layouts and candidates, and the model predicts from them and
the profile. So the model imports the families, and no import of the families - at the top of a module or
inside a function - leads back to the model: a cycle between them holds only while some import is kept out
of the module's top, where it runs after both halves are loaded.
"""
import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tuner"  # the checkout's source, whichever tuner is installed


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("tuner",) + path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(module imported, line, inside a function) for every import of a tuner module by module ``name``.

    ``from X import y`` imports X.y where that is a module, else X; importing a.b.c also runs the
    ``__init__`` of its subpackage a.b (not of the top package, which only gathers the public names)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target not in known:
                continue
            parts = target.split(".")
            chain = [".".join(parts[:k]) for k in range(2, len(parts))] + [target]  # subpackages first
            out.extend((t, node.lineno, id(node) in in_function) for t in chain if t != name)
    return out


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_model_imports_the_families():
    # The direction the design wants, seen by this reading of the source (else the checks below say nothing).
    edges = graph()
    assert any(t == "tuner.families.tile_composite" for t, _, _ in edges["tuner.model.tile_composite"])
    assert any(in_package(t, "tuner.families") for t, _, _ in edges["tuner.model.lookup"])


def test_no_import_of_the_families_leads_back_to_the_model():
    """Every chain of imports from a module of tuner.families (at the top of a module or inside a function)
    stays out of tuner.model: with the model importing the families, one that reached it would close a
    cycle. The failure names the chain."""
    edges = graph()
    came_from: dict[str, tuple[str, int] | None] = {m: None for m in edges if in_package(m, "tuner.families")}
    queue = deque(came_from)
    cycles = []
    while queue:
        module = queue.popleft()
        for target, line, _ in edges[module]:
            if target in came_from:
                continue
            came_from[target] = (module, line)
            if in_package(target, "tuner.model"):
                chain, at = [target], came_from[target]
                while at is not None:
                    chain.append(f"{at[0]}:{at[1]}")
                    at = came_from[at[0]]
                cycles.append(" <- ".join(chain))
            else:
                queue.append(target)
    assert not cycles, "the families reach the model, which imports them:\n" + "\n".join(cycles)


def test_the_families_and_the_model_import_tuner_modules_at_the_top():
    """An import of a tuner module inside a function of the families or the model is how a cycle between
    them hides: the module loads without it, and the import runs once both halves are loaded."""
    hidden = [f"{m}:{line} imports {t}" for m, es in graph().items()
              if in_package(m, "tuner.families") or in_package(m, "tuner.model")
              for t, line, inside in es if inside]
    assert not hidden, "\n".join(hidden)


def test_importing_the_package_leaves_out_scipys_optimize_package():
    # A fifth of a second of every `import tuner`, and of every planner process's start
    # (tuner.plan_worker), for a fit that only `python -m tuner profile` makes.
    import subprocess
    import sys
    code = "import sys, tuner; print('scipy.optimize' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent, env={**__import__("os").environ, "PYTHONPATH": str(ROOT.parent)})
    assert out.stdout.strip() == "False"
