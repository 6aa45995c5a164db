"""`bench node`'s exec throughput with a native load generator: wrk (Debian's `wrk`) posting
`exec true` over keep-alive connections, round robin over N environments.

Why beside the SDK callers: on a 2-core node the Python SDK's httpx calls cost about as much
CPU per exec as the node itself, so 16 SDK threads on the same machine measure the two
together. wrk costs well under 0.1 ms of CPU per request, so its figure is the node's (an RL
trainer's rollout workers run on other machines). Every request is checked: wrk counts non-2xx
answers and socket errors, and the node's own `execs_total` counter must have grown by at
least the requests wrk saw answered.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from rollstack.errors import InvalidRequest, RuntimeFailure

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.~+/=-]{1,512}$")
_RESULT = "ROLLSTACK_WRK"


def lua_script(env_ids: Sequence[str], token: str, argv: Sequence[str] = ("true",)) -> str:
    """The wrk script (pure): POST .../exec with `argv`, environments round robin, and a `done`
    hook printing one machine-readable line. Ids and token are checked, never quoted blindly."""
    if not env_ids:
        raise InvalidRequest("wrk needs at least one environment")
    for i in env_ids:
        if not _ID.match(i):
            raise InvalidRequest(f"environment id not usable in a wrk script: {i!r}")
    if not _TOKEN.match(token):
        raise InvalidRequest("token not usable in a wrk script")
    ids = ", ".join(json.dumps(i) for i in env_ids)
    body = json.dumps({"argv": list(argv)}).replace("\\", "\\\\").replace("'", "\\'")
    return f"""local ids = {{{ids}}}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
wrk.body = '{body}'
request = function()
  i = i % #ids + 1
  return wrk.format(nil, "/v1/environments/" .. ids[i] .. "/exec")
end
done = function(s, lat, req)
  local e = s.errors
  io.write(string.format("{_RESULT} %d %d %d %d %d %d %d\\n", s.requests, s.duration, e.status,
    e.connect + e.read + e.write + e.timeout, lat:percentile(50), lat:percentile(99), lat.max))
end
"""


def parse_result(stdout: str) -> dict[str, Any]:
    """wrk's output -> requests, seconds, errors, latency percentiles (pure)."""
    for line in stdout.splitlines():
        if line.startswith(_RESULT + " "):
            parts = line.split()[1:]
            if len(parts) != 7 or not all(p.isdigit() for p in parts):
                break
            n, dur_us, status, sock, p50, p99, mx = (int(p) for p in parts)
            seconds = dur_us / 1e6
            return {"requests": n, "seconds": round(seconds, 3),
                    "execs_per_s": round(n / seconds, 1) if seconds > 0 else 0.0,
                    "non_2xx": status, "socket_errors": sock,
                    "p50": p50 / 1e6, "p99": p99 / 1e6, "max": mx / 1e6}
    raise RuntimeFailure(f"wrk printed no result line: {stdout[-500:]!r}")


def measure(url: str, token: str, env_ids: Sequence[str], connections: int, seconds: float,
            node_pids: Sequence[int], execs_counter: Any) -> dict[str, Any]:
    """Run wrk against the node at `url`; node CPU per exec from `node_pids`, and the node's
    exec counter (`execs_counter()` -> float) checked against wrk's count."""
    from rollstack_bench.node_common import _cpu

    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeFailure("wrk is not installed (scripts/setup-system.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="rs-wrk-") as tmp:
        script = Path(tmp) / "exec.lua"
        script.write_text(lua_script(env_ids, token))
        before, cpu0, t0 = execs_counter(), _cpu(node_pids), os.times()
        proc = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                               "--timeout", "10s", "-s", str(script), url],
                              capture_output=True, text=True, timeout=seconds + 60)
        t1, cpu = os.times(), _cpu(node_pids) - cpu0
        counted = execs_counter() - before
    if proc.returncode != 0:
        raise RuntimeFailure(f"wrk failed ({proc.returncode}): {proc.stderr[-500:]}")
    doc = parse_result(proc.stdout)
    n = max(1, doc["requests"])
    doc.update(connections=connections, environments=len(env_ids),
               node_cpu_per_exec_s=round(cpu / n, 6),
               client_cpu_per_exec_s=round((t1.children_user + t1.children_system
                                            - t0.children_user - t0.children_system) / n, 6),
               node_execs_counted=int(counted))
    doc["failures"] = doc["non_2xx"] + doc["socket_errors"] + max(0, doc["requests"] - int(counted))
    return doc
