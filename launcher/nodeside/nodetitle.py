"""The process title every node program sets: what a node's admin sees in ps and top.

THIS RUNS ON THE NODES: standard library only, Python >= 3.8, unannotated. The first module
of every node program's bundle (launcher/nodeside/wire.py ``PROGRAMS``): one copy for the
supervisor, the probe, the sampler and cpnode (each used to carry its own).
"""

import os


def set_title(title, comm):
    """What a node's admin sees of this process: ``comm`` (15 bytes: top, ps -e) and
    ``title`` as its command line (ps -ef, ps aux). The title is written over the argv area
    that /proc/PID/cmdline reads, as setproctitle(3) does: the title, a NUL, and a last
    byte that is not NUL, which makes the kernel read up to the first NUL. Through /proc
    files, without ctypes (~1.5 ms per node); best effort, never raises."""
    try:
        with open("/proc/self/comm", "wb", 0) as f:
            f.write(comm.encode("utf-8", "replace")[:15])
    except OSError:
        pass
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (Linux >= 3.5)
        size = end - start
        if size < 2:
            return
        data = title.encode("utf-8", "replace")[:size - 1] + b"\0"
        if len(data) < size:
            data += b"\0" * (size - len(data) - 1) + b" "
        fd = os.open("/proc/self/mem", os.O_RDWR)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass
