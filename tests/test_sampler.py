"""The node sampler (nodeside/sampler.py): readers on fake trees, and the real program with a
fake nvidia-smi on PATH: its samples, its exit on EOF and on silence, and that nothing of it
(nvidia-smi included) outlives it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launcher.nodeside import sampler
from tests.cluster import gpus as fake_gpus
from tests.util import node_program
from tests.util import write_under as write

SAMPLER = node_program("sampler")  # the bundle the nodes get

STAT = """cpu  100 0 50 800 50 0 0 0 0 0
cpu0 50 0 25 400 25 0 0 0 0 0
cpu1 50 0 25 400 25 0 0 0 0 0
intr 1
"""
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\n"
NETDEV = ("Inter-|   Receive                            |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
          "    lo:     100       1    0    0    0     0          0         0      100       1"
          "    0    0    0     0       0          0\n"
          "ens1f0: 5000 10 0 0 0 0 0 0 7000 12 0 0 0 0 0 0\n")
ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ens1f0\t000012C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth9\t00000000\t010012C6\t0003\t0\t0\t0\t00000000\t0\t0\t0
"""



def test_host_readers_on_a_fake_proc(tmp_path: Path) -> None:
    write(tmp_path, "/proc/stat", STAT)
    write(tmp_path, "/proc/loadavg", "1.50 0.75 0.25 2/300 4242\n")
    write(tmp_path, "/proc/meminfo", MEMINFO)
    write(tmp_path, "/proc/net/dev", NETDEV)
    root = str(tmp_path)
    assert sampler.read_cpu(root) == (150, 1000, 2)  # busy = all but idle + iowait
    assert sampler.read_load(root) == [1.5, 0.75, 0.25]
    assert sampler.read_mem(root) == ((16000000 - 4000000) * 1024, 16000000 * 1024)
    assert sampler.read_net(root) == {"lo": (100, 100), "ens1f0": (5000, 7000)}
    assert sampler.read_cpu(str(tmp_path / "missing")) is None


def test_the_interface_towards_the_launcher_from_the_route_table(tmp_path: Path) -> None:
    write(tmp_path, "/proc/net/route", ROUTE)
    root = str(tmp_path)
    assert sampler.route_iface("198.18.0.1", root) == "ens1f0"  # /24 beats the default route
    assert sampler.route_iface("172.17.3.4", root) == "docker0"
    assert sampler.route_iface("10.0.0.1", root) == "eth9"  # only the default route holds it
    env = {"SSH_CONNECTION": "198.18.0.1 40000 198.18.0.11 22"}
    assert sampler.default_ifaces(root, env) == ["ens1f0"]
    assert sampler.default_ifaces(root, {}) == ["eth9"]


def test_nvidia_smi_lines() -> None:
    count, gpu = sampler.parse_smi_line(
        "8, 3, 97, 71234, 81559, 66, 612.34, 700.00, NVIDIA H100 80GB HBM3")
    assert count == 8
    assert gpu == {"index": 3, "name": "NVIDIA H100 80GB HBM3", "util_pct": 97,
                   "mem_used_mib": 71234, "mem_total_mib": 81559, "temp_c": 66,
                   "power_w": 612.34, "power_limit_w": 700}
    _, na = sampler.parse_smi_line("1, 0, [N/A], 0, 16384, 40, [Not Supported], "
                                   "[Not Supported], Tesla T4, rev, b")
    assert na["util_pct"] is None and na["power_w"] is None and na["name"] == "Tesla T4, rev, b"
    assert sampler.parse_smi_line("No devices were found") is None


def test_amdgpu_from_sysfs(tmp_path: Path) -> None:
    dev = "/sys/class/drm/card1/device"
    write(tmp_path, f"{dev}/vendor", "0x1002\n")
    write(tmp_path, f"{dev}/gpu_busy_percent", "64\n")
    write(tmp_path, f"{dev}/mem_info_vram_used", str(2048 * 1048576))
    write(tmp_path, f"{dev}/mem_info_vram_total", str(65536 * 1048576))
    write(tmp_path, f"{dev}/hwmon/hwmon3/temp1_input", "52000\n")
    write(tmp_path, f"{dev}/hwmon/hwmon3/power1_average", "215000000\n")
    write(tmp_path, f"{dev}/hwmon/hwmon3/power1_cap", "560000000\n")
    write(tmp_path, "/sys/class/drm/card0/device/vendor", "0x8086\n")  # an Intel iGPU: not ours
    assert sampler.read_amdgpus(str(tmp_path)) == [
        {"index": 0, "name": "amdgpu card1", "util_pct": 64, "mem_used_mib": 2048,
         "mem_total_mib": 65536, "temp_c": 52, "power_w": 215, "power_limit_w": 560}]


def fake_process(root: Path, pid: int, env: dict[str, str], ticks: int, start: int = 1000,
                 state: str = "S") -> None:
    fields = [state] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 6 + [str(start)] + ["0"] * 10
    write(root, f"/proc/{pid}/stat", f"{pid} (python3) " + " ".join(fields) + "\n")
    write(root, f"/proc/{pid}/environ",
          b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def test_ranks_are_found_by_their_environment_and_their_cpu_never_goes_back(
        tmp_path: Path) -> None:
    run = {"DTRAIN_RUN_ID": "r1"}
    fake_process(tmp_path, 10, {**run, "RANK": "4"}, 100)  # the shim
    fake_process(tmp_path, 11, {**run, "RANK": "4"}, 500, state="R")  # the worker
    fake_process(tmp_path, 12, {**run, "RANK": "5"}, 300)
    fake_process(tmp_path, 13, {"DTRAIN_RUN_ID": "other", "RANK": "4"}, 900)  # another run
    fake_process(tmp_path, 14, {**run}, 700)  # torchrun's agent: no RANK
    ranks = sampler.Ranks("r1", None, str(tmp_path), uid=os.getuid())
    tck = sampler.CLK_TCK
    first = ranks.sample()
    assert first == {"4": {"cpu": round(600 / tck, 3), "pids": 2, "state": "R"},
                     "5": {"cpu": round(300 / tck, 3), "pids": 1, "state": "S"}}
    fake_process(tmp_path, 11, {**run, "RANK": "4"}, 550)
    (tmp_path / "proc/10/stat").unlink()  # the shim's child exits: its CPU stays counted
    second = ranks.sample()
    assert second["4"] == {"cpu": round(650 / tck, 3), "pids": 1, "state": "S"}
    only5 = sampler.Ranks("r1", [5], str(tmp_path), uid=os.getuid()).sample()
    assert list(only5) == ["5"]


def test_a_rank_s_worker_started_after_its_shim_is_found_at_the_next_sample(
        tmp_path: Path) -> None:
    """The first scan may see the rank's shim alone (every wanted rank is then 'found'); its
    worker, started a moment later, must be counted at the next sample, not RESCAN_S later
    (its CPU would be missing meanwhile, and the other nodes would look like stragglers)."""
    run = {"DTRAIN_RUN_ID": "r1"}
    fake_process(tmp_path, 10, {**run, "RANK": "0"}, 10)  # the shim, alone
    ranks = sampler.Ranks("r1", [0], str(tmp_path), uid=os.getuid())
    tck = sampler.CLK_TCK
    assert ranks.sample()["0"]["pids"] == 1
    fake_process(tmp_path, 11, {**run, "RANK": "0"}, 400, state="R")  # the worker
    assert ranks.sample()["0"] == {"cpu": round(410 / tck, 3), "pids": 2, "state": "R"}
    fake_process(tmp_path, 12, {**run, "RANK": "0"}, 50)  # a dataloader: found too
    assert ranks.sample()["0"]["pids"] == 3
    assert ranks.sample()["0"]["pids"] == 3  # a scan that found nothing new ...
    fake_process(tmp_path, 13, {**run, "RANK": "0"}, 50)
    assert ranks.sample()["0"]["pids"] == 3  # ... and the next waits for RESCAN_S again


def fake_path(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(fake_gpus.script_text())
    fake.chmod(0o755)
    return bin_dir


def start(params: dict[str, Any], path: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-u", "-I", "-S", str(SAMPLER)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PATH": path})
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"mode": "sample", **params}).encode() + b"\n")
    proc.stdin.flush()
    return proc


def read_msg(proc: subprocess.Popen[bytes], timeout: float = 30) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no line from the sampler"
    line = proc.stdout.readline()
    assert line, f"the sampler ended: {proc.stderr.read() if proc.stderr else b''!r}"
    msg: dict[str, Any] = json.loads(line)
    return msg


def smi_children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"nvidia-smi" in cmd:
            out.append(int(name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_for(cond: Any, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_the_sampler_reports_the_fake_gpus_exactly_and_leaves_at_eof(tmp_path: Path) -> None:
    proc = start({"interval": 0.3, "first": 0.1, "hb_timeout": 0},
                 f"{fake_path(tmp_path)}:/usr/bin:/bin")
    try:
        hello = read_msg(proc)
        assert hello["type"] == "hello" and hello["v"] == sampler.SAMPLER_VERSION
        sample = read_msg(proc)
        deadline = time.monotonic() + 30
        while not sample["gpus"] and time.monotonic() < deadline:  # nvidia-smi's first batch
            sample = read_msg(proc)
        assert sample["type"] == "sample" and sample["gpu_source"] == "nvidia-smi"
        assert sample["gpu_error"] is None
        assert sample["gpus"] == [
            {"index": g["index"], "name": g["name"], "util_pct": g["utilization.gpu"],
             "mem_used_mib": g["memory.used"], "mem_total_mib": g["memory.total"],
             "temp_c": g["temperature.gpu"], "power_w": g["power.draw"],
             "power_limit_w": g["power.limit"]} for g in fake_gpus.FAKE_GPUS]
        assert 0 <= sample["cpu_pct"] <= 100 and sample["mem_total"] > 0
        assert sample["self_cpu_ms"] >= 0
        smi = smi_children(proc.pid)
        assert len(smi) == 1
        assert proc.stdin is not None
        proc.stdin.close()  # the launcher's channel closes
        assert proc.wait(timeout=20) == 0
        assert wait_for(lambda: not alive(smi[0])), "nvidia-smi outlived the sampler"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_sampler_leaves_no_nvidia_smi_behind(tmp_path: Path) -> None:
    """kill -9 (no cleanup at all): nvidia-smi's next write fails and it dies of SIGPIPE."""
    proc = start({"interval": 0.2, "first": 0.1, "hb_timeout": 0},
                 f"{fake_path(tmp_path)}:/usr/bin:/bin")
    try:
        read_msg(proc)
        read_msg(proc)
        smi = smi_children(proc.pid)
        assert len(smi) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        assert wait_for(lambda: not alive(smi[0])), "nvidia-smi outlived a killed sampler"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_heartbeat_and_the_sampler_leaves_by_itself(tmp_path: Path) -> None:
    """A cut network: no EOF ever comes, only silence; after hb_timeout it exits (3)."""
    proc = start({"interval": 0.2, "first": 0.1, "hb_timeout": 1.0}, "/usr/bin:/bin")
    try:
        read_msg(proc)
        assert proc.wait(timeout=20) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_nvidia_smi_the_node_is_cpu_only_and_control_lines_work(tmp_path: Path) -> None:
    proc = start({"interval": 120.0, "first": 0.1, "hb_timeout": 0, "gpu": True},
                 str(tmp_path))  # nothing on PATH
    try:
        read_msg(proc)
        sample = read_msg(proc)
        assert sample["gpus"] == [] and sample["gpu_source"] is None
        assert sample["gpu_error"] is None
        assert proc.stdin is not None
        proc.stdin.write(b'{"op":"interval","s":0.2}\n')  # faster from now on
        proc.stdin.flush()
        read_msg(proc, timeout=60)  # the old interval would take 120 s
        proc.stdin.write(b'{"op":"stop"}\n')
        proc.stdin.flush()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_sampler_imports_nothing_heavy(tmp_path: Path) -> None:
    """Every `top` and every run's samplers start one sampler per node: it reads its lines
    with json's C scanner, writes with nodecommon.to_json and starts nvidia-smi with
    nodeprocs.spawn, so json, re and subprocess (~12 ms of CPU per node) stay out."""
    from tests.test_supervisor_lean import HEAVY, _imported

    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-u", "-I", "-S",
                             str(SAMPLER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={"PATH": f"{fake_path(tmp_path)}:/usr/bin:/bin"})
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(json.dumps({"mode": "sample", "interval": 0.3, "first": 0.1,
                                 "hb_timeout": 0}).encode() + b"\n")
    proc.stdin.flush()
    try:
        assert read_msg(proc)["type"] == "hello"
        deadline = time.monotonic() + 30
        while not read_msg(proc)["gpus"]:  # through nvidia-smi's first batch
            assert time.monotonic() < deadline
        proc.stdin.write(b'{"op": "interval", "s": 0.5}\n')  # a control line, read too
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    imported = _imported(proc.stderr.read())
    assert "_json" in imported
    assert not imported & HEAVY, sorted(imported & HEAVY)
