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
    sh_quote,
)


class Container:
    """The job inside a container image (launcher/decide/container.py decided the words):
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
        """Remove the container by name, then every container the run's label still
        lists (``leftovers``) on this node: nothing of the run is left. Idempotent."""
        if self.removed:
            return
        self.removed = True
        for cmd in self.spec.get("remove") or []:
            run_quiet(cmd)
        listing = self.spec.get("leftovers")
        remove = list((self.spec.get("remove") or [[]])[0])
        if not listing or not remove:
            return
        prefix = self.spec.get("prefix") or ""
        # a runtime still busy with the container (its cleanup, a lock held by a CLI we
        # killed) may refuse the first removal: list by label and retry, for a few seconds
        deadline = now() + 15.0
        while True:
            names = [n.strip() for n in run_output(listing).splitlines()]
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
