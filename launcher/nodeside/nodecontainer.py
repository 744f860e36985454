"""--image: the job in a container on the node (podman, docker, enroot, apptainer), named
so the supervisor can stop and remove it (docs/containers.md).

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``); runs on the nodes,
standard library only, Python >= 3.8.
"""

import _thread
import os
import time

from launcher.nodeside.nodecommon import (
    DIR_PLACEHOLDER,
    now,
    run_output,
    run_quiet,
    run_status_output,
    sh_quote,
)


class Container:
    """The job inside a container image (launcher/decide/runplan/container.py decided the words):
    the environment goes by name (``-e NAME``, values from the runtime's own environment) or
    in a private 0600 file, never as values in argv; stop and removal go by name."""

    def __init__(self, spec, tmpdir, grace):
        self.spec = spec
        self.tmpdir = tmpdir
        self.grace = grace
        self.stopping = False
        self.removed = False
        self.left = []  # the run's containers still listed after our own removal
        self.remaining = []  # and still there when we gave up

    def words(self, words):
        return [w.replace(DIR_PLACEHOLDER, self.tmpdir) for w in words]

    def argv(self, env, argv):
        names = sorted(k for k, v in env.items() if os.environ.get(k) != v)
        extra = []
        if self.spec.get("env_flag"):
            for name in names:
                extra += [self.spec["env_flag"], name]
        elif self.spec.get("env_file_flag"):
            path = os.path.join(self.tmpdir, "container.env")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                for name in names:
                    f.write("%s=%s\n" % (name, sh_quote(env[name])))
            extra = [self.spec["env_file_flag"], path]
        for cmd in self.spec.get("prepare") or []:
            if run_quiet(self.words(cmd), timeout=600.0) != 0:
                raise OSError(5, "%s failed" % " ".join(cmd[:2]))
        return self.words(self.spec["head"]) + extra + self.words(self.spec["image"]) + argv

    def stop(self, grace):
        """Ask the runtime to stop the container by name (grace, then kill), off-thread:
        a signal handler may call this. Once."""
        if self.stopping or not self.spec.get("stop"):
            return
        self.stopping = True
        cmds = []
        for cmd in self.spec["stop"]:
            cmd = list(cmd)
            if grace <= 0 and "-t" in cmd:
                cmd[cmd.index("-t") + 1] = "0"
            cmds.append(cmd)

        def work():
            for cmd in cmds:
                run_quiet(cmd, timeout=max(10.0, grace + 10.0))
        _thread.start_new_thread(work, ())

    def remove(self):
        """Remove the container by name, then every container the run's label still lists
        (``leftovers``) on this node: nothing of the run is left. Idempotent.

        A runtime whose container ends with its job (``gone_with_job``: ``podman run --rm``
        in the foreground removes it before it returns) is listed first, and removed by
        name only when the listing (which answered) still shows it: a clean end then costs
        one runtime call, not two (each podman call is ~0.15 s of CPU, on the run's way
        out). A listing that fails is the old way: removal by name first."""
        if self.removed:
            return
        self.removed = True
        removes = self.spec.get("remove") or []
        listing = self.spec.get("leftovers")
        own = self.spec.get("name")
        first = None
        if listing and self.spec.get("gone_with_job"):
            status, out = run_status_output(listing)
            if status == 0:
                first = out
        if first is None or own in [n.strip() for n in first.splitlines()]:
            for cmd in removes:
                run_quiet(cmd)
            first = None
        remove = list((removes or [[]])[0])
        if not listing or not remove:
            return
        prefix = self.spec.get("prefix") or ""
        # a runtime still busy with the container (its cleanup, a lock held by a CLI we
        # killed) may refuse the first removal: list by label and retry, for a few seconds
        deadline = now() + 15.0
        while True:
            out = first if first is not None else run_output(listing)
            first = None
            names = [n.strip() for n in out.splitlines()]
            left = [n for n in names if n and n.startswith(prefix)]
            if not self.left:
                self.left = left  # what was left when we first looked (reported)
            if not left or now() >= deadline:
                self.left = left if left else self.left
                self.remaining = left
                return
            for name in left:
                run_quiet(remove[:-1] + [name])
            time.sleep(0.5)
