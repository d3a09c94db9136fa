"""The sbatch script `paperscale submit` writes, read as text; cluster profile validation;
`status` without a scheduler. No Slurm needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import ConfigError
from launch.slurm.cluster import NUMA_BINDING_MODES, ClusterProfile, load_profile
from launch.slurm.job import torchrun_command
from launch.slurm.script import batch_script
from launch.status import format_status, run_status

ROOT = Path(__file__).resolve().parents[2]
CANARIES = {
    "WANDB_API_KEY": "canary-wandb-9d1e",
    "HF_TOKEN": "canary-hf-51aa",
    "AWS_SECRET_ACCESS_KEY": "canary-aws-0c3f",
    "DB_PASSWORD": "canary-db-77e2",
    "MY_PRIVATE_KEY": "canary-key-e4b0",
}


def script_for(profile: ClusterProfile, run_dir: Path = Path("/runs/r")) -> str:
    return batch_script("r", run_dir, profile, Path("/work"), "/venv/bin/python")


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 0), (2, 0), (4, 8), (16, 4)])
def test_script_runs_one_task_per_node_with_torchrun_ranks(nodes: int, gpus: int) -> None:
    profile = ClusterProfile(nodes=nodes, gpus_per_node=gpus, cpus_per_task=8)
    text = script_for(profile)
    ranks = gpus or 1
    assert f"#SBATCH --nodes={nodes}\n" in text
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert ("#SBATCH --gpus-per-node=" in text) == bool(gpus)
    if gpus:
        assert f"#SBATCH --gpus-per-node={gpus}\n" in text
    (srun,) = [line.strip() for line in text.splitlines() if line.strip().startswith("srun ")]
    assert f"--nodes={nodes} --ntasks={nodes} --ntasks-per-node=1" in srun
    assert "--cpus-per-task=8" in srun
    assert (
        f"launch.slurm.job node --run-dir /runs/r --nnodes={nodes} --nproc-per-node={ranks} "
        '--try="$tries"'
    ) in srun
    assert srun.endswith(" &")  # in the background, so the shell's traps can run
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"' in text
    assert text.index("launch.slurm.job check") < text.index("srun ")


def test_torchrun_uses_c10d_rendezvous_hosted_by_the_first_node() -> None:
    first = torchrun_command("py", Path("/r"), 4, 8, "node1:23456", "77-0", is_host=True)
    other = torchrun_command("py", Path("/r"), 4, 8, "node1:23456", "77-0", is_host=False)
    for cmd in (first, other):
        assert "--rdzv_backend=c10d" in cmd and "--rdzv_endpoint=node1:23456" in cmd
        assert "--nnodes=4" in cmd and "--nproc_per_node=8" in cmd and "--rdzv_id=77-0" in cmd
        assert cmd[cmd.index("launch.cli") :] == [
            "launch.cli", "train", "--config", "/r/config.yaml", "run.dir=/r",
        ]  # fmt: skip
    assert "--rdzv_conf=is_host=1,join_timeout=600" in first
    assert "--rdzv_conf=is_host=0,join_timeout=600" in other
    # the rendezvous waits train.dist_timeout_s for every node (whole seconds, rounded up)
    short = torchrun_command("py", Path("/r"), 2, 8, "n1:1", "7", True, join_timeout_s=12.5)
    assert "--rdzv_conf=is_host=1,join_timeout=13" in short


def test_ranks_are_bound_near_their_gpu_where_the_profile_asks() -> None:
    """numa_binding goes from the profile to each node's torchrun (--numa-binding); without
    it, nothing is bound."""
    bound = ClusterProfile(nodes=2, gpus_per_node=8, numa_binding="node")
    assert not bound.problems()
    (srun,) = [ln for ln in script_for(bound).splitlines() if ln.strip().startswith("srun ")]
    assert srun.rstrip(" &").endswith("--numa-binding=node")
    (plain,) = [
        ln for ln in script_for(ClusterProfile(nodes=2, gpus_per_node=8)).splitlines()
        if ln.strip().startswith("srun ")
    ]  # fmt: skip
    assert "numa" not in plain
    cmd = torchrun_command("py", Path("/r"), 2, 8, "n1:1", "7-0", True, numa_binding="node")
    assert cmd.index("--numa-binding=node") < cmd.index("launch.cli")
    assert not any("numa" in a for a in torchrun_command("py", Path("/r"), 2, 8, "n1:1", "7", True))
    assert load_profile("gpu-example").numa_binding == "node"
    # torchrun of the pinned torch takes the option and the mode
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True, text=True
    ).stdout
    assert "--numa-binding" in out and "node" in out
    # the modes a profile may name are the pinned torch's, all of them
    from torch.numa.binding import AffinityMode

    assert set(NUMA_BINDING_MODES) == {mode.value for mode in AffinityMode}


def test_signal_requeue_and_log_lines(tmp_path: Path) -> None:
    text = script_for(ClusterProfile(signal_seconds=120, time="1-00:00:00"), tmp_path / "run")
    for line in (
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --time=1-00:00:00",
        f"#SBATCH --output={tmp_path}/run/logs/slurm-%j.out",
        "#SBATCH --chdir=/work",
        """trap 'stopping=1; [ -n "$step" ] && kill -USR1 "$step" 2>/dev/null' USR1""",
        '    scontrol requeue "$SLURM_JOB_ID"',
    ):
        assert line + "\n" in text, line
    # requeue only after the ranks saved and stopped on a signal (the run's exit code 75, as
    # summary.json says), and not when the job is being cancelled (TERM)
    assert "    /venv/bin/python -m launch.slurm.job outcome --run-dir " in text
    assert 'if [ "$rc" -eq 75 ] && [ "$requeue" -eq 1 ]; then' in text
    assert (
        """trap 'requeue=0; stopping=1; [ -n "$step" ] && kill -TERM "$step" 2>/dev/null' TERM"""
        in text
    )
    assert text.index("trap ") < text.index("launch.slurm.job check")
    assert (
        text.index("slurm.job outcome")
        < text.index('[ "$requeue" -eq 1 ]')
        < text.index("scontrol requeue")
    )
    # a bad config exits before srun, with check's exit code (2)
    assert "launch.slurm.job check --run-dir " in text and "|| exit $?" in text
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_profile_env_setup_and_scheduler_options_in_order() -> None:
    profile = ClusterProfile(
        partition="gpu",
        account="proj1",
        qos="high",
        constraint="h100",
        mem="0",
        env={"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN", "WEIRD": "a b'c"},
        setup=["module load cuda/12.4", "source /opt/venv/bin/activate"],
        sbatch_args=["--exclusive"],
    )
    text = script_for(profile)
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj1",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100",
        "#SBATCH --mem=0",
        "#SBATCH --exclusive",
        "export OMP_NUM_THREADS=8",
        "export NCCL_DEBUG=WARN",
        "export WEIRD='a b'\"'\"'c'",  # quoted: values are literal
        "module load cuda/12.4",
        "source /opt/venv/bin/activate",
    ):
        assert line + "\n" in text, line
    assert text.index("export OMP_NUM_THREADS") < text.index("module load") < text.index("srun ")
    assert "--partition" not in script_for(ClusterProfile())


def test_secrets_never_reach_the_script(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "gpu-example",
        "--dry-run", f"data.dir={data_dir}", cwd=tmp_path, env=CANARIES,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and "srun " in proc.stdout
    for name, value in CANARIES.items():
        assert name not in proc.stdout and value not in proc.stdout
    assert not (tmp_path / "runs").exists()  # --dry-run writes nothing


@pytest.mark.parametrize(
    ("profile_text", "key"),
    [
        ("env:\n  WANDB_API_KEY: abc\n", "cluster.env.WANDB_API_KEY"),
        ("env:\n  hf_token: abc\n", "cluster.env.hf_token"),
        ("env:\n  DB_PASSWORD: abc\n", "cluster.env.DB_PASSWORD"),
        ("setup:\n  - export GITHUB_TOKEN=abc\n", "cluster.setup[0]"),
        ("sbatch_args:\n  - --export=ALL,MY_SECRET=abc\n", "cluster.sbatch_args[0]"),
        ("nodes: 0\n", "cluster.nodes"),
        ("gpus_per_node: -1\n", "cluster.gpus_per_node"),
        ("time: soon\n", "cluster.time"),
        ("gpus_per_node: 8\nnuma_binding: nearby\n", "cluster.numa_binding"),
        ("numa_binding: node\n", "cluster.numa_binding"),  # CPU nodes: no GPU to be near
        ("nodez: 2\n", "cluster.nodez"),
        ("nodes: many\n", "cluster.nodes"),
        ("env:\n  1BAD: x\n", "cluster.env.1BAD"),
        ("sbatch_args:\n  - exclusive\n", "cluster.sbatch_args[0]"),
        # what sbatch's own #SBATCH parser cannot take: an odd quote, a '#', a backslash
        ("partition: 'gpu\"x'\n", "cluster.partition"),
        ('account: "proj\'1"\n', "cluster.account"),
        ("qos: 'high#low'\n", "cluster.qos"),
        ("constraint: 'a\\\\b'\n", "cluster.constraint"),
        ("sbatch_args:\n  - --comment=it's\n", "cluster.sbatch_args[0]"),
        ("sbatch_args:\n  - '--comment=a#b'\n", "cluster.sbatch_args[0]"),
    ],
)
def test_bad_profile_exits_2_naming_the_key(
    tmp_path: Path, data_dir: Path, profile_text: str, key: str
) -> None:
    profile = tmp_path / "bad.yaml"
    profile.write_text(profile_text)
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", str(profile),
        "--run-dir", str(tmp_path / "run"), f"data.dir={data_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"paperscale: error: {key}:")
    assert "abc" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ['my"run', "my#run", "it's", "back\\slash"])
def test_a_run_name_sbatch_cannot_parse_is_refused(
    tmp_path: Path, data_dir: Path, name: str
) -> None:
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local",
        "--dry-run", f"data.dir={data_dir}", f"run.name={name}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("paperscale: error: run.name: holds ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cluster", "no-such-cluster"], "--cluster: no cluster profile 'no-such-cluster'"),
        (["--cluster", "local", "optim.lr=-1"], "optim.lr"),
        (["--cluster", "local", "train.precision=fp16"], "train.precision"),  # CPU profile
        (["--cluster", "local", "--nodes", "0"], "cluster.nodes"),
        (["--cluster", "local", "--time", "tomorrow"], "cluster.time"),
        (["--cluster", "local", "data.dir=/no/such/dir"], "data.dir"),
    ],
)
def test_submit_validates_before_anything(
    tmp_path: Path, data_dir: Path, args: list[str], needle: str
) -> None:
    options = [a for i, a in enumerate(args) if a.startswith("--") or args[i - 1][:2] == "--"]
    overrides = [a for a in args if a not in options]
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--run-dir",
        str(tmp_path / "run"), *options, f"data.dir={data_dir}", *overrides, cwd=tmp_path,
        env={"PATH": "/nonexistent"},  # no sbatch: it must never get that far
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_submit_without_sbatch_is_one_line(tmp_path: Path, data_dir: Path) -> None:
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local",
        "--run-dir", str(tmp_path / "run"), f"data.dir={data_dir}", cwd=tmp_path,
        env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert proc.returncode == 2 and "sbatch not found" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_shipped_profiles_load() -> None:
    local = load_profile("local")
    assert local.gpus_per_node == 0 and local.ranks_per_node() == 2
    gpu = load_profile(str(ROOT / "configs/clusters/gpu-example.yaml"))
    assert gpu.ranks_per_node() == gpu.gpus_per_node == 8
    assert load_profile("local", {"nodes": 3, "time": None}).nodes == 3
    with pytest.raises(ConfigError, match="no cluster profile"):
        load_profile("configs/clusters/none.yaml")


def test_status_without_a_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slurm.json").write_text(json.dumps({"job_id": "4242"}))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    status = run_status(tmp_path)
    assert status["slurm"] == {"job_id": "4242", "scheduler": None, "state": "no scheduler"}
    assert "slurm job        4242: no scheduler" in format_status(status)
    assert run_status(tmp_path / "missing")["slurm"] is None


def test_submit_refuses_a_run_dir_it_cannot_resume(tmp_path: Path, data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints/latest").write_text("step_00000010\n")  # names no checkpoint dir
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local",
        "--run-dir", str(run_dir), f"data.dir={data_dir}", cwd=tmp_path,
        env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith("paperscale: error: checkpoint:")
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]


def test_dry_run_prints_the_script_before_the_data_is_prepared(tmp_path: Path) -> None:
    missing = tmp_path / "not-prepared-yet"
    proc = run_cli(
        "submit", "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local",
        "--run-dir", str(tmp_path / "run"), "--dry-run", f"data.dir={missing}", cwd=tmp_path,
        env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and "launch.slurm.job node" in proc.stdout
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("paperscale: warning:")]
    assert len(warnings) == 1 and "data.dir" in warnings[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_signal_lead_time_covers_a_slow_save() -> None:
    from launch.cost_model.save import save_plan, signal_lead_seconds

    quick = save_plan(63_000_000, 2, 8, 8, "bf16")  # the base model on one 8-GPU node
    assert signal_lead_seconds(quick.seconds, 90) == 90  # under a second: the profile's
    slow = save_plan(213_000_000, 2, 8, 8, "bf16", write_gbs=0.05)  # a slow file system
    assert slow.seconds > 50 and signal_lead_seconds(slow.seconds, 90) >= 3 * slow.seconds
