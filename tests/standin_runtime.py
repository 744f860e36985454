#!/usr/bin/env python3
"""A stand-in container runtime (docker, podman, enroot or apptainer, by the name it is
called as): records every argv in $FAKE_RT_LOG (one JSON list per line), answers the probe
(``--version``/``version``, ``image inspect``), and runs a job's command directly, in a
clean environment holding only what the runtime was told to pass (``-e NAME`` from its own
environment, or ``--env-file FILE``), as a container would. enroot and apptainer are not
packaged for this machine, so their command lines are tested with this (docs/containers.md).

``$FAKE_IMAGE`` is the image that "exists"; the job's command starts after it (docker,
podman, apptainer) or after the container's name (enroot: the first word ``dtrain-...``).
"""

import json
import os
import shlex
import sys

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_RT_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\n")
image = os.environ.get("FAKE_IMAGE", "")
if args[:1] in (["--version"], ["version"]):
    print({"docker": "Docker version 20.10.24+dfsg1, build 297e128",
           "enroot": "3.4.1"}.get(name, f"{name} version 1.2.3"))
    sys.exit(0)
if args[:2] == ["image", "inspect"]:
    if args[-1] == image:
        print("sha256:" + "ab" * 32)
        sys.exit(0)
    print("Error: no such image", file=sys.stderr)
    sys.exit(1)
if args[:1] in (["stop"], ["rm"], ["ps"], ["create"], ["remove"], ["list"]):
    sys.exit(0)
if args[:1] not in (["run"], ["start"], ["exec"]):
    print(f"stand-in runtime: unexpected {args!r}", file=sys.stderr)
    sys.exit(99)
if name == "enroot":
    cut = next(i for i, a in enumerate(args) if a.startswith("dtrain-"))
else:
    cut = args.index(image)
opts, command = args[1:cut], args[cut + 1:]
env = {}
i = 0
while i < len(opts):
    if opts[i] in ("-e", "--env") and "=" not in opts[i + 1]:
        if opts[i + 1] in os.environ:
            env[opts[i + 1]] = os.environ[opts[i + 1]]
        i += 1
    elif opts[i] in ("-w", "--pwd"):
        os.chdir(opts[i + 1])
        i += 1
    elif opts[i] == "--env-file":
        with open(opts[i + 1]) as f:
            for line in f:
                key, _, value = line.rstrip("\n").partition("=")
                env[key] = shlex.split(value)[0] if value else ""
        i += 1
    i += 1
env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
os.execvpe(command[0], command, env)
