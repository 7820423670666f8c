"""The design/scheduling.md §4 formulas against hand-computed traces, their properties, and the torchmetrics reductions
over 2 ranks."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.metrics import (
    LastValue,
    StepCounter,
    UtilizationPoint,
    cluster_resource_utilization,
    correct_seed_capacity,
    cycle_metrics,
    hybrid_rollout_fraction,
    last_value,
    rollout_capacity,
    rollout_resource_utilization,
    rollout_utilization_terms,
    train_compute_time,
    train_resource_utilization,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------------------------


def test_metric_names_match_the_seed_verbatim():
    assert M.SEED_METRIC_NAMES == (
        "dynamic_resource/train_resource_utilization",
        "dynamic_resource/rollout_resource_utilization",
        "dynamic_resource/resource_utilization",
        "dynamic_resource/train_compute_time_s",
        "dynamic_resource/train_allocated_time_s",
        "dynamic_resource/mq_size",
        "fully_async/rollouter/step_generated_samples",
    )
    assert M.METRIC_NAMES[len(M.SEED_METRIC_NAMES) :] == (
        "dynamic_resource/activate_duration_s",
        "dynamic_resource/deactivate_duration_s",
        "dynamic_resource/weight_sync_time_s",
        "dynamic_resource/hybrid_sync_skipped",
        "dynamic_resource/hybrid_sync_skipped_total",
        "dynamic_resource/hybrid_active",
        "dynamic_resource/replica_restarts",
    )
    assert len(set(M.METRIC_NAMES)) == len(M.METRIC_NAMES)


# ---------------------------------------------------------------------------------------------------------------
# §4.1 train
# ---------------------------------------------------------------------------------------------------------------


def test_train_utilization_sums_first_then_divides_once():
    compute = [2.0, 3.0, 1.0]
    alloc = [4.0, 5.0, 3.0]
    # (2 + 3 + 1) / (4 + 5 + 3) = 6 / 12 = 0.5
    assert train_resource_utilization(compute, alloc) == 0.5
    # the mean of per-step ratios would be (0.5 + 0.6 + 0.3333) / 3 = 0.4778: not the seed's formula
    assert train_resource_utilization(compute, alloc) != pytest.approx(sum(c / a for c, a in zip(compute, alloc)) / 3)
    assert train_resource_utilization(6.0, 12.0) == 0.5  # already-summed floats


def test_train_utilization_is_zero_without_allocated_time():
    assert train_resource_utilization(0.0, 0.0) == 0.0
    assert train_resource_utilization([], []) == 0.0
    assert train_resource_utilization(1.0, 0.0) == 0.0


def test_train_utilization_rejects_negative_and_non_numeric_inputs():
    with pytest.raises(ValueError, match="compute_s"):
        train_resource_utilization(-1.0, 2.0)
    with pytest.raises(TypeError, match="allocated_s"):
        train_resource_utilization(1.0, "2")


def test_train_compute_time_sums_the_seed_keys_and_defaults_missing_to_zero():
    timing_raw = {"reward": 0.5, "old_log_prob": 1.0, "ref": 0.25, "adv": 0.25, "update_actor": 2.0, "gen": 9.0}
    # 0.5 + 1.0 + 0.25 + (values: 0) + 0.25 + (update_critic: 0) + 2.0 = 4.0; "gen" is not a compute key
    assert train_compute_time(timing_raw) == 4.0
    assert train_compute_time({}) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# §4.2 rollout
# ---------------------------------------------------------------------------------------------------------------


def test_rollout_utilization_constant_capacity():
    history = [(0.0, 4, 8), (2.0, 8, 8), (4.0, 0, 8)]
    # busy = 2·min(8,4) + 2·min(8,8) = 8 + 16 = 24; capacity = 2·8 + 2·8 = 32; 24 / 32 = 0.75
    assert rollout_utilization_terms(history) == (24.0, 32.0)
    assert rollout_resource_utilization(history) == 0.75


def test_rollout_utilization_uses_each_intervals_own_capacity_when_it_changes_mid_window():
    history = [(0.0, 10, 16), (1.0, 20, 32), (3.0, 20, 16), (4.0, 0, 16)]
    # [0,1): 1·min(16,10)=10 over 1·16=16; [1,3): 2·min(32,20)=40 over 2·32=64 (hybrid active);
    # [3,4): 1·min(16,20)=16 over 1·16=16.  (10 + 40 + 16) / (16 + 64 + 16) = 66 / 96 = 0.6875
    assert rollout_utilization_terms(history) == (66.0, 96.0)
    assert rollout_resource_utilization(history) == 0.6875
    # one end-of-window capacity (16) for the whole window would misattribute: (10 + 2·16 + 16) / (4·16) = 58/64
    end_cap = [(t, a, 16) for t, a, _ in history]
    assert rollout_resource_utilization(end_cap) == 58 / 64
    assert rollout_resource_utilization(history) != rollout_resource_utilization(end_cap)


def test_rollout_utilization_clamps_active_to_capacity():
    # 20 active tasks under a cap of 16 use the full capacity: 1·16 / 1·16 = 1.0
    assert rollout_resource_utilization([(0.0, 20, 16), (1.0, 0, 16)]) == 1.0


def test_rollout_utilization_skips_the_zero_capacity_seed_point_then_correction_weighs_it():
    history = [(0.0, 0, 0), (2.0, 4, 8), (4.0, 8, 8), (5.0, 0, 8)]
    # [0,2) has cap 0: zero weight.  busy = 2·4 + 1·8 = 16; capacity = 2·8 + 1·8 = 24; 16/24 = 2/3
    assert rollout_resource_utilization(history) == pytest.approx(2 / 3)
    fixed = correct_seed_capacity(history, 8)
    assert fixed[0] == UtilizationPoint(0.0, 0, 8)
    assert fixed[1:] == [UtilizationPoint(*p) for p in history[1:]]
    # now [0,2) counts as idle capacity: busy = 0 + 8 + 8 = 16; capacity = 16 + 16 + 8 = 40; 16/40 = 0.4
    assert rollout_resource_utilization(fixed) == 0.4


def test_correct_seed_capacity_leaves_a_later_real_zero_capacity_alone():
    history = [(0.0, 0, 0), (1.0, 2, 8), (2.0, 0, 0), (3.0, 0, 8)]
    assert correct_seed_capacity(history, 8) == [(0.0, 0, 8), (1.0, 2, 8), (2.0, 0, 0), (3.0, 0, 8)]
    assert correct_seed_capacity([], 8) == []
    with pytest.raises(ValueError, match="cap"):
        correct_seed_capacity(history, -1)


@pytest.mark.parametrize(
    "history",
    [
        [],  # empty history
        [(3.0, 5, 8)],  # a single point: no interval
        [(0.0, 5, 0), (2.0, 5, 0), (3.0, 0, 0)],  # only zero-capacity intervals
        [(1.0, 5, 8), (1.0, 0, 8)],  # zero-length window
    ],
)
def test_rollout_utilization_is_zero_without_capacity_time(history):
    assert rollout_resource_utilization(history) == 0.0


def test_rollout_history_is_validated():
    with pytest.raises(ValueError, match="must not decrease"):
        rollout_resource_utilization([(2.0, 1, 8), (1.0, 1, 8)])
    with pytest.raises(ValueError, match=r"history\[0\]"):
        rollout_resource_utilization([(0.0, -1, 8), (1.0, 0, 8)])
    with pytest.raises(ValueError, match=r"\(t, active, cap\)"):
        rollout_resource_utilization([(0.0, 1)])


def test_rollout_capacity():
    assert rollout_capacity(2, 16, 40) == 32  # min(2·16, 40)
    assert rollout_capacity(3, 16, 40) == 40  # min(48, 40): clamped by max_required_samples
    assert rollout_capacity(0, 16, 40) == 0  # every replica asleep
    with pytest.raises(ValueError, match="active_servers"):
        rollout_capacity(-1, 16, 40)


# ---------------------------------------------------------------------------------------------------------------
# §4.3 cluster
# ---------------------------------------------------------------------------------------------------------------


def test_hybrid_rollout_fraction():
    assert hybrid_rollout_fraction(3.0, 12.0) == 0.25
    assert hybrid_rollout_fraction([1.0, 2.0], [4.0, 8.0]) == 0.25  # (1+2)/(4+8)
    assert hybrid_rollout_fraction(3.0, 0.0) == 0.0  # step 0
    assert hybrid_rollout_fraction(0.0, 12.0) == 0.0  # hybrid never in rollout mode
    assert hybrid_rollout_fraction(15.0, 12.0) == 1.0  # clipped


def test_cluster_utilization_hand_computed():
    # x = 3/12 = 0.25, a = 2 hybrid, b = 6 standalone, U_train = 0.5, U_rollout = 0.75
    # ((1-0.25)·2·0.5 + (0.25·2 + 6)·0.75) / (2+6) = (0.75 + 6.5·0.75) / 8 = (0.75 + 4.875) / 8 = 0.703125
    assert cluster_resource_utilization(0.5, 0.75, 3.0, 12.0, 2, 6) == 0.703125
    # same with per-micro-step wait/step lists: (1+2)/(4+8) = 0.25
    assert cluster_resource_utilization(0.5, 0.75, [1.0, 2.0], [4.0, 8.0], 2, 6) == 0.703125
    # no hybrid rollout this cycle (x = 0): (2·0.5 + 6·0.75) / 8 = 5.5 / 8 = 0.6875
    assert cluster_resource_utilization(0.5, 0.75, 0.0, 12.0, 2, 6) == 0.6875
    # step 0 -> x = 0, same as above
    assert cluster_resource_utilization(0.5, 0.75, 3.0, 0.0, 2, 6) == 0.6875
    # only_hybrid (b = 0), x = 0.25: (0.75·2·0.5 + 0.5·0.75) / 2 = (0.75 + 0.375) / 2 = 0.5625
    assert cluster_resource_utilization(0.5, 0.75, 3.0, 12.0, 2, 0) == 0.5625
    # no devices at all
    assert cluster_resource_utilization(0.5, 0.75, 3.0, 12.0, 0, 0) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# §4.4 mq_size, §4.5 step_generated_samples, cycle_metrics
# ---------------------------------------------------------------------------------------------------------------


def test_mq_size_is_the_last_value_not_an_average():
    assert last_value([9, 4, 3]) == 3.0
    assert last_value([]) == 0.0
    lv = LastValue()
    assert lv.value == 0.0
    for q in (9, 4, 3):
        lv.update(q)
    assert lv.value == 3.0
    assert lv.reset() == 3.0
    assert lv.value == 0.0


def test_step_generated_samples_counter_resets_per_param_version():
    c = StepCounter()
    c.add()
    c.add(4)
    assert c.value == 5
    assert c.reset() == 5  # reset_staleness(): report and restart
    assert c.value == 0
    with pytest.raises(ValueError):
        c.add(-1)


def test_cycle_metrics_keys_and_values():
    out = cycle_metrics(
        compute_s=[2.0, 3.0, 1.0],
        allocated_s=[4.0, 5.0, 3.0],
        rollout_history=[(0.0, 4, 8), (2.0, 8, 8), (4.0, 0, 8)],
        wait_s=3.0,
        step_s=12.0,
        hybrid_devices=2,
        standalone_devices=6,
        mq_sizes=[7, 2],
        step_generated_samples=11,
    )
    assert out == {
        M.TRAIN_RESOURCE_UTILIZATION: 0.5,
        M.ROLLOUT_RESOURCE_UTILIZATION: 0.75,
        M.RESOURCE_UTILIZATION: 0.703125,  # see test_cluster_utilization_hand_computed
        M.TRAIN_COMPUTE_TIME_S: 6.0,
        M.TRAIN_ALLOCATED_TIME_S: 12.0,
        M.MQ_SIZE: 2.0,
        M.STEP_GENERATED_SAMPLES: 11.0,
    }


# ---------------------------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------------------------

_counts = st.integers(min_value=0, max_value=64)


@st.composite
def histories(draw):
    gaps = draw(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=0, max_size=12))
    t, points = draw(st.floats(min_value=0.0, max_value=1e3)), []
    for gap in [0.0, *gaps]:
        t += gap
        points.append((t, draw(_counts), draw(_counts)))
    return points


@given(histories())
def test_rollout_utilization_is_in_unit_interval(history):
    assert 0.0 <= rollout_resource_utilization(history) <= 1.0


@given(histories(), st.data())
def test_rollout_utilization_is_invariant_to_splitting_an_interval(history, data):
    if len(history) < 2:
        return
    k = data.draw(st.integers(min_value=0, max_value=len(history) - 2))
    f = data.draw(st.floats(min_value=0.01, max_value=0.99))
    (t0, active, cap), (t1, _, _) = history[k], history[k + 1]
    split = [*history[: k + 1], (t0 + f * (t1 - t0), active, cap), *history[k + 1 :]]
    assert math.isclose(rollout_resource_utilization(split), rollout_resource_utilization(history), abs_tol=1e-9)


@given(st.lists(st.tuples(st.floats(0.0, 1e4), st.floats(0.0, 1.0)), max_size=10))
def test_train_utilization_is_in_unit_interval_when_compute_fits_in_allocation(steps):
    alloc = [a for a, _ in steps]
    compute = [a * share for a, share in steps]
    assert 0.0 <= train_resource_utilization(compute, alloc) <= 1.0 + 1e-12


_unit = st.floats(0.0, 1.0)
_devices = st.integers(0, 64)
_seconds = st.floats(0.0, 1e4)


@given(_unit, _unit, _seconds, _seconds, _devices, _devices)
def test_cluster_utilization_is_in_unit_interval(u_train, u_rollout, wait, step, a, b):
    assert 0.0 <= cluster_resource_utilization(u_train, u_rollout, wait, step, a, b) <= 1.0 + 1e-12


@given(_unit, _seconds, _seconds, _devices, _devices)
def test_cluster_utilization_of_equal_utilizations_is_that_utilization(u, wait, step, a, b):
    if a + b == 0:
        return
    assert math.isclose(cluster_resource_utilization(u, u, wait, step, a, b), u, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# laziness
# ---------------------------------------------------------------------------------------------------------------


def test_importing_metrics_does_not_import_torch():
    code = (
        "import sys, lightning_hybrid_rollout.metrics as m; "
        "m.rollout_resource_utilization([(0, 1, 2), (1, 0, 2)]); "
        "assert 'torch' not in sys.modules, 'metrics imported torch'; "
        "assert 'torchmetrics' not in sys.modules; "
        "assert 'TrainResourceUtilization' in dir(m); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------------------------
# torchmetrics classes, one process
# ---------------------------------------------------------------------------------------------------------------


def test_torch_metrics_single_process_match_the_pure_functions():
    import pickle

    torch = pytest.importorskip("torch")
    m = M.TrainResourceUtilization()
    m.update(2.0, 4.0)
    m.update(torch.tensor([3.0, 1.0]), [5.0, 3.0])
    assert float(m.compute()) == 0.5  # (2+3+1)/(4+5+3)
    assert type(pickle.loads(pickle.dumps(m))) is M.TrainResourceUtilization
    m.reset()
    assert (float(m.compute_s), float(m.allocated_s)) == (0.0, 0.0)

    r = M.RolloutResourceUtilization()
    r.update([(0.0, 10, 16), (1.0, 20, 32), (3.0, 20, 16), (4.0, 0, 16)])
    assert float(r.compute()) == 0.6875

    c = M.ClusterResourceUtilization(hybrid_devices=2, standalone_devices=6)
    c.update(compute_s=[2.0, 3.0, 1.0], allocated_s=[4.0, 5.0, 3.0], wait_s=3.0, step_s=12.0)
    c.update(history=[(0.0, 4, 8), (2.0, 8, 8), (4.0, 0, 8)])
    assert float(c.compute()) == 0.703125

    lv = M.LastValueMetric()
    for q in (9, 4, 3):
        lv.update(q)
    assert float(lv.compute()) == 3.0
    fwd = M.LastValueMetric()  # forward() (what `metric(x)` in a LightningModule calls) keeps last-value semantics
    assert [float(fwd(q)) for q in (9, 4, 3)] == [9.0, 4.0, 3.0]
    assert float(fwd.compute()) == 3.0  # not max(9, 4, 3)

    n = M.CounterMetric()
    n.update()
    n.update(4)
    assert float(n.compute()) == 5.0
    assert float(n(2)) == 2.0  # forward returns the batch value and accumulates
    assert float(n.compute()) == 7.0

    t = M.TrainResourceUtilization()
    assert float(t(1.0, 2.0)) == 0.5
    assert float(t(3.0, 4.0)) == 0.75  # this batch alone
    assert float(t.compute()) == 4.0 / 6.0  # pooled (1+3)/(2+4)


# ---------------------------------------------------------------------------------------------------------------
# torchmetrics classes, 2 real processes on gloo
# ---------------------------------------------------------------------------------------------------------------

_WORKER = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from lightning_hybrid_rollout import metrics as M

    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    INPUTS = {
        0: dict(compute=3.0, alloc=4.0, history=[(0.0, 4, 8), (2.0, 8, 8), (4.0, 0, 8)], wait=1.0, step=4.0,
                mq=[9, 3], generated=[5, 2]),
        1: dict(compute=1.0, alloc=10.0, history=[(0.0, 2, 16), (1.0, 0, 16)], wait=2.0, step=4.0,
                mq=[], generated=[4]),
    }[rank]
    train, rollout = M.TrainResourceUtilization(), M.RolloutResourceUtilization()
    cluster = M.ClusterResourceUtilization(hybrid_devices=2, standalone_devices=6)
    mq, gen = M.LastValueMetric(), M.CounterMetric()
    train.update(INPUTS["compute"], INPUTS["alloc"])
    rollout.update(INPUTS["history"])
    cluster.update(INPUTS["compute"], INPUTS["alloc"], INPUTS["history"], INPUTS["wait"], INPUTS["step"])
    for q in INPUTS["mq"]:
        mq.update(q)
    for n in INPUTS["generated"]:
        gen.update(n)
    local = M.cluster_resource_utilization(
        M.train_resource_utilization(INPUTS["compute"], INPUTS["alloc"]),
        M.rollout_resource_utilization(INPUTS["history"]), INPUTS["wait"], INPUTS["step"], 2, 6)
    out = {name: float(m.compute()) for name, m in
           dict(train=train, rollout=rollout, cluster=cluster, mq=mq, generated=gen).items()}
    out["local_cluster"] = local
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_metrics_reduce_sum_then_divide_over_two_gloo_ranks(tmp_path):
    pytest.importorskip("torchmetrics")
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr
        results.append(json.loads(re.search(r"^RESULT (.*)$", stdout, re.M).group(1)))
    r0, r1 = results
    for key in ("train", "rollout", "cluster", "mq", "generated"):
        assert r0[key] == pytest.approx(r1[key]), key  # every rank gets the reduced value

    # train: rank 0 adds 3/4, rank 1 adds 1/10 -> pooled (3+1)/(4+10) = 4/14; the mean of ratios is (0.75+0.1)/2
    assert r0["train"] == pytest.approx(4 / 14)
    assert r0["train"] != pytest.approx((0.75 + 0.1) / 2)
    # rollout: rank 0 busy 2·4 + 2·8 = 24 over 2·8 + 2·8 = 32 (0.75); rank 1 busy 1·2 = 2 over 1·16 = 16 (0.125)
    # pooled (24+2)/(32+16) = 26/48; the mean of ratios is (0.75+0.125)/2 = 0.4375
    assert r0["rollout"] == pytest.approx(26 / 48)
    assert r0["rollout"] != pytest.approx(0.4375)
    # cluster: U_train = 4/14, U_rollout = 26/48, x = (1+2)/(4+4) = 3/8, a = 2, b = 6
    # ((5/8)·2·(4/14) + ((3/8)·2 + 6)·(26/48)) / 8 = (5/14 + 6.75·26/48) / 8 = (0.357143 + 3.65625) / 8 = 0.501674
    expected = ((5 / 8) * 2 * (4 / 14) + ((3 / 8) * 2 + 6) * (26 / 48)) / 8
    assert expected == pytest.approx(0.501674, abs=1e-6)
    assert r0["cluster"] == pytest.approx(expected)
    # per-rank: rank 0 ((0.75·2·0.75) + 6.5·0.75)/8 = 0.75; rank 1 ((0.5·2·0.1) + 7·0.125)/8 = 0.121875
    assert (r0["local_cluster"], r1["local_cluster"]) == pytest.approx((0.75, 0.121875))
    assert r0["cluster"] != pytest.approx((0.75 + 0.121875) / 2)
    # mq_size: rank 0's last value 3 (not its earlier 9); rank 1 never updated (default 0) -> max = 3
    assert r0["mq"] == 3.0
    # step_generated_samples: (5 + 2) + 4 = 11
    assert r0["generated"] == 11.0


# ---------------------------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------------------------


def test_docs_metrics_python_blocks_run():
    text = (REPO / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks, "docs/metrics.md has no ```python blocks"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/metrics.md", "exec"), namespace)
