"""What the kernel said about a node's processes: OOM kills and Xids, from /dev/kmsg and the cgroup.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``); runs on the nodes,
standard library only, Python >= 3.8.
"""

import os

KMSG_WORDS = ("Out of memory", "oom-kill", "Killed process", "oom_reaper", "Xid",
              "segfault", "Memory cgroup out of memory")


def _status_kb(pid):
    """VmRSS and VmHWM of a process (kB), or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            text = f.read()
    except OSError:
        return None
    out = {}  # type: dict[str, int]
    for line in text.splitlines():
        if line.startswith((b"VmRSS:", b"VmHWM:")):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out["rss_kb" if line.startswith(b"VmRSS") else "hwm_kb"] = int(parts[1])
    return out or None


def memory_events_path(pid):
    """The memory cgroup file that counts OOM kills for pid's cgroup (v2 memory.events,
    v1 memory.oom_control), or None."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            path = "/sys/fs/cgroup" + parts[2].rstrip("/") + "/memory.events"
        elif "memory" in parts[1].split(","):
            path = "/sys/fs/cgroup/memory" + parts[2].rstrip("/") + "/memory.oom_control"
        else:
            continue
        if os.path.exists(path):
            return path
    return None


def oom_kills(text):
    """The ``oom_kill N`` counter of memory.events / memory.oom_control text."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def kernel_lines(since, words=KMSG_WORDS, limit=60, path="/dev/kmsg"):
    """Kernel log records since ``since`` (seconds since boot) that mention one of
    ``words``, as "[seconds] text"; or an error string when the log is not readable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "%s: %s" % (path, exc.strerror)
    records = []
    try:
        while True:  # /dev/kmsg: one record per read
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: overwritten while reading, go on
                    continue
                break
            if not record:
                break
            records.append(record)
    finally:
        os.close(fd)
    return kmsg_matches(records, since, words, limit)


def kmsg_matches(records, since, words=KMSG_WORDS, limit=60):
    """The /dev/kmsg records (``PRIO,SEQ,USEC,FLAGS;text`` then ``KEY=value``
    continuation lines) at or after ``since - 1`` s that mention one of ``words``."""
    found = []
    for record in records:
        head, _, text = record.decode("utf-8", "replace").partition(";")
        fields = head.split(",")
        try:
            t = int(fields[2]) / 1e6
        except (IndexError, ValueError):
            continue
        text = text.split("\n", 1)[0]
        if t >= since - 1 and any(w in text for w in words):
            found.append("[%.6f] %s" % (t, text))
    return found[-limit:]


def _uptime():
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
