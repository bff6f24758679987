"""Build the ``chopper-client`` wheel: the marker client and framework hooks of ``chopper``, nothing else.

Usage::

    python packaging/client/build_wheel.py [--out DIR]   # prints the wheel's path
    python packaging/client/build_wheel.py --list        # prints the modules it would hold

The thin wheel is built from the repository's own ``chopper/`` sources; no copy is committed.
setuptools packages whole directories, and ``chopper/`` also holds the analysis tools, so the
modules are staged first. Algorithm:

1. Start from ``ROOTS``, the modules training code imports.
2. Close over their imports, read from the source (``ast``, nothing is imported): every import that
   runs counts, at module level or in a function, but not one under ``if TYPE_CHECKING:``; each
   module brings its parent packages, whose ``__init__`` runs first. ``from pkg import name`` is
   ``pkg.name`` where that is a module, else ``pkg``.
3. Refuse, naming the chain of imports, when the closure reaches a module of the full distribution
   only (``FULL_ONLY``) or a third-party package outside ``THIRD_PARTY``.
4. Stage those files, the wire contract's ``.proto`` and ``.pyi`` files, ``pyproject.toml`` and
   ``README.md`` of this folder into a temporary directory, and build it with
   ``pip wheel --no-deps --no-build-isolation`` (setuptools from the running interpreter).
5. Check that the wheel holds exactly the staged modules: ``pyproject.toml`` names the packages.
"""
from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

ROOTS = (
    "chopper",  # init, step, phase, collective, stats, shutdown: brings the client, identity, schema, profiler
    "chopper.pytorch", "chopper.torch", "chopper.hf", "chopper.lightning",  # framework hooks
    # The wire contract: the client speaks the agent's service; the aggregator's messages embed the agent's.
    "chopper.proto.chopper.v1.agent_pb2_grpc", "chopper.proto.chopper.v1.aggregator_pb2_grpc",
)

# Packages of the full distribution (chopper-telemetry) only: daemons, analysis tools and the CLI,
# whose dependencies (numpy, pandas, pyarrow, matplotlib, psutil, ...) a training image does not have.
FULL_ONLY = (
    "agent", "aggregator", "chopper.attribution", "chopper.cli", "chopper.daemon", "chopper.demo",
    "chopper.inspector", "chopper.predict", "chopper.report", "chopper.runs", "chopper.trace",
)

# Third-party imports the thin wheel may make, with where each comes from.
THIRD_PARTY = {
    "grpc": "grpcio, a dependency",
    "google": "protobuf, a dependency",
    "torch": "the training image's (chopper.pytorch, chopper.lightning; an extra)",
    "transformers": "the training image's (chopper.hf; an extra)",
    "lightning": "the training image's (chopper.lightning; an extra)",
    "pytorch_lightning": "the training image's (chopper.lightning's fallback)",
}

# Files beside the modules that the wheel carries: the contract's sources and the stubs' types.
PACKAGE_DATA = ("*.proto", "*.pyi")


class ClosureError(Exception):
    """The client's imports reach something the thin wheel must not hold."""


def _known_modules() -> dict[str, Path]:
    """Every module of the repository's packages, by dotted name."""
    known = {}
    for package in ("chopper", "agent", "aggregator"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            known[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return known


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield child
                yield from _runtime_nodes(child)
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Dotted names that module ``name`` imports at run time: modules of ``known``, else the name as written."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _chain(name: str, via: dict[str, str | None]) -> str:
    steps = [name]
    while (parent := via[steps[-1]]) is not None:
        steps.append(parent)
    return " <- ".join(steps)


def client_modules() -> dict[str, Path]:
    """The modules of the thin wheel, by dotted name: the import closure of ``ROOTS`` (module docstring).

    Raises:
        ClosureError: The closure reaches ``FULL_ONLY`` or a third-party package outside ``THIRD_PARTY``.
    """
    known = _known_modules()
    via: dict[str, str | None] = dict.fromkeys(ROOTS)
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if any(name == p or name.startswith(p + ".") for p in FULL_ONLY):
            raise ClosureError(
                f"{name} belongs to the full distribution (chopper-telemetry) only, and the thin client must "
                f"not hold it (imported as {_chain(name, via)}); import it from a module outside the client's "
                "closure, or move what the client needs out of it")
        if name not in known:
            raise ClosureError(f"no module {name} in the repository (imported as {_chain(name, via)})")
        for target in sorted(_imports(name, known[name], known)):
            top = target.partition(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top not in ("chopper", "agent", "aggregator"):
                if top not in THIRD_PARTY:
                    raise ClosureError(
                        f"{name} (imported as {_chain(name, via)}) imports {target}, which the thin client "
                        "neither depends on nor expects in a training image; import it from a module outside "
                        f"the client's closure, or add {top} to THIRD_PARTY in {__file__} with the dependency "
                        "that provides it")
                continue
            for module in (*_parents(target), target):
                if module not in via:
                    via[module] = name
                    todo.append(module)
    return {name: known[name] for name in sorted(via)}


def stage(modules: dict[str, Path], into: Path) -> None:
    """Copy ``modules``, their packages' data files and this folder's pyproject.toml and README.md into ``into``."""
    for path in modules.values():
        target = into / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        if path.name == "__init__.py":
            for pattern in PACKAGE_DATA:
                for data in path.parent.glob(pattern):
                    shutil.copy2(data, target.parent / data.name)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(HERE / name, into / name)


def build(out: Path) -> Path:
    """Build the thin wheel into ``out`` and return its path.

    Raises:
        ClosureError: As ``client_modules``.
        RuntimeError: setuptools is missing or the build failed (its output in the message).
    """
    modules = client_modules()
    try:
        import setuptools  # noqa: F401 (the build backend, run below in a pip subprocess)
    except ImportError as e:
        raise RuntimeError(f"building needs setuptools>=77 in {sys.executable}: "
                           "pip install 'setuptools>=77' (the dev venv has it)") from e
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chopper-client-") as tmp:
        staged = Path(tmp) / "src"
        stage(modules, staged)
        wheels = Path(tmp) / "wheels"
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "-w", str(wheels), str(staged)], capture_output=True, text=True)
        built = sorted(wheels.glob("chopper_client-*.whl"))
        if done.returncode != 0 or len(built) != 1:
            raise RuntimeError(f"pip wheel failed (exit {done.returncode}): {done.stdout}{done.stderr}")
        _check_holds(built[0], modules)
        target = out / built[0].name
        shutil.copy2(built[0], target)
    return target


def _check_holds(wheel: Path, modules: dict[str, Path]) -> None:
    """Raise unless ``wheel`` holds exactly the modules staged (pyproject.toml names the packages)."""
    with zipfile.ZipFile(wheel) as archive:
        held = {name for name in archive.namelist() if name.endswith(".py")}
    staged = {path.relative_to(ROOT).as_posix() for path in modules.values()}
    if held != staged:
        raise RuntimeError(f"the wheel lacks {sorted(staged - held)} and has {sorted(held - staged)} beyond the "
                           f"client's modules: make [tool.setuptools] packages in {HERE / 'pyproject.toml'} name "
                           "the client's packages")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "client-wheel",
                        help="directory to write the wheel into (default: build/client-wheel)")
    parser.add_argument("--list", action="store_true", help="print the modules of the wheel and exit")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for name, path in client_modules().items():
                print(f"{name}\t{path.relative_to(ROOT)}")
        else:
            print(build(args.out))
    except (ClosureError, RuntimeError) as e:
        print(f"build_wheel: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
