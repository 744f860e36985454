"""The fake-GPU trap: some nodes have an ``nvidia-smi`` on PATH that prints fixed readings.

Nodes 4, 6, 8, ... (``is_gpu_node``) get ``<state>/node<k>/gpubin/nvidia-smi`` bind-mounted
(the directory) over ``/usr/games`` inside the node's mount namespace: that directory is on
the default PATH sshd gives a session (``/usr/local/bin:/usr/bin:/bin:/usr/games``) and empty
on Debian, so nothing else is hidden. Nodes 1-3 keep no nvidia-smi at all (the first-hour
tests expect ``nvidia-smi: command not found`` there), so a view must show them CPU only.

The fake answers what dtrain's sampler asks (``--query-gpu=F,... --format=csv,noheader,
nounits [-lms N | -l N]``) and ``-L``, field by field from ``FAKE_GPUS``, and refuses an
unknown field as the real one does (``Field "x" is not a valid field to query.``, exit 2).
It also prints ``-q`` (the health sections), and a test changes one node's readings with
``~/.fake-nvidia-smi.json`` in its home (``{"1": {"remapped_rows.pending": "Yes"}}``). A
fake ``dcgmi`` sits beside it (``_DCGMI``: DCGM's diag JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

MOUNT_POINT = "/usr/games"

# the NVLink fabric fields of a GPU that has none (an H100 HGX): a test gives a node an
# NVLink domain with ~/.fake-nvidia-smi.json, and the IMEX mark that makes the probe ask
# (imex_config)
NO_FABRIC = {"fabric.state": "N/A", "fabric.status": "N/A", "fabric.clusterUuid": "N/A",
             "fabric.cliqueId": "N/A"}

# what every GPU node's fake prints: two GPUs, fixed readings (tests compare them exactly)
FAKE_GPUS: tuple[dict[str, object], ...] = (
    {"index": 0, "name": "NVIDIA H100 80GB HBM3",
     "uuid": "GPU-00000000-0000-0000-0000-0000000000a0",
     "utilization.gpu": 37, "memory.used": 1024, "memory.total": 81559, "temperature.gpu": 41,
     "power.draw": 123.45, "power.limit": 700.00,
     "ecc.errors.uncorrected.volatile.total": 0, "remapped_rows.pending": "No",
     "remapped_rows.failure": "No", "retired_pages.pending": "No",
     "clocks_event_reasons.hw_slowdown": "Not Active", **NO_FABRIC},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3",
     "uuid": "GPU-00000000-0000-0000-0000-0000000000a1",
     "utilization.gpu": 81, "memory.used": 40960, "memory.total": 81559, "temperature.gpu": 45,
     "power.draw": 456.70, "power.limit": 700.00,
     "ecc.errors.uncorrected.volatile.total": 0, "remapped_rows.pending": "No",
     "remapped_rows.failure": "No", "retired_pages.pending": "No",
     "clocks_event_reasons.hw_slowdown": "Not Active", **NO_FABRIC},
)

_SCRIPT = '''#!/usr/bin/python3 -I
"""Fake nvidia-smi of the dtrain test cluster (tests/cluster/gpus.py): fixed readings."""
import json, os, sys, time
GPUS = {gpus}
# a test's readings for this node (~/.fake-nvidia-smi.json): per GPU index, fields
try:
    with open(os.path.expanduser("~/.fake-nvidia-smi.json")) as f:
        OVERRIDE = json.load(f)
except (OSError, ValueError):
    OVERRIDE = {{}}
for g in GPUS:
    g.update(OVERRIDE.get(str(g["index"]), {{}}))
args = sys.argv[1:]
if args == ["-q"]:
    print("==============NVSMI LOG==============")
    print("Attached GPUs                             : %d" % len(GPUS))
    for g in GPUS:
        print("GPU 00000000:%02X:00.0" % (0x18 + g["index"]))
        print("    Product Name                          : %s" % g["name"])
        print("    Clocks Event Reasons")
        print("        HW Slowdown                       : %s"
              % g["clocks_event_reasons.hw_slowdown"])
        print("    ECC Errors")
        print("        Volatile")
        print("            DRAM Uncorrectable            : %s"
              % g["ecc.errors.uncorrected.volatile.total"])
        print("    Retired Pages")
        print("        Pending Page Blacklist            : %s" % g["retired_pages.pending"])
        print("    Remapped Rows")
        print("        Pending                           : %s" % g["remapped_rows.pending"])
        print("        Remapping Failure Occurred        : %s" % g["remapped_rows.failure"])
        print("    Temperature")
        print("        GPU Current Temp                  : %s C" % g["temperature.gpu"])
    sys.exit(0)
query, fmt, loop = None, "csv", None
i = 0
while i < len(args):
    a = args[i]
    if a in ("-i", "--id") and i + 1 < len(args):
        GPUS = [g for g in GPUS if str(g["index"]) == args[i + 1]]
        if not GPUS:
            print("No devices were found")
            sys.exit(6)
        i += 1
    elif a.startswith("--query-gpu="):
        query = a.split("=", 1)[1].split(",")
    elif a.startswith("--format="):
        fmt = a.split("=", 1)[1]
    elif a in ("-lms", "-l") and i + 1 < len(args):
        loop = float(args[i + 1]) / (1000.0 if a == "-lms" else 1.0)
        i += 1
    elif a == "-L":
        for g in GPUS:
            print("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
        sys.exit(0)
    i += 1
if query is None:
    print("fake nvidia-smi: only --query-gpu and -L are answered")
    sys.exit(0)
for f in query:
    if f != "count" and f not in GPUS[0]:
        print('Field "%s" is not a valid field to query.' % f)
        sys.exit(2)
units = "nounits" in fmt
def value(g, f):
    v = len(GPUS) if f == "count" else g[f]
    if isinstance(v, float):
        v = "%.2f" % v
    if not units and f.startswith("memory."):
        return "%s MiB" % v
    if not units and f.startswith("power."):
        return "%s W" % v
    if not units and f == "utilization.gpu":
        return "%s %%" % v
    return str(v)
try:
    while True:
        if "noheader" not in fmt:
            print(", ".join(query))
        for g in GPUS:
            print(", ".join(value(g, f) for f in query))
        sys.stdout.flush()
        if loop is None:
            break
        time.sleep(loop)
except (BrokenPipeError, KeyboardInterrupt):
    sys.exit(0)
'''


# the fake dcgmi (same directory): `dcgmi diag -r N -j` prints DCGM's diag JSON (the
# "DCGM GPU Diagnostic" document of DCGM 3.x); every test PASS unless ~/.fake-dcgmi.json
# names failures: {"Hardware/GPU Memory": {"1": "FAIL"}}
_DCGMI = '''#!/usr/bin/python3 -I
"""Fake dcgmi of the dtrain test cluster (tests/cluster/gpus.py)."""
import json, os, sys
args = sys.argv[1:]
if args[:1] != ["diag"] or "-r" not in args:
    print("fake dcgmi: only `diag -r N [-j]` is answered")
    sys.exit(1)
try:
    with open(os.path.expanduser("~/.fake-dcgmi.json")) as f:
        FAIL = json.load(f)
except (OSError, ValueError):
    FAIL = {}
TESTS = [("Deployment", "Denylist"), ("Deployment", "NVML Library"),
         ("Deployment", "CUDA Main Library"), ("Hardware", "GPU Memory"),
         ("Integration", "PCIe"), ("Stress", "SM Stress")]
level = int(args[args.index("-r") + 1])
cats = {}
for cat, name in TESTS[:3 + level]:
    bad = FAIL.get(cat + "/" + name, {})
    if cat == "Deployment":
        results = [{"gpu_ids": "0,1", "status": "PASS"}]
    else:
        results = [dict({"gpu_ids": str(i), "status": bad.get(str(i), "PASS")},
                        **({"warnings": [{"warning": "fake %s failure on GPU %d" % (name, i),
                                          "error_id": 68}]} if str(i) in bad else {}))
                   for i in (0, 1)]
    cats.setdefault(cat, []).append({"name": name, "results": results})
doc = {"DCGM GPU Diagnostic": {"version": "3.3.5", "test_categories": [
    {"category": c, "tests": t} for c, t in cats.items()]}}
print(json.dumps(doc, indent=1) if "-j" in args else doc)
sys.exit(226 if FAIL else 0)
'''


def is_gpu_node(k: int) -> bool:
    """Nodes 4, 6, 8, ...: the ones with the fake nvidia-smi."""
    return k >= 4 and k % 2 == 0


def script_text() -> str:
    """The fake's source (its readings embedded)."""
    return _SCRIPT.format(gpus=json.dumps(list(FAKE_GPUS)))


def _mounted(pid: int, where: str = MOUNT_POINT) -> bool:
    try:
        text = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False
    return any(line.split()[4] == where for line in text.splitlines()
               if len(line.split()) > 4)


# the IMEX daemon's directory (nodeside/probe.IMEX_MARKS): on every GPU node its own
# ``<node dir>/imex`` is bind-mounted there, empty; a test writes nodes_config.cfg into it
# (``imex_config``) to make that node a multi-node NVLink machine, whose probe then asks
# nvidia-smi for its fabric. The mount point is made on this machine once, empty: this
# machine itself stays no IMEX machine.
IMEX_DIR = "/etc/nvidia-imex"


def imex_config(node_dir: Path) -> Path:
    """The host path of a GPU node's /etc/nvidia-imex/nodes_config.cfg."""
    return node_dir / "imex" / "nodes_config.cfg"


def ensure(nodes: Iterable[tuple[int, Path, int | None]]) -> None:
    """Install the fake on every GPU node: ``(k, node dir, sshd pid)``; idempotent."""
    text = script_text()
    for k, node_dir, pid in nodes:
        if not is_gpu_node(k) or pid is None:
            continue
        gpubin = node_dir / "gpubin"
        gpubin.mkdir(mode=0o755, exist_ok=True)
        os.chmod(gpubin, 0o755)
        fake = gpubin / "nvidia-smi"
        if not fake.exists() or fake.read_text() != text:
            tmp = gpubin / ".nvidia-smi.tmp"
            tmp.write_text(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, fake)
        dcgmi = gpubin / "dcgmi"
        if not dcgmi.exists() or dcgmi.read_text() != _DCGMI:
            tmp = gpubin / ".dcgmi.tmp"
            tmp.write_text(_DCGMI)
            os.chmod(tmp, 0o755)
            os.replace(tmp, dcgmi)
        if not _mounted(pid):
            subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "--bind", str(gpubin),
                            MOUNT_POINT], check=True, capture_output=True)
        imex = node_dir / "imex"
        imex.mkdir(mode=0o755, exist_ok=True)
        os.makedirs(IMEX_DIR, mode=0o755, exist_ok=True)
        if not _mounted(pid, IMEX_DIR):
            subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "--bind", str(imex),
                            IMEX_DIR], check=True, capture_output=True)
