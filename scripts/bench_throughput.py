"""``make bench-throughput``: the whole suite through the running compose stack, against PyBench's own way.

One invocation, on the same recordings and the same machine:

1. **the service**, twice: every task of the suite submitted to the running stack against the replay model
   (``replay``), once answering at once and once taking ``--latency`` seconds per answer (the replay service is
   restarted with ``PBE_REPLAY_LATENCY_S``); each evaluation runs with ``max_concurrency`` ``--max-concurrency``;
2. **the baseline**, twice (the same two latencies): ``scripts/baseline_harness.py``, which runs the recorded
   code cells the way PyBench's harness does (a kernel per task in-process, 16 threads, no isolation, a
   temporary folder per task), in a fresh throwaway virtual environment each time (the recordings run
   ``pip uninstall -y numpy``), in a network namespace of its own with only loopback, as an unprivileged user,
   with the service's per-cell time limit.

What it measures for the service: wall time from submission to the last verdict; the most sessions running at
once (the evaluation's progress, polled each second); the CPU every container used (the Docker cgroup's
``cpuacct.usage``, which keeps the time of containers already removed) plus the engine's own (dockerd,
containerd), less the cells' own CPU (each cell's ``cpu_s`` from the stored trajectories), per task, and the
same from the whole machine's busy time (``/proc/stat``: also what runs outside the containers and the engine,
the storage driver's and containerd's shims, runc, the kernel's own network namespace work; read it on an
otherwise idle machine), split by component (``CpuLedger``: sandboxes, the stack's containers, fuse-overlayfs, the
engine, the rest); the
memory of all containers (usage less inactive file cache, sampled each second), and the executors' own per
session in flight. It prints a table, then one JSON line.

Needs root (cgroup files, the artifact volume, ``unshare``), the stack up (``make up``) and ``PBE_ADMIN_KEY``.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.client import GatewayClient  # noqa: E402
from scripts.bench_lifecycle import machine_cpu_s  # noqa: E402
from services.pybench.extraction import extract_code  # noqa: E402
from services.pybench.recordings import read_recordings  # noqa: E402
from services.pybench.suite import Suite, load_suite  # noqa: E402
from services.store import ArtifactStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ["docker", "compose", "-p", "pybench-eval"]
CGROUP = Path("/sys/fs/cgroup")
MAX_TURNS = 10
CELL_TIMEOUT_S = 120.0


def build_plan(suite: Suite) -> list[dict[str, Any]]:
    """The baseline's work: for each recorded task with its inputs, the cells the service's agent loop runs
    (the recorded replies' code up to the first reply without code, at most ``MAX_TURNS`` replies) and how many
    replies the model gives (one more, past the recording's end, when every recorded reply held code)."""
    plan = []
    for recording in read_recordings(suite.root / "trajectory.jsonl"):
        if recording.index is None or recording.index not in suite.tasks:
            continue
        task = suite.task(recording.index)
        if not task.available:
            continue
        cells: list[str] = []
        replies = 0
        for reply in recording.replies[:MAX_TURNS]:
            replies += 1
            code = extract_code(reply)
            if code is None:
                break
            cells.append(code)
        else:
            replies += 1 if replies < MAX_TURNS else 0
        inputs = [[str(suite.input_file(item.path)), item.path.lstrip("./")] for item in task.inputs]
        plan.append({"index": task.index, "inputs": inputs, "cells": cells, "replies": replies})
    return plan


# --- the service ------------------------------------------------------------------------------------------------


def set_replay_latency(latency_s: float) -> None:
    """Restart the stack's replay model so that each answer takes ``latency_s`` seconds."""
    env = {**os.environ, "PBE_REPLAY_LATENCY_S": str(latency_s)}
    subprocess.run([*COMPOSE, "up", "-d", "--no-deps", "--no-build", "--wait", "replay"], env=env, check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip


def engine_cpu_s() -> float:
    """CPU seconds of every container so far (removed ones included) and of the engine's own processes."""
    total = int((CGROUP / "cpuacct" / "docker" / "cpuacct.usage").read_text()) / 1e9
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in subprocess.run(["pgrep", "-x", "dockerd|containerd"], capture_output=True, text=True).stdout.split():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def container_memory_mb() -> dict[str, float]:
    """Memory in use by each running container (usage less inactive file cache), MiB, by full id."""
    found = {}
    for folder in (CGROUP / "memory" / "docker").glob("*/"):
        try:
            usage = int((folder / "memory.usage_in_bytes").read_text())
            stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        except (OSError, ValueError):
            continue
        found[folder.name] = (usage - int(stat.get("total_inactive_file", 0))) / 2**20
    return found


def executor_ids() -> set[str]:
    out = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", "label=com.docker.compose.service=executor"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return set(out.split())


def stack_ids() -> set[str]:
    """The compose stack's own containers (gateway, executors, graders, Redis, the replay model), by full id."""
    project = "label=com.docker.compose.project=pybench-eval"
    out = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", project],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return set(out.split())


HOST_DAEMONS = {"fuse-overlayfs": "fuse-overlayfs", "dockerd": "engine", "containerd": "engine",
                "containerd-shim": "engine"}  # fmt: skip
"""Processes outside every container whose CPU a run is charged with, by the component they are counted in."""


class CpuLedger:
    """Where the machine's CPU went during a run: the sandboxes (sessions', grading and warm ones: every container but
    the stack's own), the stack's containers, and the storage and engine daemons outside every container.

    The engine's parent cgroup keeps the time of containers already removed, so the sandboxes' share is exact: the
    parent's less the stack's containers (long-lived, read at every ``sample``). The daemons are read per process at
    every ``sample`` (what exits between two loses its last second; a container's fuse-overlayfs is idle when it goes).
    The machine's busy time less all of these is ``other``: short-lived processes on the host (runc, the engine's
    helpers), the kernel's own work, this benchmark.
    """

    def __init__(self, stack: set[str]) -> None:
        self.stack = stack
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.first = self._read()
        self.last = dict(self.first)
        self.machine_start = machine_cpu_s()

    def _read(self) -> dict[tuple[str, str], float]:
        docker = CGROUP / "cpuacct" / "docker"
        found = {("docker", "all"): int((docker / "cpuacct.usage").read_text()) / 1e9}
        for container in self.stack:
            with contextlib.suppress(OSError, ValueError):  # stopped meanwhile
                found[("stack", container)] = int((docker / container / "cpuacct.usage").read_text()) / 1e9
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm in HOST_DAEMONS:
                fields = stat.rsplit(")", 1)[1].split()
                found[(comm, f"{proc.name}:{fields[19]}")] = (int(fields[11]) + int(fields[12])) / self.ticks
        return found

    def sample(self) -> None:
        self.last.update(self._read())

    def components(self) -> dict[str, float]:
        """CPU seconds since the ledger was made: ``sandboxes``, ``stack``, ``fuse-overlayfs``, ``engine``,
        ``other``."""
        self.sample()
        spent = {"sandboxes": 0.0, "stack": 0.0, "fuse-overlayfs": 0.0, "engine": 0.0}
        for (kind, name), value in self.last.items():
            used = value - self.first.get((kind, name), 0.0)
            if kind == "docker":
                spent["sandboxes"] += used
            elif kind == "stack":
                spent["stack"] += used
                spent["sandboxes"] -= used
            else:
                spent[HOST_DAEMONS[kind]] += used
        spent["other"] = machine_cpu_s() - self.machine_start - sum(spent.values())
        return {name: round(value, 1) for name, value in spent.items()}


class Sampler(threading.Thread):
    """Each second: the evaluation's running sessions, all containers' memory, the executors' memory."""

    def __init__(self, client: GatewayClient, evaluation_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.evaluation_id = client, evaluation_id
        self.executors = executor_ids()
        self.ledger = CpuLedger(stack_ids())
        self.stop = threading.Event()
        self.peak_running = 0
        self.peak_memory_mb = 0.0
        self.executor_mb_at_peak = 0.0
        self.view: dict[str, Any] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.view = self.client.evaluation(self.evaluation_id)
            except Exception:  # a 429 or a slow answer: the next second asks again
                continue
            self.ledger.sample()
            running = int(self.view["progress"]["counts"].get("running", 0))
            memory = container_memory_mb()
            self.peak_memory_mb = max(self.peak_memory_mb, sum(memory.values()))
            if running >= self.peak_running:
                self.peak_running = running
                self.executor_mb_at_peak = sum(mb for cid, mb in memory.items() if cid in self.executors)


def artifact_store() -> ArtifactStore:
    out = subprocess.run(["docker", "volume", "inspect", "pybench-eval_artifacts", "-f", "{{.Mountpoint}}"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return ArtifactStore(Path(out))


def run_service(client: GatewayClient, tasks: list[int], max_concurrency: int, timeout_s: float) -> dict[str, Any]:
    """Submit every task, wait for the last verdict, and measure."""
    idle_executor_mb = sum(mb for cid, mb in container_memory_mb().items() if cid in executor_ids())
    cpu_before, machine_before = engine_cpu_s(), machine_cpu_s()
    started = time.monotonic()
    view = client.submit({
        "model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"},
        "tasks": tasks, "prompt": "gpt", "preflight": False, "max_concurrency": max_concurrency,
    })  # fmt: skip
    evaluation_id = view["evaluation"]["id"]
    sampler = Sampler(client, evaluation_id)
    sampler.start()
    deadline = started + timeout_s
    while sampler.view.get("status") not in ("completed", "cancelled"):
        if time.monotonic() > deadline:
            raise SystemExit(f"evaluation {evaluation_id} did not finish in {timeout_s:.0f} s")
        time.sleep(0.5)
    wall = time.monotonic() - started
    sampler.stop.set()
    sampler.join()
    components = sampler.ledger.components()
    cpu, machine = engine_cpu_s() - cpu_before, machine_cpu_s() - machine_before
    results = client.results(evaluation_id)
    store = artifact_store()
    cells_cpu = 0.0
    for verdict in results["verdicts"]:
        if verdict["status"] == "unavailable":
            continue
        trajectory = store.get_trajectory(evaluation_id, verdict["task_index"], verdict["attempt"])
        cells_cpu += sum(t.execution.cpu_s or 0.0 for t in trajectory.turns if t.execution is not None)
    statuses = {v["task_index"]: v["status"] for v in results["verdicts"]}
    peak = max(1, sampler.peak_running)
    return {
        "evaluation": evaluation_id,
        "wall_s": round(wall, 1),
        "tasks_completed": len(statuses),
        "infra_errors": sum(1 for s in statuses.values() if s == "infra_error"),
        "passed": sum(1 for s in statuses.values() if s == "passed"),
        "statuses": statuses,
        "cpu_s": round(cpu, 1),
        "cells_cpu_s": round(cells_cpu, 1),
        "overhead_cpu_s_per_task": round((cpu - cells_cpu) / max(1, len(tasks)), 2),
        "machine_cpu_s": round(machine, 1),
        "machine_overhead_cpu_s_per_task": round((machine - cells_cpu) / max(1, len(tasks)), 2),
        "machine_cpu_s_by_component": components,
        "peak_sessions_in_flight": sampler.peak_running,
        "peak_memory_mb": round(sampler.peak_memory_mb),
        "executor_mb_per_session": round(max(0.0, sampler.executor_mb_at_peak - idle_executor_mb) / peak, 1),
    }


# --- the baseline -----------------------------------------------------------------------------------------------


BASELINE_PYTHON = Path("/usr/bin/python3")
"""The baseline's interpreter: Debian's (bookworm's 3.11.2, the sandbox image's), which the unprivileged user it runs
as can read, unlike a Python installed under a home folder."""


def make_venv(folder: Path) -> Path:
    """A fresh virtual environment of ``BASELINE_PYTHON`` with the sandbox image's packages (from the local
    wheelhouse), owned by the unprivileged user the baseline runs as. Returns its python.

    Raises:
        SystemExit: Debian's python3 or its venv module is missing (it says what to install).
    """
    if subprocess.run([str(BASELINE_PYTHON), "-c", "import venv, ensurepip"], capture_output=True).returncode != 0:
        raise SystemExit("the baseline needs Debian's python3 with venv: apt-get install -y python3-venv")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BASELINE_PYTHON), "-m", "venv", str(folder)], check=True)
    wheels = ROOT / "services" / "sandbox" / "image" / "staged" / "wheels"
    source = ["--no-index", "--find-links", str(wheels)] if any(wheels.glob("*.whl")) else []
    subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *source, "-r", str(ROOT / "services" / "sandbox" / "image" / "kernel-requirements.txt"),
                    "-r", str(ROOT / "services" / "sandbox" / "image" / "staged" / "suite-requirements.txt")],
                   check=True)  # fmt: skip
    subprocess.run(["chown", "-R", "nobody:nogroup", str(folder)], check=True)
    return folder / "bin" / "python"


def run_baseline(plan_file: Path, venv: Path, threads: int, latency_s: float) -> dict[str, Any]:
    """The baseline harness in a fresh venv, a network namespace with only loopback, as ``nobody``."""
    python = make_venv(venv)
    harness = Path(tempfile.mkdtemp(prefix="pbe-harness-")) / "baseline_harness.py"
    shutil.copyfile(ROOT / "scripts" / "baseline_harness.py", harness)
    os.chmod(harness.parent, 0o755)
    inner = (
        f"ip link set lo up && exec setpriv --reuid=nobody --regid=nogroup --clear-groups "
        f"env HOME=/tmp PATH={venv}/bin:/usr/bin:/bin {python} {harness} {plan_file} --threads {threads} "
        f"--latency {latency_s} --cell-timeout {CELL_TIMEOUT_S}"
    )
    done = subprocess.run(["unshare", "--net", "sh", "-c", inner], capture_output=True, text=True, timeout=3600)
    shutil.rmtree(harness.parent, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"the baseline failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default=f"http://127.0.0.1:{os.environ.get('PBE_GATEWAY_PORT', '8080')}")
    default_suite = Path(os.environ.get("PBE_SUITE_DIR", ROOT.parent / "shared" / "pybench"))
    parser.add_argument("--suite", type=Path, default=default_suite)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer in the second runs")
    parser.add_argument(
        "--max-concurrency", type=int, default=16, help="the instant run's max_concurrency (CPU-bound: PyBench's 16)"
    )
    parser.add_argument(
        "--latency-max-concurrency", type=int, default=64, help="the slow model's run (sessions mostly wait on it)"
    )
    parser.add_argument("--threads", type=int, default=16, help="the baseline's sessions at once (PyBench: 16)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--resume", action="store_true", help="reuse the runs saved under var/bench by a run cut short")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark reads cgroup files and the artifact volume, and runs unshare")
    suite = load_suite(args.suite)
    tasks = sorted(suite.tasks)
    work = ROOT / "var" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    plan_file = work / "baseline-plan.json"
    plan_file.write_text(json.dumps(build_plan(suite)))
    os.chmod(plan_file, 0o644)
    client = GatewayClient(args.gateway, api_key=os.environ.get("PBE_ADMIN_KEY"))
    runs: dict[str, dict[str, Any]] = {}
    venv = Path(tempfile.gettempdir()) / "pbe-bench-baseline-venv"
    try:
        for name, latency, limit in (
            ("instant", 0.0, args.max_concurrency),
            ("latency", args.latency, args.latency_max_concurrency),
        ):
            service = work / f"throughput-{name}-service.json"
            if not (args.resume and service.is_file()):
                set_replay_latency(latency)
                print(f"service, model answering in {latency:.0f} s, {limit} at once ...", flush=True)
                service.write_text(json.dumps(run_service(client, tasks, limit, args.timeout)))
            runs[f"{name}_service"] = json.loads(service.read_text())
            runs[f"{name}_service"]["statuses"] = {int(k): v for k, v in runs[f"{name}_service"]["statuses"].items()}
            baseline = work / f"throughput-{name}-baseline.json"
            if not (args.resume and baseline.is_file()):
                print(f"baseline, model answering in {latency:.0f} s ...", flush=True)
                baseline.write_text(json.dumps(run_baseline(plan_file, venv, args.threads, latency)))
            runs[f"{name}_baseline"] = json.loads(baseline.read_text())
    finally:
        set_replay_latency(0.0)
        client.close()
        shutil.rmtree(venv, ignore_errors=True)
    instant, slow = runs["instant_service"], runs["latency_service"]
    differ = sorted(i for i, s in instant["statuses"].items() if slow["statuses"].get(i) != s)
    print(f"\n{'run':<28}{'wall s':>9}{'tasks':>7}{'infra':>7}{'peak sessions':>15}{'CPU s':>9}")
    for name, run in runs.items():
        tasks_done = run.get("tasks_completed", run.get("tasks"))
        print(f"{name:<28}{run['wall_s']:>9}{tasks_done:>7}{run.get('infra_errors', run.get('failed', 0)):>7}"
              f"{run.get('peak_sessions_in_flight', args.threads):>15}{run.get('cpu_s', '-'):>9}")  # fmt: skip
    figures = {
        "bench": "throughput",
        "replay_wall_s": instant["wall_s"],
        "baseline_wall_s": runs["instant_baseline"]["wall_s"],
        "ratio": round(instant["wall_s"] / runs["instant_baseline"]["wall_s"], 2),
        "latency_replay_wall_s": slow["wall_s"],
        "latency_baseline_wall_s": runs["latency_baseline"]["wall_s"],
        "latency_ratio": round(slow["wall_s"] / runs["latency_baseline"]["wall_s"], 2),
        "latency_s": args.latency,
        "tasks": len(tasks),
        "tasks_completed": min(instant["tasks_completed"], slow["tasks_completed"]),
        "infra_errors": [instant["infra_errors"], slow["infra_errors"]],
        "graded_differently": differ,
        "overhead_cpu_s_per_task": instant["overhead_cpu_s_per_task"],
        "machine_overhead_cpu_s_per_task": instant.get("machine_overhead_cpu_s_per_task"),
        "machine_cpu_s": instant.get("machine_cpu_s"),
        "cpu_s": instant["cpu_s"],
        "cells_cpu_s": instant["cells_cpu_s"],
        "machine_cpu_s_by_component": instant.get("machine_cpu_s_by_component"),
        "peak_sessions_in_flight": max(instant["peak_sessions_in_flight"], slow["peak_sessions_in_flight"]),
        "peak_memory_mb": max(instant["peak_memory_mb"], slow["peak_memory_mb"]),
        "executor_mb_per_session": slow["executor_mb_per_session"],
        "max_concurrency": [args.max_concurrency, args.latency_max_concurrency],
        "baseline_threads": args.threads,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
