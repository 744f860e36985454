"""nodeside/nodecommon.py's ``from_json``: what issue 51's mutation round (docs/testing.md,
"Mutation score") found no test for: a lone surrogate in UTF-8 bytes (json.loads decodes
them with "surrogatepass", and so must from_json), and the words for a text nested too
deeply."""

from __future__ import annotations

import json

import pytest

from launcher.nodeside import nodecommon


def test_a_lone_surrogate_reads_as_json_reads_it() -> None:
    data = b'{"a": "\xed\xa0\x80"}'
    assert nodecommon.from_json(data) == json.loads(data) == {"a": "\ud800"}


def test_a_text_nested_too_deeply_is_a_value_error_that_says_so() -> None:
    with pytest.raises(ValueError) as err:
        nodecommon.from_json("[" * 100_000 + "]" * 100_000)
    assert str(err.value) == "JSON nested too deeply"
