"""ProxyJump hops as OpenSSH writes them (the chain itself runs on the cluster:
tests/test_trust_cluster.py)."""

from __future__ import annotations

import pytest

from launcher.errors import ConnectError
from launcher.models import Host
from launcher.transports.ssh import parse_proxy_jump


@pytest.mark.parametrize(("spec", "hops"), [
    ("jump", [Host("jump")]),
    ("a@b:2222, c", [Host("b", user="a", port=2222), Host("c")]),
    ("ssh://u@[fd00::1]:2222", [Host("fd00::1", user="u", port=2222)]),
    ("ssh://h:2200/", [Host("h", port=2200)]),
    ("[fd00::1]", [Host("fd00::1")]),
    ("fd00::1", [Host("fd00::1")]),
    ("u@x@h", [Host("h", user="u@x")]),
])
def test_hops(spec: str, hops: list[Host]) -> None:
    assert parse_proxy_jump(spec, "t") == hops


@pytest.mark.parametrize("spec", ["u@h:0", "h:x", "h:70000", "@h", "a,,b", "[::1", "[::1]x",
                                  "", "ssh://"])
def test_bad_hops_are_a_clear_error(spec: str) -> None:
    with pytest.raises(ConnectError, match="cannot read ProxyJump hop") as info:
        parse_proxy_jump(spec, "target")
    assert info.value.host == "target" and "host[:port]" in (info.value.hint or "")
