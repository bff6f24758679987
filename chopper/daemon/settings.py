"""Typed daemon settings from code defaults < YAML file < environment < flags (all Chopper daemons).

A daemon declares one frozen dataclass whose fields carry ``metadata={"help": ...}`` and describes
itself in a ``Daemon``; this module gives it a flag per field (``--sample-hz``, whose ``--help``
line shows the default and the variable), an environment variable per field
(``<PREFIX>SAMPLE_HZ``), YAML keys equal to the field names, ``--version``, type conversion with
messages that name the key, the value and its source, and the generated settings table of its
docs. Range and consistency checks stay with each daemon (``Daemon.check``).

Every value is read as *text*, and one parser per kind turns that text into the setting, whether
it came from the file, the environment or a flag, so a value means the same wherever it is written.
YAML's implicit typing is therefore not applied: under YAML 1.1 an unquoted ``0660`` is the
integer 432, ``no`` is false, ``1:30`` is 90 and ``~`` is null, and each of these would otherwise
reach a setting as something its writer did not mean (a socket mode of ``0o432``, a node called
``False``, a store directory called ``None``). The forms (``FORMS``):

- whole numbers: decimal (``1_000`` allowed), ``0x``/``0o``/``0b`` prefixed, or an integral
  ``1e6``; a leading zero (``010``) is refused, since YAML 1.1 reads it as octal and a shell
  variable as decimal;
- numbers: decimal or exponent form, finite; a whole number with a leading zero is refused as
  above; seconds are plain numbers (``5m`` and ``1:30`` are refused, not guessed);
- permission bits (``kind="mode"``): octal whichever way written (``0660``, ``660``, ``0o660``),
  stored as ``0660``;
- an empty YAML value or a plain ``~``/``null`` is "no value": empty text, an empty list, and
  refused where a number is needed; a key given twice is refused.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import math
import os
import re
import reprlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from chopper import __version__
from chopper.daemon.labels import JOB_LABEL, JOB_LABELS

T = TypeVar("T")

# A settings file is a few dozen lines: anything bigger is the wrong file (or /dev/zero).
MAX_CONFIG_BYTES = 1 << 20
# Largest max_message_bytes of either daemon: gRPC takes message limits as int32, and the servers
# accept up to twice the setting (chopper/daemon/serving.py), so 2 × this must stay below 2**31.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
INT64 = (-(2**63), 2**63 - 1)
# Values are quoted in messages through this: a YAML alias bomb must not expand in a repr.
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxstring, _shown.maxother = 2, 4, 4, 80, 80
FORMS = {
    "int": "a whole number in 64-bit range, decimal without leading zeros (or 0x.., 0o.., 0b..)",
    "float": "a finite number, e.g. 2.5 or 1e-3",
    "tuple[int, ...]": "whole numbers, comma-separated or as a YAML list",
    "tuple[str, ...]": "names without commas, comma-separated or as a YAML list",
    "str": "UTF-8 text without NUL characters",
    "mode": "octal permission bits up to 0777, e.g. 0660, 660 or 0o660",
}
SECONDS = "a number of seconds, e.g. 30 or 0.5 (no unit suffix, no h:m:s)"
# How YAML writes "no value" when it is not quoted (YAML 1.1 and 1.2 agree on these).
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
# A whole number written with a leading zero: octal to YAML 1.1, decimal to int() and to YAML 1.2.
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_MODE = re.compile(r"(?:0[oO])?([0-7]{1,4})")
# Integral floats are exact up to here; beyond, 1e300 would become a number nobody wrote.
_EXACT_FLOAT_INT = 2**53


class ConfigError(ValueError):
    """A setting is invalid; the message names the key, its source and the fix."""


@dataclasses.dataclass(frozen=True)
class Daemon(Generic[T]):
    """One daemon's settings and how it spells them: its flags, environment, docs table and version.

    Attributes:
        settings: The frozen settings dataclass; each field carries ``metadata={"help": ...}``.
        check: Range and consistency checks of loaded settings; raises ``ConfigError``.
        prog: Program name, e.g. ``chopper-agent``.
        description: One paragraph for ``--help``.
        env_prefix: Environment prefix, e.g. ``CHOPPER_AGENT_``.
        module: Module that prints the docs table, e.g. ``agent.config``.
        doc: The docs file it writes, e.g. ``docs/CONFIG.md``.
        title: Title of that file.
        shown_defaults: Defaults shown in words, by field, where the code's value is computed at start
            (``{"node": "(hostname)"}``).
    """

    settings: type[T]
    check: Callable[[T], None]
    prog: str
    description: str
    env_prefix: str
    module: str
    doc: str
    title: str
    shown_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def parser(self) -> argparse.ArgumentParser:
        """The daemon's flags: one per setting, showing its default and variable; ``--config``, ``--version``."""
        parser = argparse.ArgumentParser(
            prog=self.prog, usage="%(prog)s [--config FILE] [--SETTING VALUE ...] (--help lists the settings)",
            description=f"{self.description} Every flag also reads {self.env_prefix}<NAME> from the environment.",
        )
        parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
        parser.add_argument("--config", type=Path, metavar="FILE",
                            help=f"YAML settings file, keys as the settings below [env: {self.env_prefix}CONFIG]")
        for f in dataclasses.fields(self.settings):  # type: ignore[arg-type]
            # argparse formats help with %: a literal one must be doubled.
            where = f"default: {self._default_text(f)}; env: {self.env_prefix}{f.name.upper()}"
            help_text = f"{f.metadata['help']} [{where}]"
            parser.add_argument(
                "--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE",
                help=help_text.replace("%", "%%"),
            )
        return parser

    def _default_text(self, f: dataclasses.Field[Any]) -> str:
        """A field's default as one writes it in a flag (``10.0``, ``0660``, ``1,3``), ``empty`` for no value."""
        if f.name in self.shown_defaults:
            return self.shown_defaults[f.name]
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        return text or "empty"

    def load(self, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> T:
        """Merge defaults, YAML, environment and flags into settings, then ``check`` them.

        Args:
            argv: Command-line arguments (without the program name).
            env: Environment to read ``<env_prefix>*`` from; defaults to ``os.environ``.

        Raises:
            ConfigError: A value is malformed or out of range.
        """
        env = os.environ if env is None else env
        fields = {f.name: f for f in dataclasses.fields(self.settings)}  # type: ignore[arg-type]
        args = self.parser().parse_args(argv)
        prefix = self.env_prefix
        values: dict[str, Any] = {}
        config_path = args.config or (Path(env[prefix + "CONFIG"]) if env.get(prefix + "CONFIG") else None)
        if config_path is not None:
            for key, raw in _read_yaml(config_path, list(fields)).items():
                values[key] = _parse(fields[key], raw, f"config file {config_path}")
        for name, f in fields.items():
            raw = env.get(prefix + name.upper())
            if raw is not None:
                values[name] = _parse(f, raw, f"env {prefix}{name.upper()}")
        for name, f in fields.items():
            raw = getattr(args, name)
            if raw is not None:
                values[name] = _parse(f, raw, "--" + name.replace("_", "-"))
        settings = self.settings(**values)
        self.check(settings)
        return settings

    def markdown(self) -> str:
        """The generated settings table of the daemon's docs file (``python -m <module>``)."""
        lines = [
            f"# {self.title}",
            "",
            f"Generated from `{self.module.replace('.', '/')}.py` by `python -m {self.module} > {self.doc}`; a test "
            "keeps it current.",
            "Precedence: code defaults < YAML file (`--config`, keys as in the first column) < environment < flags.",
            "A bad value exits with status 2 and a message naming the key and the fix.",
            f"`{self.prog} --help` lists the same settings, each with its default and variable; `--version` prints "
            "the release. A listen address with port 0 takes a free port, and the daemon logs the one it bound "
            "(`event=listening <setting>=<host>:<port>`).",
            "",
            "Every value is read as the text written and means the same in the file, the environment and a flag: "
            "YAML's implicit types do not apply (an unquoted `0660` is the text 0660, `no` the text no). "
            "Whole numbers are decimal (`1_000`), `0x`/`0o`/`0b`-prefixed or integral (`1e6`); a leading zero "
            "(`010`) is refused, as YAML 1.1 reads it as octal and a shell variable as decimal. Settings in "
            "seconds (`_s`) are plain numbers: `5m` or `1:30` is refused. Permission bits are octal however "
            "written (`0660`, `660`, `0o660`). An empty value or a plain `~`/`null` is empty text or an empty "
            "list, and refused for a number. A setting given twice in the file is refused.",
            "",
            "| setting | flag | environment | default | meaning |",
            "|---|---|---|---|---|",
        ]
        for f in dataclasses.fields(self.settings):  # type: ignore[arg-type]
            default = self.shown_defaults.get(f.name, repr(f.default))
            lines.append(
                f"| `{f.name}` | `--{f.name.replace('_', '-')}` | `{self.env_prefix}{f.name.upper()}` | `{default}` "
                f"| {f.metadata['help']} |"
            )
        return "\n".join(lines) + "\n"


def is_host_port(value: str) -> bool:
    """``host:port`` of a listener, with a port in 0-65535 (0: any free port, which the daemon logs once bound)."""
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and int(port) < 65536)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of ``host:port``, brackets allowed) is a loopback address or ``localhost``."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Unclear(ValueError):
    """A value whose form is ambiguous; the message says why and what to write instead."""


class _Repeated(ValueError):
    """A settings file gives a key more than once; the message lists the keys."""


def _no_leading_zero(text: str) -> None:
    if _LEADING_ZERO.fullmatch(text):
        raise _Unclear("has a leading zero, which YAML 1.1 reads as octal and a shell variable as decimal")


def _whole(text: str) -> int:
    """A whole number in int64 range (see the module docstring for the forms)."""
    text = text.strip()
    _no_leading_zero(text)
    try:
        value = int(text, 0)  # base 0: decimal, 0x/0o/0b prefixes, underscores
    except ValueError:
        number = float(text)
        if not (number.is_integer() and abs(number) <= _EXACT_FLOAT_INT):
            raise ValueError from None
        value = int(number)
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError
    return value


def _real(text: str) -> float:
    """A finite number; a whole number with a leading zero is refused as for ``_whole``."""
    text = text.strip()
    _no_leading_zero(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError
    return value


def _mode(text: str) -> str:
    """Permission bits, octal in every spelling, as four octal digits (``0660``)."""
    match = _MODE.fullmatch(text.strip())
    if match is None or (value := int(match.group(1), 8)) > 0o777:
        raise ValueError
    return f"0{value:03o}"


def _text(text: str) -> str:
    if "\0" in text:
        raise ValueError
    try:
        # Bytes that are not UTF-8 (an environment variable or argument; Python keeps them as
        # surrogates) reach no gRPC target, log line or Prometheus label intact.
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Unclear("holds bytes that are not UTF-8") from None
    return text


def _list_of(item: Callable[[str], Any]) -> Callable[[str | list[Any]], tuple[Any, ...]]:
    """A parser of comma-separated text or a YAML list whose items ``item`` parses (blanks dropped)."""

    def parse(raw: str | list[Any]) -> tuple[Any, ...]:
        items = raw if isinstance(raw, list) else raw.split(",")
        if not all(isinstance(i, str) for i in items):  # a null, list or mapping inside the list
            raise ValueError
        if isinstance(raw, list) and any("," in i for i in items):  # one YAML item holding several
            raise _Unclear("has an item with a comma; give each name as its own item")
        return tuple(item(i.strip()) for i in items if i.strip())

    return parse


_LISTS: dict[str, Callable[[str | list[Any]], tuple[Any, ...]]] = {
    "tuple[int, ...]": _list_of(_whole), "tuple[str, ...]": _list_of(_text),
}
_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": _whole, "float": _real, "str": _text, "mode": _mode, **_LISTS,
}
# What "no value" (an empty or null YAML value) means for each kind; the others need a value.
_EMPTY: dict[str, Any] = {"str": "", "tuple[int, ...]": (), "tuple[str, ...]": ()}


def _kind(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("kind", field.type))


def _parse(field: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    """Convert one raw value (text from any source; None, a list or a mapping from YAML) to the field's kind.

    Integers must be whole and fit in 64 bits, floats must be finite, and text must be UTF-8
    without NUL (no path, name or address can hold one): each daemon's range checks then see only
    ordinary values.
    """
    kind = _kind(field)
    try:
        if raw is None:
            if kind in _EMPTY:
                return _EMPTY[kind]
            raise _Unclear("has no value (an empty or null YAML value)")
        if isinstance(raw, list) and kind in _LISTS:
            return _LISTS[kind](raw)
        if not isinstance(raw, str):  # a YAML list or mapping where one value belongs
            raise ValueError
        return _PARSERS[kind](raw)
    except (TypeError, ValueError, OverflowError) as exc:
        why = str(exc) if isinstance(exc, _Unclear) else f"is not a valid {kind}"
        form = SECONDS if kind == "float" and field.name.endswith("_s") else FORMS[kind]
        raise ConfigError(f"{field.name}: {_shown.repr(raw)} (from {source}) {why}; use {form}") from None


@functools.cache
def _text_loader() -> type:
    """A YAML loader that keeps every scalar as the text written (see the module docstring)."""
    import yaml

    class TextLoader(yaml.BaseLoader):  # BaseLoader: no implicit types, no tags acted on
        # None stands for YAML's null, which the base class would give as the text "~" or "null".
        def construct_scalar(self, node: Any) -> str | None:  # type: ignore[override]
            value = super().construct_scalar(node)
            return None if node.style is None and value in _NULLS else value

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            mapping = super().construct_mapping(node, deep)
            if len(mapping) < len(node.value):  # yaml would keep the last of a repeated key, silently
                names = Counter(str(key.value) for key, _ in node.value)
                twice = sorted(name for name, count in names.items() if count > 1)
                raise _Repeated(", ".join(twice))
            return mapping

    return TextLoader


def _read_yaml(path: Path, known: Sequence[str]) -> dict[str, Any]:
    import yaml

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror}); check the --config path") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: is larger than {MAX_CONFIG_BYTES} bytes; is --config the settings "
                          "file (a YAML mapping of setting: value)?")
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_text_loader())  # acts on no tag: builds no object
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "save it as UTF-8 YAML") from None
    except _Repeated as exc:
        raise ConfigError(f"config file {path}: sets {exc} more than once; keep one line for each") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: is not valid YAML ({exc}); fix the syntax") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: is nested too deeply to be settings; it must be a flat mapping "
                          "of setting: value") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of setting: value, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(known))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; known settings are {', '.join(known)}"
        )
    return data


def job_label_field() -> Any:
    """The ``job_label`` setting both daemons share (``chopper.daemon.labels``)."""
    return dataclasses.field(default=JOB_LABEL, metadata={"help": (
        f"label that names the training job on /metrics: {JOB_LABEL} (never collides with Prometheus' scrape "
        f"label job), or {JOB_LABELS[1]} as in earlier releases (needs honor_labels: true; for one release)")})


def check_job_label(value: str) -> str | None:
    """Why ``value`` is not a ``job_label`` setting, or None when it is one."""
    return None if value in JOB_LABELS else f"is not a job label; use one of {', '.join(JOB_LABELS)}"
