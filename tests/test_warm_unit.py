"""The warm start's pure parts (launcher/nodeside/warm.py, docs/warm-start.md): the rank's
request to the warm process, the safe-to-fork check, a rank's end as the shim reports it,
the environment area /proc/PID/environ shows, and --preload's value check."""

from __future__ import annotations

import os
import signal
import struct

import pytest

from launcher.decide.copies.filters import preload_modules
from launcher.errors import UsageError
from launcher.nodeside import warm


def test_a_request_comes_back_as_it_was_sent() -> None:
    env = {"RANK": "3", "CUDA_VISIBLE_DEVICES": "3", "ODD": "é\udcff"}  # a byte not UTF-8 too
    data = warm.encode_request(["-m", "pkg.train", "--lr", "1"], env, "/work/a b")
    assert warm.request_size(data) == len(data)
    assert warm.decode_request(data) == (["-m", "pkg.train", "--lr", "1"], env, "/work/a b",
                                         "rank")
    agent = warm.encode_request(["-c", "pass"], env, "/", warm.ROLE_AGENT)
    assert warm.decode_request(agent)[3] == "agent"


@pytest.mark.parametrize("body", [
    {"v": 2, "argv": ["t.py"], "env": {}, "cwd": "/"},  # another version
    {"v": 1, "argv": [], "env": {}, "cwd": "/"},  # no script
    {"v": 1, "argv": ["t.py", 3], "env": {}, "cwd": "/"},
    {"v": 1, "argv": ["t.py"], "env": {"A=B": "c"}, "cwd": "/"},  # not a variable name
    {"v": 1, "argv": ["t.py"], "env": {"A": "a\0b"}, "cwd": "/"},
    {"v": 1, "argv": ["t.py"], "env": {"A": 1}, "cwd": "/"},
    {"v": 1, "argv": ["t.py"], "env": {}, "cwd": ""},
    {"v": 1, "argv": ["t.py"], "env": []},
    {"v": 1, "argv": ["t.py"], "env": {}, "cwd": "/", "role": "root"},  # no such role
], ids=range(9))
def test_a_request_that_is_not_one_is_refused(body: dict) -> None:
    import json

    raw = json.dumps(body).encode()
    with pytest.raises(ValueError):
        warm.decode_request(struct.pack("!I", len(raw)) + raw)


def test_a_request_is_read_whole_or_not_at_all() -> None:
    data = warm.encode_request(["t.py"], {}, "/")
    assert warm.request_size(data[:3]) is None  # its length not here yet
    with pytest.raises(ValueError):
        warm.decode_request(data[:-1])
    with pytest.raises(ValueError):  # a length past the bound: no buffer grows to it
        warm.request_size(struct.pack("!I", warm.MAX_REQUEST + 1))


def test_fork_is_safe_with_one_thread_and_no_cuda() -> None:
    assert warm.fork_safety(1, False) is None
    assert warm.fork_safety(3, False) == "3 threads running before fork"
    assert warm.fork_safety(1, True) == "CUDA initialised before fork"


def test_a_rank_end_reads_as_subprocess_returncode() -> None:
    assert warm.exit_of(os.CLD_EXITED, 0) == 0
    assert warm.exit_of(os.CLD_EXITED, 3) == 3
    assert warm.exit_of(os.CLD_KILLED, signal.SIGKILL) == -signal.SIGKILL
    assert warm.exit_of(os.CLD_DUMPED, signal.SIGSEGV) == -signal.SIGSEGV


def _parse(block: bytes) -> dict[str, str]:
    out = {}
    for item in block.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode()] = v.decode("utf-8", "surrogateescape")
    return out


def test_the_environment_area_holds_the_rank_own_first() -> None:
    env = {"A": "1", "RANK": "5", "DTRAIN_RUN_ID": "r1", "BIG": "x" * 100, "LOCAL_RANK": "1"}
    block = warm.environ_block(env, 4096)
    assert len(block) == 4096 and block.endswith(b"\0")
    assert _parse(block) == env
    assert block.startswith(b"DTRAIN_RUN_ID=r1\0RANK=5\0LOCAL_RANK=1\0")
    small = warm.environ_block(env, 60)  # what does not fit is left out, not cut
    assert len(small) == 60
    assert _parse(small) == {"DTRAIN_RUN_ID": "r1", "RANK": "5", "LOCAL_RANK": "1", "A": "1"}


def test_preload_options() -> None:
    assert preload_modules(None, False, True) == ()
    assert preload_modules(None, False, False) is None
    assert preload_modules("transformers, numpy,", False, False) == ("transformers", "numpy")
    assert preload_modules("transformers", True, True) is None  # --no-preload wins
    for bad in ("a-b", "x;import os", ".rel", "a..b"):
        with pytest.raises(UsageError) as err:
            preload_modules(bad, False, True)
        assert "--preload" in err.value.message
