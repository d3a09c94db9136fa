"""The seconds a training step spends moving gradients (and ZeRO 3's parameters) between GPU
ranks, for `paperscale plan`: from the bytes moved, the ranks, the nodes and the links.

NCCL's ring collectives move, through each rank's slowest link, (n - 1) / n x S bytes for a
reduce-scatter or an all-gather of S bytes over n ranks, and twice that for an all-reduce. S is
the parameters x the bytes of the dtype DeepSpeed communicates in (the model's: 2 in bf16 and
fp16, 4 in fp32). Per optimizer step, in units of (n - 1) / n x S:

    ZeRO 0, 1   2                    one all-reduce of the gradients at the step's end (stage
                                     1: reduce-scatter, then the updated parameters gathered)
    ZeRO 2      accum + 1            the gradients reduce-scattered in every micro-batch's
                                     backward, the updated parameters gathered once
    ZeRO 3      3 x accum            parameters gathered for each forward and each backward,
                                     gradients reduce-scattered

The bandwidth is the GPUs' all-reduce bus bandwidth inside a node (`--intra-link`); across nodes
the lower of that and one node's network (`--network`, `--network-gbps`): a ring that spans N
nodes crosses each node's network once in and once out, so the node's links carry what each GPU
sends, 2 (n - 1) / n x S for an all-reduce, in as many rings as the node has adapters. Each unit
is n - 1 ring steps, each adding the link's latency (small at these sizes).

What of it overlaps the backward (train.overlap_comm, train.bucket_elements) is
launch/cost_model/step_time.py's `exposed_sync`. The bandwidths are
assumed (~80 % of the links' datasheet rates, what nccl-tests' bus bandwidth reaches at large
messages), not measured here; the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A link's assumed bandwidth (bytes/s: a GPU's bus bandwidth inside a node, or one node's
    network) and latency per ring step."""

    key: str
    bytes_per_s: float
    latency_s: float
    what: str


INTRA_LINKS = {
    "nvlink": Link("nvlink", 360e9, 5e-6, "NVLink through NVSwitch (H100/H200: 450 GB/s a way)"),
    "pcie": Link("pcie", 20e9, 10e-6, "PCIe 4.0 x16 between GPUs (25 GB/s a way)"),
}
NETWORKS = {
    "ib": Link("ib", 320e9, 10e-6, "InfiniBand, 8 x 400 Gb/s a node, an adapter per GPU"),
    "ethernet": Link("ethernet", 10e9, 30e-6, "Ethernet, 100 Gb/s a node"),
}
EFFICIENCY = 0.8  # of a datasheet rate: what --network-gbps is discounted by, as the presets


@dataclass(frozen=True)
class Interconnect:
    """The links of the planned cluster; `network` matters only beyond one node."""

    intra: Link = INTRA_LINKS["nvlink"]
    network: Link = NETWORKS["ib"]

    @staticmethod
    def of(
        intra: str = "nvlink", network: str = "ib", network_gbps: float | None = None
    ) -> Interconnect:
        """From `plan`'s --intra-link, --network and --network-gbps (a node's datasheet rate
        in Gb/s, e.g. 3200 for 8 x 400 Gb/s InfiniBand, discounted by EFFICIENCY)."""
        net = NETWORKS[network]
        if network_gbps is not None:
            rate = network_gbps * 1e9 / 8 * EFFICIENCY
            net = Link(net.key, rate, net.latency_s, f"{net.what.split(',')[0]}, "
                       f"{network_gbps:g} Gb/s a node (--network-gbps)")  # fmt: skip
        return Interconnect(INTRA_LINKS[intra], net)


def volume_units(stage: int, accum: int) -> int:
    """Per optimizer step, the (n - 1) / n x S units each rank moves (see the module)."""
    if stage == 3:
        return 3 * accum
    if stage == 2:
        return accum + 1
    return 2


def sync_seconds(
    n_params: int, bytes_per_param: int, stage: int, accum: int, nodes: int,
    gpus_per_node: int, links: Interconnect,
) -> dict[str, float | str]:  # fmt: skip
    """Seconds, bytes moved per rank and the limiting link of one step's synchronisation."""
    n = nodes * gpus_per_node
    if n < 2:
        return {"seconds": 0.0, "bytes": 0.0, "link": "none: one rank"}
    units = volume_units(stage, accum)
    moved = units * (n - 1) / n * n_params * bytes_per_param
    link = links.intra
    if nodes > 1 and links.network.bytes_per_s < link.bytes_per_s:
        link = links.network
    latency = max(links.intra.latency_s, links.network.latency_s if nodes > 1 else 0.0)
    seconds = moved / link.bytes_per_s + units * (n - 1) * latency  # n - 1 ring steps a unit
    return {"seconds": seconds, "bytes": moved, "link": link.what}
