"""decide/runplan/container.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no unit test for (a first step; see there for what is left): the probe's container
facts read from its JSON line and written back, each odd field refused, and what the probe
is asked."""

from __future__ import annotations

from launcher.decide.runplan.container import RUNTIMES, ContainerFacts, ContainerRequest


def test_the_facts_travel_as_json_and_back() -> None:
    full = {"runtime": "podman", "path": "/usr/bin/podman", "version": "4.9.3",
            "image_present": True, "image_id": "sha256:ab12", "rootless": True,
            "error": "x"}
    facts = ContainerFacts.from_json(full)
    assert facts == ContainerFacts("podman", "/usr/bin/podman", "4.9.3", True, "sha256:ab12",
                                   True, "x")
    assert facts.to_json() == full
    assert ContainerFacts.from_json({**full, "rootless": False}).rootless is False  # type: ignore[union-attr]


def test_odd_fields_are_not_taken() -> None:
    assert ContainerFacts.from_json(["podman"]) is None
    assert ContainerFacts.from_json(None) is None
    odd = {"runtime": "lxc", "path": "", "version": 4, "image_present": "yes",
           "image_id": None, "rootless": "no", "error": ""}
    assert ContainerFacts.from_json(odd) == ContainerFacts()
    assert ContainerFacts.from_json({}) == ContainerFacts()
    assert ContainerFacts().to_json() == {"runtime": None, "path": None, "version": None,
                                          "image_present": False, "image_id": None,
                                          "rootless": None, "error": None}
    for runtime in RUNTIMES:
        assert ContainerFacts.from_json({"runtime": runtime}) == ContainerFacts(runtime)


def test_what_the_probe_is_asked() -> None:
    req = ContainerRequest(image="ghcr.io/x/train:1", runtime="docker")
    assert req.probe_params() == {"image": "ghcr.io/x/train:1", "runtime": "docker",
                                  "runtimes": ["podman", "docker", "enroot", "apptainer"]}
    assert ContainerRequest(image="a").probe_params()["runtime"] is None


def test_the_command_as_it_travels_to_the_node() -> None:
    from tests.test_containers import cmd

    for runtime in ("podman", "docker"):
        c = cmd(runtime)
        w = c.wire()
        assert w == {"runtime": runtime, "name": "dtrain-r1-n1-a2", "head": list(c.head),
                     "image": list(c.image), "env_flag": c.env_flag,
                     "env_file_flag": c.env_file_flag,
                     "prepare": [list(x) for x in c.prepare],
                     "stop": [list(x) for x in c.stop], "remove": [list(x) for x in c.remove],
                     "leftovers": list(c.leftovers), "prefix": "dtrain-r1-",
                     "gone_with_job": runtime == "podman"}
        assert w["remove"] and all(isinstance(x, list) for x in w["remove"])  # type: ignore[union-attr]
    assert cmd("docker").wire()["stop"] == [["docker", "stop", "-t", "10",
                                             "dtrain-r1-n1-a2"]]


def test_enroot_and_apptainer_as_they_travel_to_the_node() -> None:
    from tests.test_containers import IMG, cmd

    name = "dtrain-r1-n1-a2"
    w = {k: v for k, v in cmd("enroot").wire().items() if k != "head"}
    assert w == {"runtime": "enroot", "name": name,
                 "image": [name, "/bin/sh", "-c", 'cd "$0" && exec "$@"', "/home/u/proj"],
                 "env_flag": "--env", "env_file_flag": None,
                 "prepare": [["enroot", "create", "--force", "--name", name, IMG]],
                 "stop": [], "remove": [["enroot", "remove", "--force", name]],
                 "leftovers": ["enroot", "list"], "prefix": "dtrain-r1-",
                 "gone_with_job": False}
    w = {k: v for k, v in cmd("apptainer").wire().items() if k != "head"}
    assert w == {"runtime": "apptainer", "name": name, "image": [IMG], "env_flag": None,
                 "env_file_flag": "--env-file", "prepare": [], "stop": [], "remove": [],
                 "leftovers": [], "prefix": "", "gone_with_job": False}


def test_what_a_bad_mount_runtime_or_image_is_told() -> None:
    import pytest

    from launcher.decide.runplan.container import parse_mount
    from launcher.errors import UsageError

    cases = [(lambda: parse_mount("data:/d"),
              "--mount 'data:/d': expected SRC:DST[:ro] with absolute paths",
              "e.g. --mount /data:/data:ro"),
             (lambda: parse_mount("/a:/b,c"),
              "--mount '/a:/b,c': a comma, newline or NUL is not allowed", None),
             (lambda: ContainerRequest(image="a", runtime="lxc"),
              "--container-runtime 'lxc': one of podman, docker, enroot, apptainer", None),
             (lambda: ContainerRequest(image="a\0b"), "--image 'a\\x00b': not an image name",
              None)]
    for make, message, hint in cases:
        with pytest.raises(UsageError) as err:
            make()
        assert (err.value.message, err.value.hint) == (message, hint)
    assert parse_mount("/Xdata:/X").src == "/Xdata"  # an X is no forbidden character


def test_image_rows_digests_and_ties() -> None:
    from launcher.decide.runplan.container import image_problems, image_rows, short_id

    assert short_id("0123456789abcdef") == short_id("sha256:0123456789abcdef") == "0123456789ab"
    reqs = {"n1": ContainerRequest(image="img"), "n2": ContainerRequest(image="img")}
    facts = {"n1": ContainerFacts("podman", None, None, True, "sha256:" + "a" * 64),
             "n2": ContainerFacts("podman", None, "4.9", True, "sha256:" + "b" * 64)}
    # one node each: the first node's digest is the reference, the second is named
    assert image_problems(reqs, facts) == [
        f"n2: image img has digest {'b' * 12}, the other nodes {'a' * 12}; copy it with: "
        "dtrain image push img"]
    same = {"n1": facts["n1"], "n2": ContainerFacts("podman", None, "4.9", True, None)}
    assert image_rows(reqs, same) == [("n1", True, f"podman ?: img {'a' * 12}"),
                                      ("n2", True, "podman 4.9: img")]


def test_one_gpu_is_passed_through_and_a_grace_of_0_is_0() -> None:
    from launcher.decide.runplan.container import NodeContainerFacts, command_for
    from tests.test_containers import IMG, cmd

    one = NodeContainerFacts(gpus=1, rdma=False, shm_bytes=1 << 30)
    assert "nvidia.com/gpu=all" in cmd("podman", one).head
    assert "--gpus" in cmd("docker", one).head
    assert "NVIDIA_VISIBLE_DEVICES=all" in cmd("enroot", one).head
    assert "--nv" in cmd("apptainer", one).head
    c = command_for(ContainerRequest(IMG), "docker", one, run_id="r1", host="n1", attempt=2,
                    workdir=None, grace=0.0)
    assert c.stop == (("docker", "stop", "-t", "0", "dtrain-r1-n1-a2"),)
    e = command_for(ContainerRequest(IMG), "enroot", one, run_id="r1", host="n1", attempt=2,
                    workdir=None, grace=0.0)
    assert e.image == ("dtrain-r1-n1-a2",)  # no working directory: no cd


def test_no_runtime_a_majority_digest_and_the_words_on_the_node() -> None:
    import pytest

    from launcher.decide.runplan.container import command_for, image_problems
    from launcher.errors import UsageError
    from tests.test_containers import CPU, IMG, cmd

    assert image_problems({"n1": ContainerRequest(image="img", runtime="docker")},
                          {"n1": ContainerFacts()}) == ["n1: no container runtime docker found"]
    assert image_problems({"n1": ContainerRequest(image="img")}, {"n1": None}) == [
        "n1: no container runtime (podman, docker, enroot, apptainer) found"]
    # an image every node has alike, then one where the first node is the odd one out
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    reqs = {n: ContainerRequest(image="one") for n in ("n1", "n2")}
    reqs.update({n: ContainerRequest(image="two") for n in ("n3", "n4", "n5")})
    facts = {"n1": ContainerFacts("podman", image_present=True, image_id=a),
             "n2": ContainerFacts("podman", image_present=True, image_id=a),
             "n3": ContainerFacts("podman", image_present=True, image_id=b),
             "n4": ContainerFacts("podman", image_present=True, image_id=a),
             "n5": ContainerFacts("podman", image_present=True, image_id=a)}
    assert image_problems(reqs, facts) == [
        f"n3: image two has digest {'b' * 12}, the other nodes {'a' * 12}; copy it with: "
        "dtrain image push two"]
    assert cmd("docker").env_flag == "-e"
    assert cmd("apptainer").shown(["A"])[-3:] == (
        "--env-file", "{DTRAIN_DIR}/container.env", IMG)
    with pytest.raises(UsageError) as err:
        command_for(ContainerRequest(IMG), "lxc", CPU, run_id="r1", host="n1", attempt=2,
                    workdir=None, grace=0.0)
    assert err.value.message == "unknown container runtime 'lxc'"
