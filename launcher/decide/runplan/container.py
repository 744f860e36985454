"""Pure: the container runtime's command line for one node, from that node's facts.

``dtrain run --image IMAGE`` (docs/containers.md) starts torchrun and the rank shim inside the
image on every node. What a training container needs differs per runtime (the table in
docs/containers.md): the node's network, shared memory, GPUs, the RDMA devices with pinned
memory, the working directory and the run's node directory. This module decides the words;
the supervisor on the node only adds the environment's *names* (``-e NAME``: the values stay
in the runtime's own environment, never in argv) or, for a runtime that needs a file, a
private 0600 file, and stops and removes the container by name.

No I/O: ``ContainerFacts`` come from the probe (``nodeside/probe.py``), the request from the
CLI. ``{DTRAIN_DIR}`` (``nodeside.wire.DIR_PLACEHOLDER``) is the supervisor's private
directory on the node (rank shim, its socket), mounted at the same path inside.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import UsageError
from launcher.nodeside.wire import DIR_PLACEHOLDER

RUNTIMES = ("podman", "docker", "enroot", "apptainer")
LABEL_RUN = "dtrain.run"
LABEL_NODE = "dtrain.node"
LABEL_ATTEMPT = "dtrain.attempt"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Mount:
    """``--mount SRC:DST[:ro]``."""

    src: str
    dst: str
    ro: bool = False

    @property
    def text(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")


def parse_mount(text: str) -> Mount:
    """``SRC:DST`` or ``SRC:DST:ro`` (``:rw`` too); both absolute paths (exit 2 otherwise)."""
    parts = text.split(":")
    mode = ""
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) != 2 or not all(p.startswith("/") for p in parts):
        raise UsageError(f"--mount {text!r}: expected SRC:DST[:ro] with absolute paths",
                         hint="e.g. --mount /data:/data:ro")
    if any(c in text for c in ",\n\0"):
        raise UsageError(f"--mount {text!r}: a comma, newline or NUL is not allowed")
    return Mount(parts[0], parts[1], mode == "ro")


@dataclass(frozen=True)
class ContainerRequest:
    """What the user asked for: ``--image``, ``--container-runtime``, ``--mount``,
    ``--container-arg`` (run, exec, smoke; per host ``image:`` in the YAML hostfile)."""

    image: str
    runtime: str | None = None  # None: the node's first of RUNTIMES found by the probe
    mounts: tuple[Mount, ...] = ()
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.runtime is not None and self.runtime not in RUNTIMES:
            raise UsageError(f"--container-runtime {self.runtime!r}: one of "
                             f"{', '.join(RUNTIMES)}")
        if not self.image or self.image.startswith("-") or any(
                c.isspace() or c == "\0" for c in self.image):
            raise UsageError(f"--image {self.image!r}: not an image name")

    def probe_params(self) -> dict[str, object]:
        """What the probe is asked to find out (nodeside/probe.py ``container_facts``)."""
        return {"image": self.image, "runtime": self.runtime, "runtimes": list(RUNTIMES)}


@dataclass(frozen=True)
class ContainerFacts:
    """One node's runtime as the probe found it (on the host, before anything starts)."""

    runtime: str | None = None  # which runtime will run it; None: none found
    path: str | None = None
    version: str | None = None
    image_present: bool = False
    image_id: str | None = None  # the image's id/digest (docker/podman), None where unknown
    rootless: bool | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, obj: object) -> ContainerFacts | None:
        if not isinstance(obj, Mapping):
            return None

        def text(key: str) -> str | None:
            v = obj.get(key)
            return v if isinstance(v, str) and v else None

        rootless = obj.get("rootless")
        return cls(runtime=text("runtime") if text("runtime") in RUNTIMES else None,
                   path=text("path"), version=text("version"),
                   image_present=obj.get("image_present") is True, image_id=text("image_id"),
                   rootless=rootless if isinstance(rootless, bool) else None,
                   error=text("error"))

    def to_json(self) -> dict[str, object]:
        return {"runtime": self.runtime, "path": self.path, "version": self.version,
                "image_present": self.image_present, "image_id": self.image_id,
                "rootless": self.rootless, "error": self.error}


def for_host(req: ContainerRequest | None, image: str | None) -> ContainerRequest | None:
    """A host's request: its hostfile ``image:`` wins over ``--image`` (the other container
    options apply to it as well); None: this host runs without a container."""
    if image is None:
        return req
    if req is None:
        return ContainerRequest(image=image)
    return dataclasses.replace(req, image=image)


def image_problems(reqs: Mapping[str, ContainerRequest],
                   facts: Mapping[str, ContainerFacts | None]) -> list[str]:
    """Every node that cannot start its image as the others would, named (``label: why``):
    no runtime, the image missing, or another digest than most nodes with that image have."""
    problems: list[str] = []
    ids: dict[str, dict[str, str]] = {}  # image -> label -> id
    for label, req in reqs.items():
        f = facts.get(label)
        want = f" {req.runtime}" if req.runtime else ""
        if f is None or f.runtime is None:
            why = f.error if f is not None and f.error else \
                f"no container runtime{want or ' (' + ', '.join(RUNTIMES) + ')'} found"
            problems.append(f"{label}: {why}")
        elif not f.image_present:
            problems.append(f"{label}: image {req.image} is not there ({f.runtime}); "
                            f"copy it with: dtrain image push {req.image}")
        elif f.image_id:
            ids.setdefault(req.image, {})[label] = f.image_id
    for image, by_label in ids.items():
        if len(set(by_label.values())) < 2:
            continue
        counts: dict[str, int] = {}
        for v in by_label.values():
            counts[v] = counts.get(v, 0) + 1
        first = next(iter(by_label.values()))  # ties: the first node's is the reference
        ref = max(counts, key=lambda v: (counts[v], v == first))
        for label, v in by_label.items():
            if v != ref:
                problems.append(f"{label}: image {image} has digest {short_id(v)}, the "
                                f"other nodes {short_id(ref)}; copy it with: "
                                f"dtrain image push {image}")
    return problems


def image_rows(reqs: Mapping[str, ContainerRequest],
               facts: Mapping[str, ContainerFacts | None]) -> list[tuple[str, bool, str]]:
    """`doctor --image`: per node (label, ok, detail): the runtime, version and image id,
    or why that node cannot run the image (``image_problems``'s words)."""
    problems = dict(p.split(": ", 1) for p in image_problems(reqs, facts))
    rows = []
    for label, req in reqs.items():
        f = facts.get(label)
        if label in problems:
            rows.append((label, False, problems[label]))
        elif f is not None:
            ident = f" {short_id(f.image_id)}" if f.image_id else ""
            rows.append((label, True, f"{f.runtime} {f.version or '?'}: {req.image}{ident}"))
    return rows


def short_id(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def container_name(run_id: str, node: str, attempt: int) -> str:
    """``dtrain-<run id>-<node>-a<attempt>``: unique per run, node and attempt, and a valid
    container name in every runtime (other characters become ``_``)."""
    return _NAME_BAD.sub("_", f"dtrain-{run_id}-{node}-a{attempt}")


@dataclass(frozen=True)
class ContainerCommand:
    """One node's runtime command around the job's argv, and how it is stopped.

    The supervisor runs ``head + env + image + job argv`` where env is ``env_flag NAME`` per
    variable it sets (values from its own environment) or ``env_file_flag FILE`` (a private
    0600 file); at teardown ``stop`` (grace, then kill, by name) and ``remove``; at its end
    ``leftovers`` lists what still carries the run's label (names starting ``prefix``) and
    removes each."""

    runtime: str
    name: str
    head: tuple[str, ...]
    image: tuple[str, ...]
    env_flag: str | None = "-e"
    env_file_flag: str | None = None
    prepare: tuple[tuple[str, ...], ...] = ()
    stop: tuple[tuple[str, ...], ...] = ()
    remove: tuple[tuple[str, ...], ...] = ()
    leftovers: tuple[str, ...] = ()
    prefix: str = ""
    # the container ends with its job (podman run --rm in the foreground removes it before
    # it returns): at the end the node lists first and removes by name only what is listed
    gone_with_job: bool = False

    def shown(self, env_names: Sequence[str] = ()) -> tuple[str, ...]:
        """The runtime's words as ``--dry-run`` shows them (env by name only)."""
        env: list[str] = []
        if self.env_flag:
            for n in env_names:
                env += [self.env_flag, n]
        elif self.env_file_flag:
            env = [self.env_file_flag, f"{DIR_PLACEHOLDER}/container.env"]
        return (*self.head, *env, *self.image)

    def wire(self) -> dict[str, object]:
        return {"runtime": self.runtime, "name": self.name, "head": list(self.head),
                "image": list(self.image), "env_flag": self.env_flag,
                "env_file_flag": self.env_file_flag,
                "prepare": [list(c) for c in self.prepare],
                "stop": [list(c) for c in self.stop], "remove": [list(c) for c in self.remove],
                "leftovers": list(self.leftovers), "prefix": self.prefix,
                "gone_with_job": self.gone_with_job}


@dataclass(frozen=True)
class NodeContainerFacts:
    """The node facts the runtime's words depend on (from ``decide.runplan.facts.NodeFacts``)."""

    gpus: int = 0
    rdma: bool = False  # the node has HCAs (RDMA ports)
    shm_bytes: int | None = None


def command_for(req: ContainerRequest, runtime: str, node: NodeContainerFacts, *,
                run_id: str, host: str, attempt: int, workdir: str | None,
                grace: float, interactive: bool = False, probe: bool = False
                ) -> ContainerCommand:
    """The runtime's command line for one node (docs/containers.md has the table).

    ``probe``: the preflight's probe inside the image (``-probe`` name, stdin open, no node
    directory: it has none yet)."""
    name = container_name(run_id, host, attempt) + ("-probe" if probe else "")
    interactive = interactive or probe
    labels = ((LABEL_RUN, run_id), (LABEL_NODE, host), (LABEL_ATTEMPT, str(attempt)))
    binds = [] if probe else [Mount(DIR_PLACEHOLDER, DIR_PLACEHOLDER)]
    if workdir:
        binds.append(Mount(workdir, workdir))
    binds += list(req.mounts)
    stop_after = str(max(0, int(round(grace))))
    prefix = container_name(run_id, "", 0)[:-len("-a0")]  # dtrain-<run id>-
    if runtime in ("podman", "docker"):
        # --sig-proxy=false: the supervisor stops the container by name (`stop -t GRACE`); the
        # client's proxy of the supervisor's TERM ran `crun kill` that the same TERM cut
        # short ("forwarding signal 15 to container ... failed", on every stop)
        head = [runtime, "run", "--rm", "--init", "--sig-proxy=false", "--name", name]
        for k, v in labels:
            head += ["--label", f"{k}={v}"]
        if interactive:
            head.append("-i")
        # the node's own network (NCCL, the rendezvous); never the runtime's bridge
        head += ["--network", "host"]
        # every local rank is in this one container: NCCL's SHM transport and dataloaders
        # need a /dev/shm as large as the node's, not the runtime's 64 MiB
        head += ["--shm-size", str(node.shm_bytes)] if node.shm_bytes else ["--ipc", "host"]
        if node.gpus > 0:
            head += ["--device", "nvidia.com/gpu=all"] if runtime == "podman" else \
                ["--gpus", "all"]
        if node.rdma:
            head += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK",
                     "--ulimit", "memlock=-1:-1"]
        for m in binds:
            head += ["-v", m.text]
        if workdir:
            head += ["-w", workdir]
        head += list(req.args)
        return ContainerCommand(
            runtime, name, tuple(head), (req.image,), env_flag="-e",
            # docker's containers live under dockerd, out of the supervisor's tree: stopped
            # by name. podman's are in it (conmon is reparented to the supervisor, a
            # subreaper): its TERM and KILL reach them, and a `podman stop` killed with the
            # tree would leave the container stuck "Stopping"
            stop=((runtime, "stop", "-t", stop_after, name),) if runtime == "docker" else (),
            remove=((runtime, "rm", "-f", name),),
            leftovers=(runtime, "ps", "-a", "--filter", f"label={LABEL_RUN}={run_id}",
                       "--format", "{{.Names}}"),
            prefix=prefix, gone_with_job=runtime == "podman")
    if runtime == "enroot":
        # enroot starts a named container created from a squashfs image; the host's network
        # and /dev/shm are shared by default; GPUs and HCAs through its hooks (98-nvidia,
        # 99-mellanox), which read these variables
        head = ["enroot", "start"]
        if node.gpus > 0:
            head += ["--env", "NVIDIA_VISIBLE_DEVICES=all"]
        if node.rdma:
            head += ["--env", "MELLANOX_VISIBLE_DEVICES=all"]
        for m in binds:
            head += ["--mount", f"{m.src}:{m.dst}" + (":ro" if m.ro else "")]
        head += list(req.args)
        cd = ("/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir) if workdir else ()
        return ContainerCommand(
            runtime, name, tuple(head), (name, *cd), env_flag="--env",
            prepare=(("enroot", "create", "--force", "--name", name, req.image),),
            remove=(("enroot", "remove", "--force", name),),
            leftovers=("enroot", "list"), prefix=prefix)
    if runtime == "apptainer":
        # apptainer runs the job as a child process (no daemon): the supervisor's process
        # tree is the container; host network and /dev/shm are shared by default. A clean
        # environment plus the private env file: nothing of the login shell leaks in.
        head = ["apptainer", "exec", "--cleanenv"]
        if node.gpus > 0:
            head.append("--nv")
        if node.rdma:
            head += ["--bind", "/dev/infiniband"]
        for m in binds:
            head += ["--bind", m.text]
        if workdir:
            head += ["--pwd", workdir]
        head += list(req.args)
        return ContainerCommand(runtime, name, tuple(head), (req.image,), env_flag=None,
                                env_file_flag="--env-file")
    raise UsageError(f"unknown container runtime {runtime!r}")


# `image push`: which nodes share the directory the archive lands in (an NFS home, a parallel
# filesystem). Every node tries to create one marker file there exclusively (O_EXCL, atomic on
# the file server, unlike a directory listing an NFS client may cache) and writes its index
# into it; once all have tried, each reads it back. The nodes that read the same index share
# the directory, and one copy of the archive serves them all.
SHARE_MARK = ".dtrain-share-"


def share_marker(token: str) -> str:
    return f"{SHARE_MARK}{token}"


def share_groups(labels: Sequence[str], answers: Mapping[str, str | None]) -> list[list[str]]:
    """The nodes (``labels``, in order; node i wrote ``i``) grouped by the index each read back
    from the marker: the nodes that read the same index share the directory. A node whose
    answer is missing (None: unreachable, refused) or not an index of this push is a group of
    its own, so that it gets its own copy, as without this. Groups in first-seen order."""
    groups: dict[object, list[str]] = {}
    for i, label in enumerate(labels):
        text = (answers.get(label) or "").strip()
        index = int(text) if re.fullmatch(r"[0-9]{1,9}", text) else len(labels)
        key: object = index if index < len(labels) else ("alone", i)
        groups.setdefault(key, []).append(label)
    return list(groups.values())
