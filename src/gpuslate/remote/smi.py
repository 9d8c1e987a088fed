"""``status`` on a host without gpuslate: ``nvidia-smi``'s CSV made into a status document.

The document has the ``gpuslate.status.v1`` shape so it renders like any
other, and says where it came from: ``"source": "nvidia-smi"``, a warning,
and process fields nvidia-smi cannot give (user, process tree) left null.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from .._time import iso_time

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu",
              "power.draw", "power.limit", "pstate", "driver_version")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
SEPARATOR = "--- gpuslate: compute apps ---"
MiB = 1024**2


def smi_words() -> list[str]:
    """The GPU query; the caller runs it, then a :data:`SEPARATOR` line, then the apps query."""
    return ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]


def smi_apps_words() -> list[str]:
    return ["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"]


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _int(text: str) -> int | None:
    v = _num(text)
    return None if v is None else int(v)


def _mib(text: str) -> int | None:
    v = _num(text)
    return None if v is None else int(v * MiB)


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text)) if row and any(c.strip() for c in row)]


def status_from_smi(host: str, output: str, taken_at: float, warning: str) -> dict[str, Any]:
    """The status document of ``nvidia-smi`` query output (GPU rows, the marker, app rows)."""
    gpu_text, _, app_text = output.partition(SEPARATOR)
    apps: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(app_text):
        if len(row) < len(APP_FIELDS):
            continue
        uuid, pid, used, name = row[:4]
        if not pid.isdigit():
            continue
        apps.setdefault(uuid, []).append({
            "pid": int(pid), "start_ticks": None, "kind": "compute", "used_memory": _mib(used), "user": None,
            "uid": None, "name": name, "command": name, "started": None, "ppid": None, "pgid": None, "sid": None,
            "root_pid": int(pid), "state": None, "container": None, "cgroup": None, "visible": True})
    gpus: list[dict[str, Any]] = []
    driver = None
    for row in _rows(gpu_text):
        if len(row) < len(GPU_FIELDS):
            continue
        f = dict(zip(GPU_FIELDS, row))
        index = _int(f["index"])
        if index is None:
            continue
        driver = driver or f["driver_version"]
        mem_used, mem_total = _mib(f["memory.used"]), _mib(f["memory.total"])
        memory = None if mem_used is None or mem_total is None else \
            {"total": mem_total, "used": mem_used, "reserved": 0, "free": max(0, mem_total - mem_used)}
        power, limit = _num(f["power.draw"]), _num(f["power.limit"])
        gpus.append({
            "index": index, "uuid": f["uuid"], "name": f["name"], "memory": memory,
            "utilization_pct": _int(f["utilization.gpu"]), "temperature_c": _int(f["temperature.gpu"]),
            "power_w": power, "power_limit_w": limit, "pstate": f["pstate"] or None,
            "error": None if memory is not None else "memory not reported by nvidia-smi",
            "processes": apps.get(f["uuid"], [])})
    return {"schema": "gpuslate.status.v1", "source": "nvidia-smi", "host": host, "backend": "nvidia-smi",
            "driver_version": driver, "taken_at": iso_time(taken_at), "gpus": gpus, "host_processes": [],
            "warnings": [warning]}
