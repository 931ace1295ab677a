"""Validated broker settings as plain values: what the serving process holds, without pydantic.

``stonemq serve`` validates its settings with pydantic-settings (:mod:`stonemq.config`: flag >
env > file > default, every constraint), then hands the validated values over to the process
that serves (:mod:`stonemq.server.run`, ``os.execv`` on the same pid) as one JSON document: each
setting's value, which ones were given explicitly, and each field's type and bounds
(:class:`FieldSpec`, for the broker configs AlterConfigs may change later). The serving process
never imports pydantic: pydantic, pydantic-settings and the built ``Settings`` model are about
9 MiB of anonymous memory plus pydantic-core's 3.8 MiB shared object, a third of the seed's
44 MB (docs/benchmarks/analysis.md, "Process size").

:class:`SettingsViews` holds what both kinds of settings object derive from their values (the
journal path, the listeners); :class:`SettingsValues` is the serving process's kind, with the same
attributes as :class:`stonemq.config.Settings` (type hints name ``Settings``)."""

from __future__ import annotations

import functools
import json
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

ALIAS_SETTINGS = frozenset({"listen", "advertise"})
"""Settings that are other spellings of Kafka's (listeners, advertised.listeners): they are
read from flags, env and file, never kept, and not broker configs of their own."""
SERVED_PROTOCOLS = frozenset({"PLAINTEXT"})

FieldKind = Literal["bool", "int", "float", "str", "path", "choice"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One setting's type and bounds, as the pydantic model declares them."""

    name: str
    kind: FieldKind
    nullable: bool = False
    choices: tuple[str, ...] = ()
    gt: int | None = None
    ge: int | None = None
    lt: int | None = None
    le: int | None = None
    default: Any = None  # JSON-able: a Path default is its string
    description: str | None = None


def check_value(spec: FieldSpec, value: Any) -> Any:
    """``value`` checked against ``spec`` (a dynamic broker config's parsed value): returned as
    the setting holds it, or ValueError saying what is wrong."""
    if value is None:
        if spec.nullable:
            return None
        raise ValueError("Input should not be null")
    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError("Input should be a valid boolean")
        return value
    if kind == "choice":
        if value not in spec.choices:
            raise ValueError("Input should be " + " or ".join(repr(c) for c in spec.choices))
        return value
    if kind in ("str", "path"):
        if not isinstance(value, str | Path):
            raise ValueError("Input should be a valid string")
        return Path(value) if kind == "path" else value
    number_type = int if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_type):
        raise ValueError(f"Input should be a valid {'integer' if kind == 'int' else 'number'}")
    for bound, holds, words in (
        (spec.gt, lambda b: value > b, "greater than"),
        (spec.ge, lambda b: value >= b, "greater than or equal to"),
        (spec.lt, lambda b: value < b, "less than"),
        (spec.le, lambda b: value <= b, "less than or equal to"),
    ):
        if bound is not None and not holds(bound):
            raise ValueError(f"Input should be {words} {bound}")
    return value


_FIELDS: dict[str, FieldSpec] | None = None


def fields() -> dict[str, FieldSpec]:
    """Every setting's :class:`FieldSpec` by attribute, in declaration order: the ones handed
    over to the serving process, else read off the pydantic model (tools, tests, a broker run
    in-process)."""
    global _FIELDS
    if _FIELDS is None:
        from stonemq.config import field_specs

        _FIELDS = {spec.name: spec for spec in field_specs()}
    return _FIELDS


TOOL_VARIABLES = (
    "STONEMQ_BENCH_",
    "STONEMQ_CLUSTER_FAULT",
    "STONEMQ_CRASH_",
    "STONEMQ_FAULT_",
    "STONEMQ_FUZZ_",
)
"""Prefixes of the environment variables the bench and test suites read (not settings)."""


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """The ``STONEMQ_*`` environment variables that name no setting (a misspelt one is
    otherwise ignored without a word, where the same name in the settings file is refused):
    the serving process logs each, as Kafka logs a supplied config it does not know."""
    known = fields()
    return sorted(
        name
        for name in environ
        if name.upper().startswith("STONEMQ_")
        and not name.upper().startswith(TOOL_VARIABLES)
        and name[len("STONEMQ_") :].lower() not in known
    )


def install_fields(specs: Iterable[FieldSpec]) -> None:
    """Use ``specs`` as :func:`fields` (the serving process, before it imports the broker)."""
    global _FIELDS
    _FIELDS = {spec.name: spec for spec in specs}


class SettingsViews:
    """What a settings object derives from its values (shared by the pydantic model and
    :class:`SettingsValues`). Attribute reads only: the fields are the subclass's."""

    if TYPE_CHECKING:  # the subclass's fields (declared here for pydantic would add them)
        data_dir: Path
        journal_dir: Path | None
        queue_dir: Path | None
        listeners: str
        advertised_listeners: str | None
        listener_security_protocol_map: str

    @property
    def journal_path(self) -> Path:
        return self.journal_dir or self.data_dir / "journal"

    @property
    def queue_path(self) -> Path:
        return self.queue_dir or self.data_dir / "queues"

    def listener_endpoints(self) -> tuple[Endpoint, ...]:
        """The listeners to bind, each checked against the security protocol map."""
        endpoints = parse_listeners(self.listeners, "listeners")
        protocols = parse_protocol_map(self.listener_security_protocol_map)
        for endpoint in endpoints:
            protocol = protocols.get(endpoint.name)
            if protocol is None:
                raise ValueError(
                    f"No security protocol defined for listener {endpoint.name} "
                    "(listener.security.protocol.map)"
                )
            if protocol not in SERVED_PROTOCOLS:
                raise ValueError(
                    f"listener {endpoint.name} uses {protocol}: StoneMQ serves PLAINTEXT "
                    "listeners only"
                )
        return endpoints

    def advertised_endpoints(self) -> dict[str, tuple[str, int]]:
        """The address given to clients per listener name: its advertised.listeners entry,
        else the listener's own address; an empty or 0.0.0.0 host there is this machine's
        host name (Kafka's canonical host name for an empty host)."""
        return dict(_advertised(self.listeners, self.advertised_listeners))

    def advertised_for(self, listener: str) -> tuple[str, int]:
        """The advertised address of ``listener`` (the first listener's when unknown)."""
        endpoints = self.advertised_endpoints()
        return endpoints.get(listener) or next(iter(endpoints.values()))

    @property
    def listen_address(self) -> tuple[str, int]:
        """The first listener's address (log lines; the broker binds every listener)."""
        first = self.listener_endpoints()[0]
        return first.host, first.port

    @property
    def advertised_address(self) -> tuple[str, int]:
        """The first listener's advertised address (what the broker registers)."""
        return next(iter(self.advertised_endpoints().values()))


class SettingsValues(SettingsViews):
    """Validated settings as plain attributes (frozen), with the model's names: what
    ``stonemq serve`` hands to the serving process (:func:`decode_handover`)."""

    model_fields_set: frozenset[str]
    """The settings given explicitly (flag, env or file), as pydantic names that set."""

    def __init__(self, values: Mapping[str, Any], fields_set: Iterable[str]) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "model_fields_set", frozenset(fields_set))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are frozen: cannot set {name}")

    def __repr__(self) -> str:
        return f"SettingsValues({len(vars(self)) - 1} settings)"


def encode_handover(
    specs: Iterable[FieldSpec], values: Mapping[str, Any], fields_set: Iterable[str]
) -> bytes:
    """The handover document: the fields' specs, the validated values (paths as strings) and
    the names given explicitly."""
    doc = {
        "fields": [asdict(spec) for spec in specs],
        "values": {k: str(v) if isinstance(v, Path) else v for k, v in values.items()},
        "set": sorted(fields_set),
    }
    return json.dumps(doc).encode()


def decode_handover(data: bytes) -> SettingsValues:
    """The settings of a handover document; installs its field specs as :func:`fields`. The
    document comes from ``stonemq serve`` after validation; a value that does not match its
    spec (a different StoneMQ wrote it) is a ValueError, not a broker with a wrong type."""
    doc = json.loads(data)
    specs = [
        FieldSpec(**{**raw, "choices": tuple(raw.get("choices", ()))}) for raw in doc["fields"]
    ]
    by_name = {spec.name: spec for spec in specs}
    values = doc["values"]
    if set(values) != set(by_name):
        raise ValueError("settings handover: values do not match the fields")
    held = {name: check_value(by_name[name], value) for name, value in values.items()}
    install_fields(specs)
    return SettingsValues(held, doc["set"])


def kafka_name(attribute: str) -> str:
    """The Kafka-style dotted name of a settings attribute."""
    return attribute.replace("_", ".")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener: its name (upper case, as Kafka normalises it), host and port."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


_ENDPOINT = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


def parse_listeners(value: str, what: str = "listeners") -> tuple[Endpoint, ...]:
    """Kafka's listener list: ``NAME://HOST:PORT`` entries, comma-separated (an IPv6 host in
    brackets, an empty host for every interface); names and ports unique."""
    endpoints = []
    for raw in value.split(","):
        raw = raw.strip()
        if not raw:
            continue
        match = _ENDPOINT.match(raw)
        if match is None:
            raise ValueError(f"Unable to parse {raw} to a broker endpoint ({what})")
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if not name or not 0 <= port <= 65535:
            raise ValueError(f"Unable to parse {raw} to a broker endpoint ({what})")
        endpoints.append(Endpoint(name, host, port))
    if not endpoints:
        raise ValueError(f"{what} names no listener")
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"Each listener must have a different name, {what}: {value}")
    ports = [e.port for e in endpoints if e.port != 0]
    if what == "listeners" and len(set(ports)) != len(ports):
        raise ValueError(f"Each listener must have a different port, listeners: {value}")
    return tuple(endpoints)


def parse_protocol_map(value: str) -> dict[str, str]:
    """Kafka's ``listener.security.protocol.map``: ``NAME:PROTOCOL`` pairs, comma-separated."""
    out: dict[str, str] = {}
    for raw in value.split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, sep, protocol = raw.partition(":")
        if not sep or not name or not protocol:
            raise ValueError(f"Invalid listener.security.protocol.map entry {raw!r}")
        out[name.strip().upper()] = protocol.strip().upper()
    return out


@functools.cache
def _advertised(
    listeners_value: str, advertised_value: str | None
) -> tuple[tuple[str, tuple[str, int]], ...]:
    """``advertised_endpoints`` (cached: handlers ask on every Metadata request)."""
    listeners = {e.name: e for e in parse_listeners(listeners_value, "listeners")}
    advertised: dict[str, Endpoint] = {}
    if advertised_value is not None:
        for endpoint in parse_listeners(advertised_value, "advertised.listeners"):
            if endpoint.name not in listeners:
                raise ValueError(
                    "advertised.listeners listener names must be equal to or a subset of "
                    f"the ones defined in listeners: {endpoint.name} is not"
                )
            if endpoint.host == "0.0.0.0":
                raise ValueError(
                    "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. "
                    "Use a routable IP address."
                )
            advertised[endpoint.name] = endpoint
    out = []
    for name, listener in listeners.items():
        endpoint = advertised.get(name, listener)
        host = endpoint.host
        if host in ("", "0.0.0.0", "::"):
            host = socket.getfqdn()
        out.append((name, (host, endpoint.port)))
    return tuple(out)


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)
