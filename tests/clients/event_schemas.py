"""openapi.yaml's event schemas against the server's own list of events.

Reads `EventKind` in src/model/event.rs (each variant's wire `type` and fields) and checks that
openapi.yaml has exactly one `Event` variant per type, whose `data` has exactly those fields,
with the fields that are always sent required, the `Option`s nullable (or optional when they
are skipped when absent), and each field's JSON type matching its Rust type.

    python tests/clients/event_schemas.py   # run by scripts/generated-clients.sh
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]

# Rust type -> what its JSON schema says: ("type", JSON type), ("ref", schema name), or
# ("any", None) for a JSON value (`serde_json::Value`: the schema may leave it open or narrow it).
RUST_TYPES = {
    "Uuid": ("type", "string"),
    "String": ("type", "string"),
    "bool": ("type", "boolean"),
    "u32": ("type", "integer"),
    "u64": ("type", "integer"),
    "i64": ("type", "integer"),
    "f64": ("type", "number"),
    "FinishReason": ("type", "string"),
    "Message": ("ref", "Message"),
    "ArtifactRecord": ("ref", "Artifact"),
    "ToolCall": ("ref", "ToolCall"),
    "Usage": ("ref", "Usage"),
    "SessionState": ("ref", "SessionState"),
    "RunKind": ("ref", "RunKind"),
    "CharsBeforeAfter": ("ref", "CharsBeforeAfter"),
    "DateTime<Utc>": ("type", "string"),
    "Value": ("any", None),
    "Decision": ("ref", "Decision"),
    "ResolvedBy": ("ref", "ResolvedBy"),
    "RunStatus": ("ref", "RunStatus"),
    "Rule": ("ref", "Rule"),
    "AgentTag": ("ref", "AgentTag"),
}


# One field of a variant: its attributes, its name and its type (`Option<T>` included, with
# one level of generics inside: `Option<DateTime<Utc>>`).
FIELD = re.compile(
    r"(?P<attrs>(?:#\[[^\]]*\]\s*)*)(?P<name>\w+)\s*:\s*"
    r"(?P<type>[\w:]+(?:<(?:[^<>]|<[^<>]*>)+>)?)"
)
# Comments (doc comments included), left out before fields are read: their text may hold
# `word: word`.
COMMENT = re.compile(r"//[^\n]*")


def rust_events() -> dict[str, dict[str, tuple[str, bool, bool]]]:
    """wire type -> field -> (Rust type, is Option, skipped when None)."""
    source = COMMENT.sub("", (ROOT / "src/model/event.rs").read_text())
    body = re.search(r"pub enum EventKind \{(.*?)\n\}", source, re.DOTALL)
    if body is None:
        raise SystemExit("event_schemas: no `pub enum EventKind` in src/model/event.rs")
    events: dict[str, dict[str, tuple[str, bool, bool]]] = {}
    variant = re.compile(r'#\[serde\(rename = "([^"]+)"\)\]\s*(\w+)\s*(\{(.*?)\})?\s*,', re.DOTALL)
    for match in variant.finditer(body.group(1)):
        wire, fields_text = match.group(1), match.group(4) or ""
        fields: dict[str, tuple[str, bool, bool]] = {}
        for field in FIELD.finditer(fields_text):
            rust = field.group("type")
            option = re.fullmatch(r"Option<(.+)>", rust)
            skipped = "skip_serializing_if" in field.group("attrs")
            fields[field.group("name")] = (
                option.group(1) if option else rust,
                bool(option),
                skipped,
            )
        events[wire] = fields
    return events


def resolve(doc: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref:
        return doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


def main() -> int:
    doc = YAML(typ="safe").load((ROOT / "openapi.yaml").read_text())
    schemas = doc["components"]["schemas"]
    rust = rust_events()
    problems: list[str] = []

    mapping = schemas["Event"]["discriminator"]["mapping"]
    one_of = [s["$ref"] for s in schemas["Event"]["oneOf"]]
    if set(mapping) != set(rust):
        problems.append(f"Event mapping {sorted(set(mapping) ^ set(rust))} differs from EventKind")
    if sorted(mapping.values()) != sorted(one_of):
        problems.append("Event oneOf and its discriminator mapping name different schemas")
    if set(schemas["EventType"]["enum"]) != set(rust):
        problems.append("EventType does not list exactly the EventKind types")

    for wire, fields in rust.items():
        ref = mapping.get(wire)
        if ref is None:
            continue
        variant = schemas[ref.rsplit("/", 1)[1]]
        own = variant["allOf"][1]
        if own["properties"]["type"].get("const") != wire:
            problems.append(f"{wire}: its schema's `type` const is not {wire!r}")
        data = resolve(doc, own["properties"]["data"])
        props = data.get("properties", {})
        required = set(data.get("required", []))
        if set(props) != set(fields):
            problems.append(f"{wire}: data fields {sorted(props)} != EventKind {sorted(fields)}")
        for name, (rust_type, option, skipped) in fields.items():
            prop = props.get(name)
            if prop is None:
                continue
            want_required = not skipped
            if (name in required) != want_required:
                problems.append(f"{wire}.{name}: required should be {want_required}")
            types = prop.get("type")
            types = set(types) if isinstance(types, list) else {types} if types else set()
            nullable = "null" in types
            if nullable != (option and not skipped):
                problems.append(f"{wire}.{name}: nullable should be {option and not skipped}")
            # A type named by its path (`super::AgentTag`) is looked up by its last segment.
            how, what = RUST_TYPES.get(rust_type.rsplit("::", 1)[-1], ("?", rust_type))
            if how == "type" and what not in types:
                problems.append(f"{wire}.{name}: JSON type {sorted(types)} for Rust {rust_type}")
            if how == "ref" and not prop.get("$ref", "").endswith(f"/{what}"):
                problems.append(f"{wire}.{name}: should be a $ref to {what}")
            if how == "?":
                problems.append(f"{wire}.{name}: no JSON type known for Rust {rust_type}")
            if rust_type.startswith("DateTime") and prop.get("format") != "date-time":
                problems.append(f"{wire}.{name}: a timestamp needs format: date-time")
            if rust_type.startswith("u") and how == "type" and prop.get("minimum") != 0:
                problems.append(f"{wire}.{name}: an unsigned field needs minimum: 0")

    for problem in problems:
        print(f"event_schemas: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"event_schemas: {len(rust)} event types, schemas match src/model/event.rs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
