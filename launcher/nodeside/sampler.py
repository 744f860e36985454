"""dtrain node sampler: this program RUNS ON THE NODES, not on the launcher machine.

Shipped verbatim over the channel (launcher/nodeside/wire.py) like the probe and started
with the stdlib-only bootstrap (``python3 -u -I -S -c BOOTSTRAP``). Standard library only,
Python 3.8, one file, no daemon: it lives exactly as long as its channel.

Protocol. stdin: ONE JSON line of parameters, then control lines::

    {"mode": "sample", "v": 1, "interval": 1.0, "first": 0.25, "run_id": "2026...-ab12",
     "ranks": [4, 5], "ifaces": ["ens1f0"], "hb_timeout": 30, "gpu": true}
    {"op": "hb"}                    the launcher is alive (any line counts)
    {"op": "interval", "s": 2.0}    sample every 2 s from now on
    {"op": "stop"}                  leave now

stdout: JSON lines (nodemessages.py): a hello once, then a sample every ``interval`` s (the
first ``first`` s after start, waiting ``gpu_wait`` s more for a GPU reading; docs/top.md).

Where the numbers come from, and why these sources (each read costs microseconds):

* CPU busy: ``/proc/stat`` deltas; load: ``/proc/loadavg``; memory: ``/proc/meminfo``
  (used = MemTotal - MemAvailable); network: ``/proc/net/dev`` deltas of the named
  interfaces (default: the interface of the route towards the launcher, $SSH_CONNECTION).
* NVIDIA GPUs: ONE long-lived ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits
  -lms N`` child whose lines we read as they come: NVML is initialised once, not at every
  sample (a fresh nvidia-smi costs tens to hundreds of ms of CPU). ``count`` is queried too,
  so a batch is complete when ``count`` lines arrived. If we die, its next write fails
  (SIGPIPE): nothing outlives us by more than one interval.
* AMD GPUs: amdgpu's sysfs files (gpu_busy_percent, mem_info_vram_*, hwmon temp/power),
  read directly: ``rocm-smi`` is a Python program costing ~0.3-1 s per call, not cheap.
* A run's ranks on this node: processes whose environment holds ``DTRAIN_RUN_ID=<run_id>``
  and a ``RANK`` (torchrun's global rank; the rank shim and the worker both carry it, and
  so do a worker's dataloader children). Per rank we report the CPU seconds of those
  processes (utime + stime from /proc/<pid>/stat, accumulated so a vanished child never
  makes it go backwards): how much of its time a rank computes rather than waits.
  Each process's environment is read once (the pid and its start time are remembered).

Every file is read through a ``root`` prefix, so tests point the readers at fake trees.
"""

import os
import select
import sys
import time

from launcher.nodeside.nodecommon import from_json, now, to_json
from launcher.nodeside.nodemessages import MSG_HELLO, MSG_SAMPLE
from launcher.nodeside.nodeprocs import spawn
from launcher.nodeside.nodetitle import set_title

SAMPLER_VERSION = 1
GPU_FIELDS = ("count", "index", "utilization.gpu", "memory.used", "memory.total",
              "temperature.gpu", "power.draw", "power.limit", "name")
RESTART_SMI_S = 30.0  # a failed nvidia-smi is tried again this long after
RESCAN_S = 10.0  # /proc is scanned for a run's processes at most this often once all are found


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def rooted(root, path):
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


# --------------------------------------------------------------------------- host readers


def read_cpu(root="/"):
    """(busy ticks, total ticks, cpu count) from /proc/stat, or None."""
    text = read_text(rooted(root, "/proc/stat"))
    if not text:
        return None
    total = busy = 0
    ncpu = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            vals = [int(v) for v in line.split()[1:] if v.isdigit()]
            # user nice system idle iowait irq softirq steal (guest is inside user already)
            vals = vals[:8]
            total = sum(vals)
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            busy = total - idle
        elif line.startswith("cpu") and line[3:4].isdigit():
            ncpu += 1
    if not total:
        return None
    return busy, total, ncpu or (os.cpu_count() or 1)


def read_load(root="/"):
    text = read_text(rooted(root, "/proc/loadavg"))
    try:
        return [float(v) for v in text.split()[:3]] if text else None
    except ValueError:
        return None


def read_mem(root="/"):
    """(used, total) bytes: used = MemTotal - MemAvailable (what `free` calls available)."""
    text = read_text(rooted(root, "/proc/meminfo"))
    if not text:
        return None
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            vals[parts[0].rstrip(":")] = int(parts[1]) * 1024
    total = vals.get("MemTotal")
    avail = vals.get("MemAvailable", vals.get("MemFree"))
    if total is None or avail is None:
        return None
    return total - avail, total


def read_net(root="/"):
    """{iface: (rx bytes, tx bytes)} from /proc/net/dev (this network namespace's)."""
    text = read_text(rooted(root, "/proc/net/dev"))
    out = {}
    for line in (text or "").splitlines()[2:]:
        if ":" not in line:
            continue
        name, rest = line.split(":", 1)
        vals = rest.split()
        if len(vals) >= 9 and vals[0].isdigit() and vals[8].isdigit():
            out[name.strip()] = (int(vals[0]), int(vals[8]))
    return out


def _ip4(text):
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return None
    return (int(parts[0]) << 24) | (int(parts[1]) << 16) | (int(parts[2]) << 8) | int(parts[3])


def route_iface(target, root="/"):
    """The interface of the longest /proc/net/route prefix holding IPv4 ``target``."""
    addr = _ip4(target or "")
    text = read_text(rooted(root, "/proc/net/route"))
    if addr is None or not text:
        return None
    best = None
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:  # little-endian hex, as the kernel prints it
            dest = int.from_bytes(bytes.fromhex(f[1]), "little")
            mask = int.from_bytes(bytes.fromhex(f[7]), "little")
        except ValueError:
            continue
        if addr & mask == dest & mask:
            plen = bin(mask).count("1")
            if best is None or plen > best[0]:
                best = (plen, f[0])
    return best[1] if best else None


def default_ifaces(root="/", environ=None):
    """The interface towards the launcher ($SSH_CONNECTION's client address), else the
    default route's."""
    env = os.environ if environ is None else environ
    conn = (env.get("SSH_CONNECTION") or "").split()
    name = (route_iface(conn[0], root) if conn else None) or route_iface("0.0.0.0", root)
    return [name] if name else []


# --------------------------------------------------------------------------- GPUs


def _num(text):
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "-"):
        return None  # [N/A], [Not Supported], [Unknown Error]
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def parse_smi_line(line):
    """One nvidia-smi CSV line of GPU_FIELDS -> (count, gpu dict), or None."""
    parts = line.split(",", len(GPU_FIELDS) - 1)
    if len(parts) != len(GPU_FIELDS):
        return None
    count, index = _num(parts[0]), _num(parts[1])
    if not isinstance(count, int) or not isinstance(index, int):
        return None
    gpu = {"index": index, "name": parts[8].strip(), "util_pct": _num(parts[2]),
           "mem_used_mib": _num(parts[3]), "mem_total_mib": _num(parts[4]),
           "temp_c": _num(parts[5]), "power_w": _num(parts[6]),
           "power_limit_w": _num(parts[7])}
    return count, gpu


class NvidiaSmi:
    """The long-lived ``nvidia-smi -lms`` child and the last complete batch it printed."""

    def __init__(self, interval):
        self.interval = interval
        self.proc = None
        self.buf = b""
        self.batch = []
        self.gpus = None  # the last complete batch
        self.t = None  # when it completed
        self.error = None
        self.retry_at = 0.0
        self.missing = False
        self.cpu_prev = None

    def start(self):
        # nodeprocs.spawn, not subprocess: that import costs ~5 ms of CPU per node (enum,
        # threading, ...) at every `top` and every run's samplers
        ms = max(100, int(self.interval * 1000))
        argv = ["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS),
                "--format=csv,noheader,nounits", "-lms", str(ms)]
        try:
            self.proc = SmiProcess(*spawn(argv, dict(os.environ)))
        except (OSError, ValueError) as exc:
            self.proc = None
            self.missing = getattr(exc, "errno", None) == 2
            self.error = None if self.missing else "nvidia-smi: %s" % (
                getattr(exc, "strerror", None) or exc)
            self.retry_at = now() + RESTART_SMI_S
            return False
        os.set_blocking(self.proc.out, False)
        self.buf, self.batch = b"", []
        return True

    def fileno(self):
        return self.proc.out if self.proc is not None else None

    def on_readable(self):
        proc = self.proc
        if proc is None:
            return
        try:
            chunk = os.read(proc.out, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.ended()
            return
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            parsed = parse_smi_line(line.decode("utf-8", "replace"))
            if parsed is None:
                text = line.decode("utf-8", "replace").strip()
                if text:
                    self.error = "nvidia-smi: " + text[:200]
                continue
            count, gpu = parsed
            if self.batch and gpu["index"] <= self.batch[-1]["index"]:
                self.batch = []  # a new batch began before the last one completed
            self.batch.append(gpu)
            if len(self.batch) >= count:
                self.gpus, self.t, self.batch, self.error = self.batch, now(), [], None

    def ended(self):
        proc = self.proc
        if proc is None:
            return
        err = proc.read_err()
        code = proc.wait()
        lines = err.decode("utf-8", "replace").strip().splitlines()
        self.error = "nvidia-smi exited (%s)%s" % (
            code, ": " + lines[-1][:200] if lines else "")
        self.proc = None
        self.retry_at = now() + RESTART_SMI_S

    def cpu_seconds(self):
        """nvidia-smi's own CPU time so far (it is part of what sampling costs)."""
        if self.proc is None:
            return 0.0
        st = proc_stat("/", self.proc.pid)
        return st[0] if st else 0.0

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class SmiProcess:
    """nvidia-smi as nodeprocs.spawn started it: its pid, stdout and stderr pipes."""

    def __init__(self, pid, out, err):
        self.pid = pid
        self.out = out
        self.err = err
        self.code = None

    def read_err(self, limit=65536):
        """What it wrote to stderr (it has ended: its end of the pipe is closed)."""
        data = b""
        try:
            while len(data) < limit:
                chunk = os.read(self.err, limit - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        return data

    def kill(self):
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass

    def wait(self):
        """Its exit code (-N for a signal, as Popen's); closes its pipes."""
        if self.code is None:
            while True:
                try:
                    _, st = os.waitpid(self.pid, 0)
                    break
                except InterruptedError:
                    continue
                except ChildProcessError:
                    st = 0
                    break
            self.code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -os.WTERMSIG(st)
            for fd in (self.out, self.err):
                try:
                    os.close(fd)
                except OSError:
                    pass
        return self.code


def read_amdgpus(root="/"):
    """amdgpu cards from sysfs (vendor 0x1002), as nvidia-smi's fields; [] when none."""
    base = rooted(root, "/sys/class/drm")
    try:
        cards = sorted(n for n in os.listdir(base) if n.startswith("card") and n[4:].isdigit())
    except OSError:
        return []
    gpus = []  # type: list[dict[str, object]]
    for name in sorted(cards, key=lambda n: int(n[4:])):
        dev = os.path.join(base, name, "device")
        if (read_text(os.path.join(dev, "vendor")) or "").strip() != "0x1002":
            continue

        def num(rel, scale=1.0, dev=dev):
            text = read_text(os.path.join(dev, rel))
            try:
                return float(text.strip()) / scale if text and text.strip() else None
            except ValueError:
                return None

        hwmon = None
        try:
            hw = sorted(os.listdir(os.path.join(dev, "hwmon")))
            hwmon = os.path.join("hwmon", hw[0]) if hw else None
        except OSError:
            pass
        temp = num(os.path.join(hwmon, "temp1_input"), 1000.0) if hwmon else None
        power = None
        if hwmon:
            power = num(os.path.join(hwmon, "power1_average"), 1e6)
            if power is None:
                power = num(os.path.join(hwmon, "power1_input"), 1e6)
        cap = num(os.path.join(hwmon, "power1_cap"), 1e6) if hwmon else None
        used, total = num("mem_info_vram_used", 1048576.0), num("mem_info_vram_total", 1048576.0)
        util = num("gpu_busy_percent")
        gpus.append({"index": len(gpus), "name": "amdgpu " + name,
                     "util_pct": _round(util), "mem_used_mib": _round(used),
                     "mem_total_mib": _round(total), "temp_c": _round(temp),
                     "power_w": _round(power), "power_limit_w": _round(cap)})
    return gpus


def _round(value):
    if value is None:
        return None
    value = round(value, 1)
    return int(value) if float(value).is_integer() else value


# --------------------------------------------------------------------------- ranks


def proc_stat(root, pid):
    """(CPU seconds = utime + stime, state, start time ticks) of a process, or None."""
    text = read_text(rooted(root, "/proc/%d/stat" % pid))
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2:].split()
    try:
        ticks = int(fields[11]) + int(fields[12])
        return ticks / CLK_TCK, fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _clk_tck():
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


CLK_TCK = _clk_tck()


def read_environ(root, pid):
    """A process's environment as {name: value}, or None (not ours, gone)."""
    try:
        with open(rooted(root, "/proc/%d/environ" % pid), "rb") as f:
            data = f.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


class Ranks:
    """The run's ranks on this node, found by their environment; CPU seconds per rank."""

    def __init__(self, run_id, ranks=None, root="/", uid=None):
        self.run_id = run_id
        self.wanted = set(ranks) if ranks else None
        self.root = root
        self.uid = os.getuid() if uid is None else uid
        self.seen = {}  # pid -> (start ticks, rank or None)
        self.last = {}  # pid -> cpu seconds at the last sample
        self.total = {}  # rank -> accumulated cpu seconds
        self.next_scan = 0.0
        self.missing = True

    def _scan(self):
        """Look at every process not seen yet; True when one of them is a rank's."""
        base = rooted(self.root, "/proc")
        try:
            pids = [int(n) for n in os.listdir(base) if n.isdigit()]
        except OSError:
            return False
        fresh = False
        alive = set(pids)
        for pid in list(self.seen):
            if pid not in alive:
                del self.seen[pid]
        for pid in pids:
            if pid in self.seen:
                continue
            try:
                if os.stat(os.path.join(base, str(pid))).st_uid != self.uid and self.uid != 0:
                    self.seen[pid] = (None, None)  # not ours: its environ is unreadable anyway
                    continue
            except OSError:
                continue
            st = proc_stat(self.root, pid)
            env = read_environ(self.root, pid)
            rank = None
            if env and env.get("DTRAIN_RUN_ID") == self.run_id and env.get("RANK", "").isdigit():
                rank = int(env["RANK"])
                if self.wanted is not None and rank not in self.wanted:
                    rank = None
            self.seen[pid] = (st[2] if st else None, rank)
            fresh = fresh or rank is not None
        return fresh

    def sample(self):
        """{rank: {"cpu": seconds, "pids": n, "state": "R"|"S"|...}} (str keys, for JSON)."""
        t = now()
        found = {r for _, r in self.seen.values() if r is not None}
        fresh = False
        if t >= self.next_scan or self.missing or (self.wanted is not None
                                                    and found != self.wanted):
            fresh = self._scan()
            self.next_scan = t + RESCAN_S
        # a new rank process (the shim) is followed by its children (the worker, its
        # dataloaders): look again at the next sample, not RESCAN_S later, or the rank's CPU
        # would be its shim's alone (~0) for up to RESCAN_S and every other rank would look
        # busy against it (a false straggler)
        self.missing = fresh
        out = {}  # type: dict[str, dict[str, object]]
        pids = {}  # type: dict[int, int]
        current = {}
        for pid, (start, rank) in self.seen.items():
            if rank is None:
                continue
            st = proc_stat(self.root, pid)
            if st is None or st[2] != start:
                self.missing = True  # gone, or the pid was reused: rescan next time
                continue
            cpu, state = st[0], st[1]
            current[pid] = cpu
            prev = self.last.get(pid)
            self.total[rank] = self.total.get(rank, 0.0) + (cpu - prev if prev is not None
                                                            else cpu)
            entry = out.setdefault(str(rank), {"cpu": 0.0, "pids": 0, "state": state})
            pids[rank] = pids.get(rank, 0) + 1
            if state in "RD":  # the busiest state of the rank's processes shows
                entry["state"] = state
        self.last = current
        for rank_s, entry in out.items():
            entry["cpu"] = round(self.total[int(rank_s)], 3)
            entry["pids"] = pids[int(rank_s)]
        return out


# --------------------------------------------------------------------------- the loop


class Sampler:
    def __init__(self, params, out_fd=1, in_fd=0, root="/", environ=None):
        self.params = params
        self.interval = max(0.1, float(params.get("interval") or 1.0))
        self.first = max(0.05, float(params.get("first") or self.interval))
        self.gpu_wait = float(params.get("gpu_wait", 3.0))
        self.hb_timeout = float(params.get("hb_timeout") or 0)
        self.root = root
        self.out_fd, self.in_fd = out_fd, in_fd
        ifaces = params.get("ifaces") or default_ifaces(root, environ)
        self.ifaces = [i for i in ifaces if i]
        self.smi = NvidiaSmi(self.interval) if params.get("gpu", True) else None
        self.amd = bool(params.get("gpu", True))
        self.ranks = Ranks(params["run_id"], params.get("ranks"), root) \
            if params.get("run_id") else None
        self.last_input = now()
        self.inbuf = b""
        self.prev = None  # (t, cpu, net)
        self.cost_prev = None
        self.done = False
        self.due = 0.0

    def emit(self, msg):
        data = (to_json(msg) + "\n").encode()
        while data:
            n = os.write(self.out_fd, data)
            data = data[n:]

    def hello(self):
        cpu = read_cpu(self.root)
        self.emit({"type": MSG_HELLO, "v": SAMPLER_VERSION, "pid": os.getpid(), "t": now(),
                   "hostname": os.uname()[1], "ncpu": cpu[2] if cpu else os.cpu_count(),
                   "ifaces": self.ifaces, "python": sys.version.split()[0]})

    def baseline(self):
        self.prev = (time.monotonic(), read_cpu(self.root), read_net(self.root))
        self.cost_prev = self.own_cpu()

    def own_cpu(self):
        """CPU seconds we (all threads) and our nvidia-smi have used: what sampling costs."""
        return time.process_time() + (self.smi.cpu_seconds() if self.smi else 0.0)

    def sample(self):
        mono = time.monotonic()
        cpu, net = read_cpu(self.root), read_net(self.root)
        assert self.prev is not None
        pmono, pcpu, pnet = self.prev
        dt = max(1e-6, mono - pmono)
        msg = {"type": MSG_SAMPLE, "t": round(now(), 3), "dt": round(dt, 3)}
        if cpu and pcpu and cpu[1] > pcpu[1]:
            msg["cpu_pct"] = round(100.0 * (cpu[0] - pcpu[0]) / (cpu[1] - pcpu[1]), 1)
        else:
            msg["cpu_pct"] = None
        msg["ncpu"] = cpu[2] if cpu else None
        msg["load"] = read_load(self.root)
        mem = read_mem(self.root)
        msg["mem_used"], msg["mem_total"] = mem if mem else (None, None)
        msg["net"] = None
        for name in self.ifaces:
            if name in net and name in pnet:
                rx, tx = net[name][0] - pnet[name][0], net[name][1] - pnet[name][1]
                msg["net"] = {"iface": name, "rx_bps": max(0, int(rx / dt)),
                              "tx_bps": max(0, int(tx / dt))}
                break
        if msg["net"] is None and self.ifaces:
            msg["net"] = {"iface": self.ifaces[0], "rx_bps": None, "tx_bps": None}
        self.gpus_into(msg)
        if self.ranks is not None:
            msg["ranks"] = self.ranks.sample()
        self.prev = (mono, cpu, net)
        cost = self.own_cpu()
        msg["self_cpu_ms"] = round((cost - self.cost_prev) * 1000.0, 2)
        self.cost_prev = cost
        self.emit(msg)

    def gpus_into(self, msg):
        msg["gpus"], msg["gpu_source"], msg["gpu_error"] = [], None, None
        smi = self.smi
        if smi is not None and not smi.missing:
            msg["gpu_source"] = "nvidia-smi"
            if smi.gpus is not None:
                msg["gpus"] = smi.gpus
                msg["gpu_age"] = round(now() - smi.t, 2)
            msg["gpu_error"] = smi.error
            return
        if self.amd:
            gpus = read_amdgpus(self.root)
            if gpus:
                msg["gpus"], msg["gpu_source"] = gpus, "amdgpu"

    def on_input(self):
        try:
            chunk = os.read(self.in_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.done = True  # the launcher closed the channel
            return
        self.last_input = now()
        self.feed(chunk)

    def feed(self, chunk):
        self.inbuf += chunk
        while b"\n" in self.inbuf:
            line, self.inbuf = self.inbuf.split(b"\n", 1)
            try:
                msg = from_json(line)
            except ValueError:
                continue
            op = msg.get("op") if isinstance(msg, dict) else None
            if op == "stop":
                self.done = True
            elif op == "interval":
                try:
                    self.set_interval(float(msg["s"]))
                except (KeyError, TypeError, ValueError):
                    pass

    def set_interval(self, seconds):
        self.interval = max(0.1, seconds)
        self.due = min(self.due, time.monotonic() + self.interval)
        if self.smi is not None and self.smi.proc is not None:
            self.smi.stop()
            self.smi.interval = self.interval
            self.smi.start()
        elif self.smi is not None:
            self.smi.interval = self.interval

    def watchdog(self):
        """No line from the launcher for hb_timeout (a cut network, a stuck write): leave."""
        while not self.done:
            time.sleep(min(1.0, self.hb_timeout / 4))
            if now() - self.last_input > self.hb_timeout:
                if self.smi is not None:
                    self.smi.stop()
                os._exit(3)

    def run(self):
        if self.smi is not None:
            self.smi.start()
        self.hello()
        self.baseline()
        if self.hb_timeout > 0:
            import _thread

            _thread.start_new_thread(self.watchdog, ())
        if self.inbuf:  # control lines that came with the parameters
            self.inbuf, rest = b"", self.inbuf
            self.feed(rest)
        start = time.monotonic()
        self.due = start + self.first
        waited_gpu = False
        try:
            while not self.done:
                fds = [self.in_fd]
                smi_fd = self.smi.fileno() if self.smi is not None else None
                if smi_fd is not None:
                    fds.append(smi_fd)
                timeout = max(0.0, self.due - time.monotonic())
                ready, _, _ = select.select(fds, [], [], timeout)
                for fd in ready:
                    if fd == self.in_fd:
                        self.on_input()
                    elif self.smi is not None and fd == smi_fd:
                        self.smi.on_readable()
                smi = self.smi
                if smi is not None and smi.proc is None and not smi.missing \
                        and now() >= smi.retry_at:
                    smi.start()
                mono = time.monotonic()
                if mono < self.due or self.done:
                    continue
                if not waited_gpu and smi is not None and smi.proc is not None \
                        and smi.gpus is None and mono < start + self.first + self.gpu_wait:
                    continue  # the first sample waits (a little) for the first GPU reading
                waited_gpu = True
                self.sample()
                self.due += self.interval
                if self.due < mono:
                    self.due = mono + self.interval  # we were late: skip, never burst
        finally:
            if self.smi is not None:
                self.smi.stop()
        return 0


def read_params(fd=0):
    """The parameters line, and whatever came after it in the same read."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    return from_json(line or b"{}"), rest




def main():
    params, rest = read_params(0)
    set_title("dtrain sampler %s" % os.uname().nodename, "dtrain-sampler")
    sampler = Sampler(params)
    sampler.inbuf = rest
    try:
        code = sampler.run()
    except BrokenPipeError:
        code = 0  # the launcher went away mid-write
    os._exit(code)


if __name__ == "__main__":
    main()
