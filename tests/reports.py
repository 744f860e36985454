"""Validators for dtrain's machine-readable outputs: --json against the shipped JSON Schema
(launcher/output/schemas/) and --junit against the Jenkins/Ant JUnit XSD (tests/data/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"


def validate_json(doc: dict[str, Any], command: str) -> None:
    """Raise jsonschema.ValidationError unless ``doc`` is a valid dtrain.<command>/1."""
    import jsonschema

    from launcher.output.report import schema_text

    schema = json.loads(schema_text(command))
    jsonschema.Draft202012Validator.check_schema(schema)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    # jsonschema checks "date-time" only where rfc3339-validator is installed, and passes
    # any string silently otherwise (it is in the test extras)
    assert "date-time" in checker.checkers, "pip install rfc3339-validator: date-time " \
        "formats would go unchecked"
    jsonschema.Draft202012Validator(schema, format_checker=checker).validate(doc)


def validate_junit(text: str) -> Any:
    """Parse and validate JUnit XML against tests/data/junit.xsd; the root element."""
    from lxml import etree

    schema = etree.XMLSchema(etree.parse(str(DATA / "junit.xsd")))
    root = etree.fromstring(text.encode())
    schema.assertValid(root)
    return root


def one_json_document(stdout: str) -> dict[str, Any]:
    """stdout must hold exactly one JSON document and nothing else."""
    doc = json.loads(stdout)
    assert isinstance(doc, dict)
    return doc


def _top_validator(ref: str | None = None) -> Any:
    import jsonschema

    from launcher.output.report import schema_text

    schema = json.loads(schema_text("top"))
    jsonschema.Draft202012Validator.check_schema(schema)
    if ref is not None:
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": ref}
    return jsonschema.Draft202012Validator(schema)


def validate_top(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless ``doc`` is a valid dtrain.top/1 document."""
    _top_validator().validate(doc)


def validate_sample_record(record: dict[str, Any]) -> None:
    """... unless ``record`` is a valid samples.jsonl line (top.schema.json#/$defs/record)."""
    _top_validator("#/$defs/record").validate(record)
