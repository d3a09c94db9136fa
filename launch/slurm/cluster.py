"""Cluster profiles: where and how `paperscale submit` runs a job on Slurm.

A profile is one YAML file in `configs/clusters/` whose keys are the fields of
`ClusterProfile`. Command-line options of `submit` override single fields. Secrets never go into
a profile: the batch script is a file anyone with access to the run dir can read, so a key such
as `WANDB_API_KEY` is passed through the submitting environment (sbatch exports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launch.config import ConfigError

PROFILE_DIR = Path(__file__).resolve().parents[2] / "configs" / "clusters"

# Environment names that look like credentials; they never appear in a generated script.
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # Slurm's D-HH:MM:SS and its shorter forms


# The modes of torchrun's --numa-binding in the pinned torch (torch.numa.binding.AffinityMode,
# checked by tests/launch/test_slurm_script.py), named here so that checking a profile does not
# import torch.
NUMA_BINDING_MODES = ("node", "socket", "exclusive", "core-complex")


def numa_binding_problem(profile: ClusterProfile) -> str:
    """Why the profile's numa_binding cannot be used ('' when it can)."""
    modes = NUMA_BINDING_MODES
    if profile.numa_binding not in modes:
        return f"must be one of {', '.join(modes)} or null, got {profile.numa_binding!r}"
    if profile.gpus_per_node < 1:
        return "binds ranks to the CPUs near their GPU: GPU nodes only (gpus_per_node >= 1)"
    return ""


@dataclass
class ClusterProfile:
    """One Slurm cluster (or partition) and how a job uses its nodes."""

    name: str = "default"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str = "04:00:00"  # wall-clock limit, Slurm format (D-HH:MM:SS, HH:MM:SS, MM)
    nodes: int = 1
    gpus_per_node: int = 0  # 0: CPU ranks (DeepSpeed's CPU accelerator, gloo)
    procs_per_node: int | None = None  # ranks per node; default gpus_per_node, or 1 on CPUs
    cpus_per_task: int | None = None  # CPUs of the one task per node (all its ranks)
    mem: str | None = None  # memory per node, e.g. "64G"; "0" is all of it
    # each rank bound to the CPUs near its GPU: torchrun's --numa-binding mode (node, socket,
    # exclusive, core-complex; numactl on the nodes), GPU nodes only; null: unbound
    numa_binding: str | None = None
    signal_seconds: int = 90  # USR1 this long before the time limit: save and requeue
    # The c10d rendezvous port on the first node. 0: a port free there, chosen for every try;
    # a number (a firewall's opening): that port first, free ones if it fails.
    rendezvous_port: int = 0
    # requeues of a job whose step failed in a way torchrun's restarts could not mend (a node
    # lost, every restart used, a rendezvous that kept failing), counted by Slurm's restarts
    max_requeues: int = 3
    python: str | None = None  # interpreter on the nodes; default: the one running `submit`
    setup: list[str] = field(default_factory=list)  # shell lines first, e.g. "module load cuda"
    env: dict[str, str] = field(default_factory=dict)  # exported before training starts
    sbatch_args: list[str] = field(default_factory=list)  # more options, e.g. "--exclusive"

    def ranks_per_node(self) -> int:
        if self.procs_per_node is not None:
            return self.procs_per_node
        return self.gpus_per_node or 1

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key in ("nodes", "signal_seconds"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                out.append((key, f"must be a positive integer, got {value!r}"))
        if not isinstance(self.max_requeues, int) or self.max_requeues < 0:
            out.append(
                ("max_requeues", f"must be a non-negative integer, got {self.max_requeues!r}")
            )
        if not 0 <= self.rendezvous_port <= 65535:
            out.append(("rendezvous_port", f"must be 0 or a TCP port, got {self.rendezvous_port}"))
        if self.gpus_per_node < 0:
            out.append(("gpus_per_node", f"must be >= 0, got {self.gpus_per_node}"))
        for key in ("procs_per_node", "cpus_per_task"):
            value = getattr(self, key)
            if value is not None and value < 1:
                out.append((key, f"must be a positive integer or null, got {value!r}"))
        if self.numa_binding is not None and (why := numa_binding_problem(self)):
            out.append(("numa_binding", why))
        if not _TIME.match(self.time):
            out.append(("time", f"must be Slurm's [D-]HH:MM:SS (or MM, MM:SS), got {self.time!r}"))
        for key in ("name", "partition", "account", "qos", "constraint", "mem", "python"):
            value = getattr(self, key)
            if value is not None and (not value or any(c.isspace() for c in value)):
                out.append((key, f"must be a non-empty word without spaces, got {value!r}"))
            elif value is not None and (why := sbatch_value_problem(value)):
                out.append((key, why))
        for name in self.env:
            if not _ENV_NAME.match(name):
                out.append((f"env.{name}", "is not a valid environment variable name"))
            elif SECRET_NAME.search(name):
                out.append((f"env.{name}", SECRET_ADVICE))
        for i, line in enumerate(self.setup):
            if secret_assignment(line):
                out.append((f"setup[{i}]", SECRET_ADVICE))
            if "\n" in line:
                out.append((f"setup[{i}]", "must be one line"))
        for i, arg in enumerate(self.sbatch_args):
            if not arg.startswith("-") or "\n" in arg:
                out.append((f"sbatch_args[{i}]", f"must be one sbatch option, got {arg!r}"))
            elif why := sbatch_value_problem(arg):
                out.append((f"sbatch_args[{i}]", why))
            elif secret_assignment(arg):
                out.append((f"sbatch_args[{i}]", SECRET_ADVICE))
        return out


SECRET_ADVICE = (
    "looks like a secret; keep it out of cluster profiles and scripts "
    "(set it in the environment you submit from: sbatch passes it on)"
)


# What sbatch's #SBATCH parser cannot take in a value: it splits on whitespace, pairs quotes
# (an odd one makes it stop with "unmatched quote"), and a `#` may start a comment.
_SBATCH_UNSAFE = re.compile(r"""[\s'"#\\`]|[\x00-\x1f\x7f]""")


def sbatch_value_problem(value: str) -> str | None:
    """Why `value` cannot go into an #SBATCH line as written, or None."""
    bad = _SBATCH_UNSAFE.search(value)
    if bad is None:
        return None
    return (
        f"holds {bad.group()!r}, which #SBATCH lines cannot carry (no spaces, quotes, '#', "
        f"backslashes or control characters), got {value!r}"
    )


def secret_assignment(text: str) -> bool:
    """Whether `text` sets a variable whose name looks like a credential (`X_TOKEN=...`)."""
    return any(SECRET_NAME.search(name) for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", text))


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(spec: str) -> Path:
    """A profile file from a path, or from a bare name looked up in configs/clusters/."""
    path = Path(spec)
    if path.is_file():
        return path
    if "/" not in spec and not spec.endswith(".yaml") and (PROFILE_DIR / f"{spec}.yaml").is_file():
        return PROFILE_DIR / f"{spec}.yaml"
    known = ", ".join(known_profiles()) or "none"
    raise ConfigError("--cluster", f"no cluster profile {spec!r} (known: {known})")


def load_profile(spec: str | None, overrides: dict[str, object] | None = None) -> ClusterProfile:
    """Schema defaults <- profile file <- command-line options, type-checked and validated."""
    layers = [OmegaConf.structured(ClusterProfile)]
    try:
        if spec is not None:
            path = profile_path(spec)
            try:
                layers.append(OmegaConf.load(path))
            except Exception as exc:  # yaml syntax errors come in several types
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ConfigError("--cluster", f"cannot parse {path}: {first}") from None
        set_values = {k: v for k, v in (overrides or {}).items() if v is not None}
        if set_values:
            layers.append(OmegaConf.create(set_values))
        profile = OmegaConf.to_object(OmegaConf.merge(*layers))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if type(exc).__name__ == "ConfigKeyError" and key:
            msg = "unknown key"
        raise ConfigError(f"cluster.{key}" if key else "cluster", msg) from None
    assert isinstance(profile, ClusterProfile)
    problems = profile.problems()
    if problems:
        key, message = problems[0]
        raise ConfigError(f"cluster.{key}", message)
    return profile
