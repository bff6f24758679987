"""Type-check dashboard JSON against ``@grafana/schema`` (Grafana's published TypeScript types) with ``tsc``.

The Python SDK that writes ``dashboards/json`` is generated from the same CUE schema as Grafana's
TypeScript types, but nothing stops a hand-set field, a raw dict or an SDK bug from producing JSON
that Grafana's own types reject. This module asks the TypeScript compiler, with the types Grafana
publishes on npm (pinned in ``dashboards/schema/package.json``).

Algorithm:

1. For each dashboard, write ``<name>.ts`` into a scratch directory: the whole dashboard as an
   object literal typed ``Dashboard``; then, for every panel (rows' panels included), its
   ``options`` typed with its panel type's ``Options`` and its ``fieldConfig.defaults.custom``
   with that panel type's ``FieldConfig`` (``Record<string, never>`` where the panel type has
   none). The veneer ``Dashboard`` types both as ``Record<string, unknown>``, so only these extra
   literals check them. A panel type with no schema in the package is itself an error.
2. Every type is wrapped in ``Json<T>``, which turns string enums into the union of their values:
   JSON holds ``"list"``, and TypeScript never lets a string literal stand for ``LegendDisplayMode.List``.
   Object literals keep TypeScript's excess-property check, so a field the schema lacks is an error.
3. Every line of the literals records the JSON path it came from (``panels[3].gridPos``).
4. Run ``tsc --noEmit --strict`` over the directory (options from ``dashboards/schema/tsconfig.json``)
   and map each error's file and line back to the dashboard and the JSON path.

Before step 1, ``ALLOWANCES`` adjust the few fields where grafana-foundation-sdk 0.0.21 and
``@grafana/schema`` 12.4 disagree harmlessly (each says why); every other difference is an error.
Queries (``targets``) stay unchecked: the schema types them ``Record<string, unknown>`` and the
Prometheus query type is not part of ``@grafana/schema``.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "dashboards/schema"
NODE_MODULES = SCHEMA_DIR / "node_modules"
JSON_DIR = ROOT / "dashboards/json"
PACKAGE = "@grafana/schema"
INSTALL_HINT = "run `make test`, or `npm ci --prefix dashboards/schema`, to install it"
# A panel type's module in the package's exports map, e.g. the key
# ./dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen for panel type timeseries.
PANEL_EXPORT = re.compile(r"^\./dist/esm/raw/composable/(?P<kind>[a-z0-9]+)/panelcfg/x/\w+_types\.gen$")
FIELD_CONFIG = re.compile(r"^export interface FieldConfig\b", re.M)
TSC_ERROR = re.compile(r"^(?P<file>\S+\.ts)\((?P<line>\d+),\d+\): error (?P<code>TS\d+): (?P<text>.*)$")
# Step 2: string enums become their values, recursively; numbers, booleans and plain strings stay.
PRELUDE = """\
type Json<T> = T extends string ? `${T}`
  : T extends readonly (infer E)[] ? Json<E>[]
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;"""
# tsc 7 checks the four dashboards in about a second; the margin is for a loaded CI machine.
TIMEOUT_S = 120

Line = tuple[str, str]  # (TypeScript text, the JSON path it holds)


DROP: Final = object()  # Allowance.fill: remove the field instead of filling it in


@dataclass(frozen=True)
class Allowance:
    """A field where the SDK's JSON and Grafana's types differ harmlessly, adjusted before the check.

    ``scope`` is ``"variable"`` (every ``templating.list`` entry) or a panel type id; ``key`` a dotted
    path inside it. ``fill`` is ``DROP`` (remove the field where present) or the value Grafana
    assumes where the field is absent (set where absent).
    """

    scope: str
    key: str
    fill: object
    why: str


_VARIABLE_INTERVAL = ("grafana-foundation-sdk 0.0.21 writes its interval-variable defaults on every variable; "
                      "Grafana's VariableModel declares none of them and ignores them on other variable types")
ALLOWANCES: Final = (
    Allowance("variable", "auto", DROP, _VARIABLE_INTERVAL),
    Allowance("variable", "auto_count", DROP, _VARIABLE_INTERVAL),
    Allowance("variable", "auto_min", DROP, _VARIABLE_INTERVAL),
    Allowance("variable", "definition", DROP,
              "Grafana saves a query variable's query text as definition (the v2 schema declares it, "
              "QueryVariableSpec.definition), the v1 VariableModel does not; dashboards/panels.py sets it so that "
              "the variable editor shows the query"),
    Allowance("table", "options.footer", DROP,
              "the SDK writes the old table footer, {show: false}; Grafana 12.2 moved the footer into each field's "
              "config (custom.footer), and an absent footer is the same no footer"),
    Allowance("table", "fieldConfig.defaults.custom.cellOptions", {"type": "auto"},
              "required in Grafana's TableFieldOptions but omitted by the SDK; Grafana's table panel defaults "
              "it to the auto cell type when the dashboard loads"),
)


class SchemaToolMissing(RuntimeError):
    """``tsc`` or ``@grafana/schema`` is not installed under ``dashboards/schema/node_modules``."""


@dataclass(frozen=True)
class PanelSchema:
    """A panel type's module in ``@grafana/schema``: its import specifier, and whether it has a ``FieldConfig``."""

    specifier: str
    has_field_config: bool


@dataclass(frozen=True)
class SchemaError:
    """One error, placed in a dashboard: ``path`` is the JSON path (``panels[3].gridPos``; ``""`` the whole)."""

    dashboard: str
    path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.path or '(dashboard)'}: {self.code} {self.message}"


def tsc_binary(node_modules: Path = NODE_MODULES) -> Path:
    """The installed ``tsc``, once node (which runs it) is on PATH."""
    if shutil.which("node") is None:
        raise SchemaToolMissing("node is not on PATH: install the Debian packages nodejs and npm (`make test` does)")
    tsc = node_modules / ".bin/tsc"
    if not tsc.exists():
        raise SchemaToolMissing(f"tsc (npm package typescript) is missing from {node_modules}: {INSTALL_HINT}")
    return tsc


def panel_schemas(node_modules: Path = NODE_MODULES) -> dict[str, PanelSchema]:
    """Panel type id -> its module, read from the installed package's exports map and type declarations."""
    root = node_modules / PACKAGE
    if not (root / "package.json").is_file():
        raise SchemaToolMissing(f"{PACKAGE} is missing from {node_modules}: {INSTALL_HINT}")
    out = {}
    for key, target in json.loads((root / "package.json").read_text())["exports"].items():
        if match := PANEL_EXPORT.match(key):
            declarations = (root / target["types"]).read_text()
            out[match["kind"]] = PanelSchema(PACKAGE + key[1:], bool(FIELD_CONFIG.search(declarations)))
    return out


def literal(value: object, path: str = "", depth: int = 0) -> list[Line]:
    """``value`` as a TypeScript literal, one member per line, each line tagged with the JSON path it holds.

    The first line is not indented (the caller puts a declaration before it); every member ends in a
    comma, which TypeScript allows after the last one too.
    """
    members: list[tuple[str, str, object]]
    if isinstance(value, Mapping) and value:
        members = [(f"{path}.{k}" if path else k, f"{json.dumps(k)}: ", v) for k, v in value.items()]
        opener, closer = "{", "}"
    elif isinstance(value, list) and value:
        members = [(f"{path}[{i}]", "", v) for i, v in enumerate(value)]
        opener, closer = "[", "]"
    else:
        return [(json.dumps(value), path)]
    pad = "  " * (depth + 1)
    out = [(opener, path)]
    for member_path, head, item in members:
        inner = literal(item, member_path, depth + 1)
        inner[0] = (pad + head + inner[0][0], inner[0][1])
        inner[-1] = (inner[-1][0] + ",", inner[-1][1])
        out += inner
    return [*out, ("  " * depth + closer, path)]


def declaration(name: str, type_name: str, value: object, path: str) -> list[Line]:
    """``const <name>: Json<<type_name>> = <value>;``, its lines tagged with JSON paths under ``path``."""
    body = literal(value, path)
    body[0] = (f"const {name}: Json<{type_name}> = {body[0][0]}", body[0][1])
    body[-1] = (body[-1][0] + ";", body[-1][1])
    return body


def panels(board: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(JSON path, panel)`` of every panel of ``board``, a row's own panels after the row.

    Entries that are not objects are passed over here; the ``Dashboard`` type reports them.
    """
    for i, panel in _objects(board.get("panels")):
        yield f"panels[{i}]", panel
        for j, inner in _objects(panel.get("panels")):
            yield f"panels[{i}].panels[{j}]", inner


def _objects(items: object) -> list[tuple[int, dict[str, Any]]]:
    """``(index, item)`` of the objects in ``items`` where it is a list, else none."""
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)] if isinstance(items, list) else []


def allow(board: Mapping[str, Any],
          allowances: Sequence[Allowance] = ALLOWANCES) -> tuple[dict[str, Any], list[Allowance]]:
    """A copy of ``board`` with ``allowances`` applied, and those that changed something."""
    out = copy.deepcopy(dict(board))
    scopes = [("variable", v) for _, v in _objects((_member(out, ["templating"]) or {}).get("list"))]
    scopes += [(str(panel.get("type")), panel) for _, panel in panels(out)]
    used = []
    for allowance in allowances:
        *parents, leaf = allowance.key.split(".")
        for holder in (_member(item, parents) for scope, item in scopes if scope == allowance.scope):
            if holder is None or (leaf in holder) != (allowance.fill is DROP):
                continue
            if allowance.fill is DROP:
                del holder[leaf]
            else:
                holder[leaf] = copy.deepcopy(allowance.fill)
            if allowance not in used:
                used.append(allowance)
    return out, used


def _member(item: Any, keys: Sequence[str]) -> dict[str, Any] | None:
    """``item[keys[0]][keys[1]]...`` where every step is an object, else ``None``."""
    for key in keys:
        item = item.get(key) if isinstance(item, dict) else None
    return item if isinstance(item, dict) else None


def source(board: Mapping[str, Any], schemas: Mapping[str, PanelSchema]) -> tuple[list[Line], list[tuple[str, str]]]:
    """Step 1 for one dashboard: its TypeScript lines, and ``(JSON path, problem)`` of panels with no schema."""
    checks: list[Line] = []
    unknown: list[tuple[str, str]] = []
    used: dict[str, str] = {}
    for n, (path, panel) in enumerate(panels(board)):
        kind = str(panel.get("type"))
        if kind == "row":
            continue
        schema = schemas.get(kind)
        if schema is None:
            unknown.append((f"{path}.type", f"panel type {kind!r} has no schema in {PACKAGE} (known: "
                                            f"{', '.join(sorted(schemas))})"))
            continue
        alias = used.setdefault(kind, f"panel_{len(used)}")
        if "options" in panel:
            checks += declaration(f"options_{n}", f"{alias}.Options", panel["options"], f"{path}.options")
        custom = (_member(panel, ["fieldConfig", "defaults"]) or {}).get("custom")
        if custom is not None:
            custom_type = f"{alias}.FieldConfig" if schema.has_field_config else "Record<string, never>"
            checks += declaration(f"custom_{n}", custom_type, custom, f"{path}.fieldConfig.defaults.custom")
    imports = [f"import type {{ Dashboard }} from {json.dumps(PACKAGE)};"]
    imports += [f"import type * as {alias} from {json.dumps(schemas[kind].specifier)};" for kind, alias in used.items()]
    head = [(text, "") for text in [*imports, *PRELUDE.splitlines()]]
    return [*head, *declaration("dashboard", "Dashboard", board, ""), *checks], unknown


def check(boards: Mapping[str, object], node_modules: Path = NODE_MODULES) -> list[SchemaError]:
    """Every schema error of ``boards`` (dashboard name -> its parsed JSON); ``[]`` when all conform.

    Raises:
        SchemaToolMissing: ``tsc`` or ``@grafana/schema`` is not installed.
        RuntimeError: tsc failed without reporting errors (a broken install, an unsupported node).
    """
    tsc, schemas = tsc_binary(node_modules), panel_schemas(node_modules)
    errors: list[SchemaError] = []
    files: dict[str, tuple[str, list[Line]]] = {}
    with tempfile.TemporaryDirectory(prefix="chopper-tscheck-") as tmp:
        scratch = Path(tmp)
        # Module resolution looks for node_modules beside the sources.
        (scratch / "node_modules").symlink_to(node_modules.resolve(), target_is_directory=True)
        (scratch / "tsconfig.json").write_text(json.dumps({"extends": str(SCHEMA_DIR / "tsconfig.json"),
                                                            "include": ["*.ts"]}))
        for i, (name, board) in enumerate(boards.items()):
            if not isinstance(board, Mapping):
                problem = f"a dashboard is one JSON object, not {type(board).__name__}"
                errors.append(SchemaError(name, "", "schema", problem))
                continue
            lines, unknown = source(allow(board)[0], schemas)
            errors += [SchemaError(name, path, "schema", problem) for path, problem in unknown]
            file = f"board{i}_{re.sub(r'[^A-Za-z0-9]', '_', Path(name).stem)}.ts"
            files[file] = (name, lines)
            (scratch / file).write_text("\n".join(text for text, _ in lines) + "\n")
        if not files:
            return errors
        done = subprocess.run([str(tsc), "--project", "tsconfig.json", "--noEmit", "--strict", "--pretty", "false"],
                              cwd=scratch, capture_output=True, text=True, timeout=TIMEOUT_S)
    found = parse_tsc(done.stdout, files)
    if done.returncode != 0 and not found:
        raise RuntimeError(f"tsc exited {done.returncode} without a type error:\n{done.stdout}{done.stderr}")
    return errors + found


def parse_tsc(output: str, files: Mapping[str, tuple[str, list[Line]]]) -> list[SchemaError]:
    """tsc's ``--pretty false`` errors, each with its indented elaboration, placed by ``files``' line tags."""
    errors: list[SchemaError] = []
    for row in output.splitlines():
        if (match := TSC_ERROR.match(row)) and Path(match["file"]).name in files:
            name, lines = files[Path(match["file"]).name]
            errors.append(SchemaError(name, lines[int(match["line"]) - 1][1], match["code"], match["text"]))
        elif errors and row.startswith(" "):
            last = errors[-1]
            errors[-1] = SchemaError(last.dashboard, last.path, last.code, f"{last.message}\n    {row.strip()}")
    return errors


def check_files(paths: Sequence[Path]) -> list[SchemaError]:
    """:func:`check` on dashboard JSON files, each named by its path relative to the repository."""
    return check({_shown(p): json.loads(p.read_text()) for p in paths})


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    full = path.resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dashboards.schema [FILE ...]``: 0 when every dashboard conforms, 1 on errors, 2 uninstalled."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("files", nargs="*", type=Path, help="dashboard JSON (default: dashboards/json/*.json)")
    args = parser.parse_args(argv)
    try:
        errors = check_files(args.files or sorted(JSON_DIR.glob("*.json")))
    except SchemaToolMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0
