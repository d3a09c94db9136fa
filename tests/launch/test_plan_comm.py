"""The gradients' synchronisation in `paperscale plan` (launch/cost_model/comm.py): bytes by
ZeRO stage and accumulation, the link that limits a ring inside one node and across nodes, and
the step time and printout that carry it."""

from __future__ import annotations

import json

import pytest

from launch.cost_model.comm import Interconnect, sync_seconds, volume_units
from launch.cost_model.plan import Machine
from launch.cost_model.step_time import step_time
from model.params import count_parameters
from tests.launch.conftest import plan_cli
from tests.launch.test_plan_quality import BIG

PARAMS = 214_249_472  # the big model


def test_each_stage_moves_what_its_collectives_move() -> None:
    assert [volume_units(s, 1) for s in range(4)] == [2, 2, 2, 3]
    assert [volume_units(s, 4) for s in range(4)] == [2, 2, 5, 12]


def test_bytes_and_seconds_of_a_ring_in_one_node_and_across_nodes() -> None:
    links = Interconnect.of()
    one = sync_seconds(PARAMS, 2, 1, 1, 1, 8, links)
    assert one["bytes"] == pytest.approx(2 * 7 / 8 * PARAMS * 2)
    # 0.75 GB over NVLink's assumed 360 GB/s, and 14 ring steps of 5 us
    assert one["seconds"] == pytest.approx(one["bytes"] / 360e9 + 14 * 5e-6)
    assert "NVLink" in str(one["link"])
    # two nodes over InfiniBand: the node's network (320 GB/s) is the slower link
    two = sync_seconds(PARAMS, 2, 1, 1, 2, 8, links)
    assert two["bytes"] == pytest.approx(2 * 15 / 16 * PARAMS * 2)
    assert two["seconds"] == pytest.approx(two["bytes"] / 320e9 + 30 * 10e-6)
    # 100 Gb/s Ethernet: tens of milliseconds; a node's own figure in Gb/s replaces the preset
    eth = sync_seconds(PARAMS, 2, 1, 1, 2, 8, Interconnect.of(network="ethernet"))
    assert eth["seconds"] > 20 * two["seconds"] and "Ethernet" in str(eth["link"])
    own = sync_seconds(PARAMS, 2, 1, 1, 2, 8, Interconnect.of(network="ethernet", network_gbps=800))
    assert own["seconds"] == pytest.approx(own["bytes"] / (800e9 / 8 * 0.8) + 30 * 30e-6)
    # fp32 gradients move twice the bytes; one rank moves none
    assert sync_seconds(PARAMS, 4, 1, 1, 1, 8, links)["bytes"] == pytest.approx(2 * one["bytes"])
    assert sync_seconds(PARAMS, 2, 1, 1, 1, 1, links)["seconds"] == 0.0


def test_the_step_time_adds_it_on_gpus_only() -> None:
    gpu = Machine(gpus_per_node=8, mfu=0.5, peak_flops=1e15, links=Interconnect.of())
    base = step_time(BIG, Machine(gpus_per_node=8, mfu=0.5, peak_flops=1e15), 458_752, 32)
    step = step_time(BIG, gpu, 458_752, 32, accum=4, stage=2)
    n_params = count_parameters(BIG)["total"]
    assert step["comm_s"] > 0 and step["comm_bytes"] == pytest.approx(5 * 7 / 8 * n_params * 2)
    assert step["step_s"] == pytest.approx(base["step_s"] + step["comm_s"])
    cpu = Machine(gpus_per_node=2, on_cpu=True, links=Interconnect.of())
    assert step_time(BIG, cpu, 4096, 32)["comm_s"] == 0.0  # a calibrated CPU: not priced


def test_plan_prints_the_sync_of_more_nodes_and_refuses_a_bad_rate() -> None:
    args = ("--config", "configs/big_8gpu.yaml", "--gpu", "h200")
    one = json.loads(plan_cli(*args, "--json").stdout)
    proc = plan_cli(*args, "--nodes", "4", "--network", "ethernet")
    assert proc.returncode == 0, proc.stderr
    assert "over Ethernet, 100 Gb/s a node" in proc.stdout
    four = json.loads(plan_cli(*args, "--nodes", "4", "--network", "ethernet", "--json").stdout)
    assert four["comm_s"] > 20 * one["comm_s"] and four["step_s"] > one["step_s"]
    bad = plan_cli(*args, "--network-gbps", "0")
    assert bad.returncode == 2 and "--network-gbps must be > 0" in bad.stderr
