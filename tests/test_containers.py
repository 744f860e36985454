"""--image (docs/containers.md): the runtime's command line per runtime, decided purely from a
node's facts (decide/runplan/container.py); the preflight that names a node without the image or
with
another digest; the hostfile's image:; and the supervisor running a job through a stand-in
docker, enroot and apptainer (tests/standin_runtime.py) on localhost: the environment
arrives by name or in a private file, never as values in argv, and the container is removed
by name at the end."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.decide.runplan.container import (
    ContainerFacts,
    ContainerRequest,
    NodeContainerFacts,
    command_for,
    container_name,
    for_host,
    image_problems,
    parse_mount,
    share_groups,
    share_marker,
)
from launcher.decide.runplan.plan import RunRequest, build_plan, plan_json
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import PreflightFailed, UsageError
from launcher.hosts.hostfile import parse_hostfile_yaml
from launcher.models import Host
from launcher.nodeside.wire import DIR_PLACEHOLDER
from tests.test_netenv import MASTER_IP
from tests.test_plan import N0, N1
from tests.util import REPO, dtrain

IMG = "nvcr.io/nvidia/pytorch:24.05-py3"
ID_A, ID_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
CPU = NodeContainerFacts(gpus=0, rdma=False, shm_bytes=1 << 30)
GPU_HCA = NodeContainerFacts(gpus=8, rdma=True, shm_bytes=None)
LABELS = ["--label", "dtrain.run=r1", "--label", "dtrain.node=n1", "--label",
          "dtrain.attempt=2"]


def cmd(runtime: str, node: NodeContainerFacts = CPU, **kw: object):  # type: ignore[no-untyped-def]
    req = ContainerRequest(IMG, mounts=(parse_mount("/data:/data:ro"),),
                           args=("--security-opt", "seccomp=unconfined"))
    return command_for(req, runtime, node, run_id="r1", host="n1", attempt=2,
                       workdir="/home/u/proj", grace=10.0, **kw)  # type: ignore[arg-type]


def test_podman_on_a_cpu_node_host_network_shm_mounts_labels() -> None:
    c = cmd("podman")
    assert c.name == "dtrain-r1-n1-a2"
    assert c.head == (
        "podman", "run", "--rm", "--init", "--sig-proxy=false", "--name", "dtrain-r1-n1-a2",
        *LABELS,
        "--network", "host", "--shm-size", str(1 << 30),
        "-v", f"{DIR_PLACEHOLDER}:{DIR_PLACEHOLDER}", "-v", "/home/u/proj:/home/u/proj",
        "-v", "/data:/data:ro", "-w", "/home/u/proj", "--security-opt", "seccomp=unconfined")
    assert c.image == (IMG,)
    assert (c.env_flag, c.env_file_flag) == ("-e", None)
    assert c.stop == ()  # podman's container is in the supervisor's tree: signals reach it
    assert cmd("docker").stop == (("docker", "stop", "-t", "10", "dtrain-r1-n1-a2"),)
    assert c.remove == (("podman", "rm", "-f", "dtrain-r1-n1-a2"),)
    assert c.leftovers == ("podman", "ps", "-a", "--filter", "label=dtrain.run=r1",
                           "--format", "{{.Names}}")
    assert c.prefix == "dtrain-r1-"
    assert c.shown(["A", "B"])[-5:] == ("-e", "A", "-e", "B", IMG)


def test_gpus_and_hcas_per_runtime() -> None:
    podman, docker = cmd("podman", GPU_HCA).head, cmd("docker", GPU_HCA).head
    rdma = ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
    for head, gpus in ((podman, ["--device", "nvidia.com/gpu=all"]), (docker, ["--gpus", "all"])):
        words = list(head)
        i = words.index("--network")
        # no shm size known: the host's IPC namespace
        assert words[i:i + 4 + len(gpus) + len(rdma)] == [
            "--network", "host", "--ipc", "host", *gpus, *rdma]
    for runtime in ("podman", "docker"):  # a CPU node: neither GPUs nor RDMA devices
        head = cmd(runtime).head
        assert not {"--gpus", "--cap-add", "--ulimit", "/dev/infiniband"} & set(head)
        assert "nvidia.com/gpu=all" not in head
    enroot = cmd("enroot", GPU_HCA)
    assert enroot.head == (
        "enroot", "start", "--env", "NVIDIA_VISIBLE_DEVICES=all",
        "--env", "MELLANOX_VISIBLE_DEVICES=all",
        "--mount", f"{DIR_PLACEHOLDER}:{DIR_PLACEHOLDER}", "--mount", "/home/u/proj:/home/u/proj",
        "--mount", "/data:/data:ro", "--security-opt", "seccomp=unconfined")
    assert enroot.image == ("dtrain-r1-n1-a2", "/bin/sh", "-c", 'cd "$0" && exec "$@"',
                            "/home/u/proj")
    assert enroot.prepare == (("enroot", "create", "--force", "--name", "dtrain-r1-n1-a2", IMG),)
    assert enroot.remove == (("enroot", "remove", "--force", "dtrain-r1-n1-a2"),)
    assert "NVIDIA_VISIBLE_DEVICES=all" not in cmd("enroot").head
    app = cmd("apptainer", GPU_HCA)
    assert app.head == (
        "apptainer", "exec", "--cleanenv", "--nv", "--bind", "/dev/infiniband",
        "--bind", f"{DIR_PLACEHOLDER}:{DIR_PLACEHOLDER}", "--bind", "/home/u/proj:/home/u/proj",
        "--bind", "/data:/data:ro", "--pwd", "/home/u/proj",
        "--security-opt", "seccomp=unconfined")
    assert (app.env_flag, app.env_file_flag) == (None, "--env-file")
    assert "--nv" not in cmd("apptainer").head


def test_names_requests_and_mounts() -> None:
    assert container_name("20260101-a/b", "gpu 1", 3) == "dtrain-20260101-a_b-gpu_1-a3"
    assert parse_mount("/a:/b") == parse_mount("/a:/b:rw")
    assert parse_mount("/a:/b:ro").text == "/a:/b:ro"
    for bad in ("a:/b", "/a", "/a:/b:rx", "/a:/b:ro:x", "/a,b:/c"):
        with pytest.raises(UsageError):
            parse_mount(bad)
    for image in ("", "-it", "a b"):
        with pytest.raises(UsageError):
            ContainerRequest(image)
    with pytest.raises(UsageError):
        ContainerRequest(IMG, runtime="lxc")
    base = ContainerRequest(IMG, runtime="podman")
    assert for_host(None, None) is None
    assert for_host(base, None) is base
    assert for_host(base, "other:1") == replace(base, image="other:1")
    assert for_host(None, "other:1") == ContainerRequest("other:1")


def test_preflight_names_nodes_without_the_image_or_with_another_digest() -> None:
    req = ContainerRequest(IMG)
    ok = ContainerFacts("podman", "/usr/bin/podman", "4.3.1", True, ID_A)
    facts = {"n1": ok, "n2": ok, "n3": replace(ok, image_id=ID_B),
             "n4": replace(ok, image_present=False, image_id=None),
             "n5": ContainerFacts(error="no container runtime (podman) on PATH"), "n6": None}
    problems = image_problems(dict.fromkeys(facts, req), facts)
    assert problems == [
        "n4: image nvcr.io/nvidia/pytorch:24.05-py3 is not there (podman); copy it with: "
        "dtrain image push nvcr.io/nvidia/pytorch:24.05-py3",
        "n5: no container runtime (podman) on PATH",
        "n6: no container runtime (podman, docker, enroot, apptainer) found",
        "n3: image nvcr.io/nvidia/pytorch:24.05-py3 has digest bbbbbbbbbbbb, the other "
        "nodes aaaaaaaaaaaa; copy it with: dtrain image push nvcr.io/nvidia/pytorch:24.05-py3"]
    # a node with another image (its hostfile image:) is compared with nodes of that image
    other = ContainerRequest("other:1")
    assert image_problems({"n1": req, "n3": other}, {"n1": ok, "n3": replace(ok, image_id=ID_B)}
                          ) == []


def _plan(facts1: ContainerFacts | None, hosts: list[Host] | None = None):  # type: ignore[no-untyped-def]
    hosts = hosts or [Host("node0", slots=2), Host("node1", port=2222, slots=1)]
    ok = ContainerFacts("docker", "/usr/bin/docker", "20.10", True, ID_A)
    req = RunRequest(script="train.py", run_id="r1", workdir="/w",
                     container=ContainerRequest(IMG))
    return build_plan(req, RunOptions(), hosts,
                      {"node0": replace(N0, container=ok), "node1:2222": replace(
                          N1, container=facts1)},
                      master_addr=MASTER_IP, master_port=29400, master_reason="r")


def test_the_plan_carries_each_nodes_runtime_command_and_the_dry_run_shows_it() -> None:
    plan = _plan(ContainerFacts("podman", "/usr/bin/podman", "4.3", True, ID_A))
    n0, n1 = plan.nodes
    assert n0.container is not None and n1.container is not None
    assert (n0.container.runtime, n1.container.runtime) == ("docker", "podman")
    assert n0.container.head[:7] == ("docker", "run", "--rm", "--init", "--sig-proxy=false",
                                     "--name", "dtrain-r1-node0-a1")
    assert "--gpus" in n0.container.head  # N0 has 4 GPUs
    assert n1.container.name == "dtrain-r1-node1-a1"
    shown = plan_json(plan)["nodes"][0]["container"]  # type: ignore[index]
    assert shown[-1] == IMG and "-w" in shown
    names = [shown[i + 1] for i, w in enumerate(shown) if w == "-e"]
    assert "DTRAIN_RUN_ID" in names and "GLOO_SOCKET_IFNAME" in names
    assert not any("=" in n for n in names)  # names only: values never in argv


def test_the_plan_refuses_a_node_without_the_image_naming_it() -> None:
    with pytest.raises(PreflightFailed) as err:
        _plan(ContainerFacts("podman", "/usr/bin/podman", "4.3", False, None))
    assert err.value.message.startswith("node1:2222: image nvcr.io/nvidia/pytorch:24.05-py3 "
                                        "is not there (podman)")


def test_yaml_hostfile_image_per_host_and_default() -> None:
    hosts = parse_hostfile_yaml("defaults: {image: 'base:1'}\nhosts:\n  - node1\n"
                                "  - {host: node2, image: 'special:2'}\n", "h.yaml")
    assert [(h.name, h.image) for h in hosts] == [("node1", "base:1"), ("node2", "special:2")]
    from launcher.errors import HostfileError

    with pytest.raises(HostfileError) as err:
        parse_hostfile_yaml("hosts:\n  - {host: node2, image: 'a b'}\n", "h.yaml")
    assert "h.yaml:2" in str(err.value) or "h.yaml:2" in err.value.message


# ------------------------------------------------------------------ stand-in runtimes

@pytest.fixture
def standin(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "enroot", "apptainer"):
        shutil.copy(REPO / "tests" / "standin_runtime.py", bin_dir / name)
        (bin_dir / name).write_text(f"#!{sys.executable}\n" + (bin_dir / name).read_text())
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "argv.jsonl"
    image = str(tmp_path / "image.sqsh")
    Path(image).write_text("not really squashfs")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_RT_LOG": str(log),
           "FAKE_IMAGE": image, "SECRET_TOKEN": "s3cr3t-value"}
    return log, env


@pytest.mark.parametrize("runtime", ["docker", "enroot", "apptainer"])
def test_exec_through_a_standin_runtime(runtime: str, standin: tuple[Path, dict[str, str]]
                                        ) -> None:
    log, env = standin
    image = env["FAKE_IMAGE"]
    res = dtrain(["exec", "-H", "localhost", "--image", image, "--container-runtime", runtime,
                  "--mount", "/data:/data:ro", "--",
                  "sh", "-c", 'echo "token=${SECRET_TOKEN:-unset} pwd=$PWD"'], env=env)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert res.returncode == 0, res.stdout + res.stderr + str(calls)
    # the login environment does not leak into the container; the working dir is the home
    assert f"localhost: token=unset pwd={os.path.expanduser('~')}" in res.stdout
    verbs = [c[1] for c in calls]
    job = next(c for c in calls if c[1] in ("run", "start", "exec"))
    if runtime == "docker":
        assert verbs[:2] == ["--version", "image"] and "rm" in verbs  # removed by name
        name = job[job.index("--name") + 1]
        assert name.startswith("dtrain-exec-") and name.endswith("-localhost-a1")
        assert ["docker", "rm", "-f", name] in calls
        assert ["--network", "host"] == job[job.index("--network"):job.index("--network") + 2]
        assert "/data:/data:ro" in job and job[-4:-3] == [image]
    elif runtime == "enroot":
        assert verbs[0] == "version" and "create" in verbs and "remove" in verbs
        assert job[:2] == ["enroot", "start"]
    else:
        assert verbs[0] == "--version"
        assert job[:3] == ["apptainer", "exec", "--cleanenv"]
        env_file = job[job.index("--env-file") + 1]
        assert not Path(env_file).exists()  # the private file went with the node's dir


def test_the_supervisor_passes_env_by_name_or_in_a_private_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    from launcher.nodeside.nodecontainer import Container

    monkeypatch.setenv("HOST_ONLY", "x")
    env = {**os.environ, "TOKEN": "it's s3cr3t", "HOST_ONLY": "x"}
    docker = cmd("docker")
    argv = Container(docker.wire(), str(tmp_path), 5.0).argv(env, ["python3", "t.py"])
    assert argv[-3:] == [IMG, "python3", "t.py"]
    assert argv[-5:-3] == ["-e", "TOKEN"] and "HOST_ONLY" not in argv  # only what dtrain set
    assert f"{tmp_path}:{tmp_path}" in argv and "it's s3cr3t" not in " ".join(argv)
    app = cmd("apptainer")
    argv = Container(app.wire(), str(tmp_path), 5.0).argv(env, ["python3", "t.py"])
    path = argv[argv.index("--env-file") + 1]
    assert path == str(tmp_path / "container.env")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert Path(path).read_text() == "TOKEN='it'\"'\"'s s3cr3t'\n"
    assert "TOKEN" not in argv


def test_exec_names_a_node_whose_runtime_lacks_the_image(standin: tuple[Path, dict[str, str]]
                                                        ) -> None:
    log, env = standin
    res = dtrain(["exec", "-H", "localhost", "--image", "missing:1", "--container-runtime",
                  "docker", "--", "true"], env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "localhost: image missing:1 is not there (docker); copy it with: dtrain image " \
           "push missing:1" in res.stderr
    assert not any(c[1] == "run" for c in map(json.loads, log.read_text().splitlines()))


def test_doctor_rows_per_node() -> None:
    from launcher.decide.runplan.container import image_rows

    req = ContainerRequest(IMG)
    ok = ContainerFacts("podman", "/usr/bin/podman", "4.3.1", True, ID_A)
    rows = image_rows({"n1": req, "n2": req}, {"n1": ok, "n2": replace(ok, image_present=False)})
    assert rows == [("n1", True, f"podman 4.3.1: {IMG} aaaaaaaaaaaa"),
                    ("n2", False, f"image {IMG} is not there (podman); copy it with: "
                                  f"dtrain image push {IMG}")]


def test_the_probe_in_the_image_gets_the_jobs_words_without_the_node_dir() -> None:
    c = cmd("podman", probe=True)
    assert c.name == "dtrain-r1-n1-a2-probe"
    assert "-i" in c.head and f"{DIR_PLACEHOLDER}:{DIR_PLACEHOLDER}" not in c.head
    assert c.head[c.head.index("--network"):c.head.index("--network") + 2] == ("--network",
                                                                             "host")
    assert "/data:/data:ro" in c.head  # the user's mounts: the image's python may live there


def test_the_dry_run_shows_each_nodes_runtime_command() -> None:
    import io

    from launcher.commands.run import render_plan

    out = io.StringIO()
    render_plan(_plan(ContainerFacts("podman", "/usr/bin/podman", "4.3", True, ID_A)), out)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("  container (")]
    assert [ln.split(":", 1)[0] for ln in lines] == ["  container (docker)",
                                                    "  container (podman)"]
    assert "-v '<dtrain-node-dir>:<dtrain-node-dir>'" not in lines[0]
    assert "-v <dtrain-node-dir>:<dtrain-node-dir> -v /w:/w" in lines[0]
    assert lines[1].endswith(f"-e PYTHONUNBUFFERED {IMG}")


def _standin_runtime(tmp_path: Path, listed: list[str], rc: int = 0) -> tuple[Path, Path]:
    """A runtime that logs its calls: ``ps`` prints the names in LIST (exit ``rc``), ``rm``
    takes its name out of LIST."""
    listing, log = tmp_path / "LIST", tmp_path / "calls"
    listing.write_text("".join(n + "\n" for n in listed))
    script = tmp_path / "rt"
    script.write_text(f"""#!/bin/sh
echo "$1" >> {log}
case "$1" in
  ps) cat {listing}; exit {rc};;
  rm) grep -vx "$3" {listing} > {listing}.new; mv {listing}.new {listing};;
esac
""")
    script.chmod(0o755)
    return script, log


@pytest.mark.parametrize("case", ["clean", "still-there", "listing-fails", "not-gone-with-job"])
def test_the_end_of_a_container_lists_first_only_where_the_runtime_removed_it(
        tmp_path: Path, case: str) -> None:
    """podman run --rm removes its container before it returns: a clean end costs one
    listing and no removal (each podman call ~0.15 s of CPU on the run's way out); a
    container still listed, a listing that fails, and a runtime whose container outlives its
    job (docker's daemon) are removed by name as before."""
    from launcher.nodeside.nodecontainer import Container

    name = "dtrain-r1-node1-a1"
    listed = [] if case in ("clean", "not-gone-with-job") else [name]
    rt, log = _standin_runtime(tmp_path, listed, rc=1 if case == "listing-fails" else 0)
    spec = {"name": name, "prefix": "dtrain-r1-", "remove": [[str(rt), "rm", "-f", name]],
            "leftovers": [str(rt), "ps", "-a", "--filter", "label=dtrain.run=r1"],
            "gone_with_job": case != "not-gone-with-job"}
    c = Container(spec, str(tmp_path), 1.0)
    c.remove()
    calls = log.read_text().split()
    assert c.remaining == [] and c.left == []
    if case == "clean":
        assert calls == ["ps"]
    elif case in ("still-there", "listing-fails"):  # listed, or no answer: by name
        assert calls == ["ps", "rm", "ps"]
    else:  # removal by name first, then the listing, as for every runtime before
        assert calls == ["rm", "ps"], calls


def test_image_push_groups_the_nodes_by_the_marker_they_read_back() -> None:
    """Node i wrote i into the marker (exclusively: the first writer of a shared directory
    wins); nodes that read the same index share the directory, one copy for them. A node
    that read nothing (unreachable, its create refused) or a number no node wrote gets its
    own copy, as without the marker."""
    labels = ["a", "b", "c", "d", "e", "f"]
    answers = {"a": "0\n", "b": "0\n", "c": "2\n", "d": "2", "e": None, "f": "0"}
    assert share_groups(labels, answers) == [["a", "b", "f"], ["c", "d"], ["e"]]
    # every node its own directory: each read its own index
    assert share_groups(labels[:3], {"a": "0", "b": "1", "c": "2"}) == [["a"], ["b"], ["c"]]
    # garbage, another push's number, a digit that is not ASCII, nothing at all
    assert share_groups(labels[:5], {"a": "x", "b": "6", "c": "\u00b2", "d": "", "e": "-1"}) \
        == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert share_groups(["a", "b"], {"a": "9", "b": "9"}) == [["a"], ["b"]]
    # the winner's own read failed: the others still share, and it copies for itself
    assert share_groups(["a", "b", "c"], {"a": None, "b": "0", "c": "0"}) == \
        [["a"], ["b", "c"]]
    assert share_marker("ab12") == ".dtrain-share-ab12"


async def test_image_push_gives_a_node_that_cannot_say_its_own_copy(monkeypatch) -> None:
    """Finding who shares the archive's directory is bounded: a node whose marker step hangs
    (a hung NFS mount) or fails is a group of its own, and the others are grouped by what
    they read back. A node whose directory, or one above it, others could change is set
    apart with the node program's reason (it would load whatever archive lies there;
    tests/test_push_dir.py). The marker step is nodeside/pushdir.py with the directory, the
    marker and the node's index; the read-back runs through sh."""
    import asyncio
    import json

    from launcher.commands import image

    files: dict[str, str] = {}
    specs: list[tuple[str, dict[str, object]]] = []
    seen: list[str] = []

    async def prepare(host, transport, python, spec):
        specs.append((host.label, spec))
        if host.label == "c":
            await asyncio.sleep(0)
        if host.label == "b":
            await asyncio.sleep(5)  # hangs: past SHARE_TIMEOUT
        if host.label == "d":
            raise image.DtrainError("lost")
        if host.label == "e":
            return 0, json.dumps({"unsafe": "/x belongs to eve"}).encode() + b"\n", b""
        files.setdefault("m", str(spec["index"]))
        return 0, b'{"ok": true}\n', b""

    async def shell(host, transport, command):
        seen.append(command)
        if host.label == "b":
            await asyncio.sleep(5)
        if host.label == "d":
            raise image.DtrainError("lost")
        return 0, files["m"].encode() + b"\n", b""

    monkeypatch.setattr(image, "_prepare", prepare)
    monkeypatch.setattr(image, "_shell", shell)
    monkeypatch.setattr(image, "SHARE_TIMEOUT", 0.2)
    hosts = [Host("a"), Host("b"), Host("c"), Host("d"), Host("e")]
    groups, unsafe = await image._sharing(hosts, object(), "dir x", ".dtrain-share-t",
                                          fanout=8)
    assert [[h.label for h in g] for g in groups] == [["a", "c"], ["b"], ["d"]]
    assert unsafe == {"e": "/x belongs to eve"}
    assert sorted(specs, key=lambda s: s[0])[0] == (
        "a", {"dir": "dir x", "marker": ".dtrain-share-t", "index": 0})
    d = "'\"'\"'dir x'\"'\"'"
    assert seen[-1] == f"sh -c 'cat -- {d}/.dtrain-share-t'"
    # one node, or one safe node left: no second step
    seen.clear()
    groups, unsafe = await image._sharing([Host("a"), Host("e")], object(), "x", "m", 8)
    assert ([[h.label for h in g] for g in groups], list(unsafe)) == ([["a"]], ["e"])
    assert seen == []


async def test_image_push_skips_a_node_that_already_has_the_image(monkeypatch) -> None:
    """A node whose probe found the image with this machine's id is skipped: it is never
    asked whether it shares the archive's directory, never copied to, never loaded; a node
    without it, or with another id, gets the image. Everything but the push's own decision
    stands in (no runtime, no node); test_containers_cluster.py pushes for real."""
    import contextlib

    from launcher.commands import image
    from launcher.commands.cp import command as cp_command
    from launcher.job import containers
    from launcher.transports.ssh import SSHSettings

    want = "sha256:" + "a" * 64
    facts = {"has": ContainerFacts(runtime="podman", image_present=True, image_id=want),
             "lacks": ContainerFacts(runtime="podman", image_present=False),
             "other": ContainerFacts(runtime="podman", image_present=True,
                                     image_id="sha256:" + "b" * 64)}
    asked: dict[str, list[str]] = {"share": [], "copy": [], "load": [], "save": []}

    async def probe(transport, hosts, reqs, **kw):
        return {h.label: facts[h.label] for h in hosts}, {}, {}

    async def sharing(need, transport, directory, marker, fanout, python="python3"):
        asked["share"] += [h.label for h in need]
        return [[h] for h in need], {}

    def save(argv, **kw):
        asked["save"].append(argv[1])
        Path(argv[argv.index("-o") + 1]).write_bytes(b"archive")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    async def cp_async(receivers, copy, settings):
        asked["copy"] += [h.label for h in receivers]
        return 0

    async def load(host, transport, runtime, path, img):
        asked["load"].append(host.label)
        return want

    async def remove(host, transport, *paths):
        return None

    monkeypatch.setattr(image, "local_runtime", lambda req: ("podman", want))
    monkeypatch.setattr(containers, "probe_containers", probe)
    monkeypatch.setattr(image, "AutoTransport", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(image, "_sharing", sharing)
    monkeypatch.setattr(image, "subprocess", SimpleNamespace(run=save))
    monkeypatch.setattr(cp_command, "cp_async", cp_async)
    monkeypatch.setattr(image, "_load", load)
    monkeypatch.setattr(image, "_remove", remove)
    notes: list[str] = []
    monkeypatch.setattr(image.render, "note", notes.append)
    req = image.PushRequest("localhost/img:1")

    hosts = [Host("has"), Host("lacks"), Host("other")]
    res = await image.push_async(hosts, req, SSHSettings())
    assert (res.skipped, sorted(res.loaded), res.failed) == (["has"], ["lacks", "other"], {})
    assert asked == {"share": ["lacks", "other"], "copy": ["lacks", "other"],
                     "load": ["lacks", "other"], "save": ["save"]}
    assert notes[0] == "1 node already has localhost/img:1 (aaaaaaaaaaaa): skipped", notes
    # every node has it: nothing is saved, copied or loaded
    for k in asked:
        asked[k] = []
    res = await image.push_async([Host("has")], req, SSHSettings())
    assert (res.skipped, res.loaded, res.exit_code) == (["has"], [], 0)
    assert asked == {"share": [], "copy": [], "load": [], "save": []}
