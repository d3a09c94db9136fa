"""A real Slurm on this machine for the tests: munged, slurmctld and slurmd(s) in a temp dir.

`LocalSlurm` installs the Debian packages when they are missing (apt-get, needs root), writes a
slurm.conf with its own ports, state and spool dirs, starts every daemon in the foreground as a
child process and stops each one by its pid. With `netns_nodes=N` the cluster has N nodes, each
slurmd in its own network namespace (a veth pair on a bridge, its own address) and its own UTS
namespace (its own host name), so that a multi-node job really talks over a network; and, as
real nodes are, with an interface that reaches no other node listed first and its own host name
on 127.0.1.1 in its hosts file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from trainer.dist import free_port

# The daemons and commands without slurm-wlm's optional plugins (a third of the download).
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
DAEMONS = ["/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"]


INSTALL_LOCK = Path("/tmp/paperscale-slurm-install.lock")


def installed() -> bool:
    return all(Path(d).exists() for d in DAEMONS) and shutil.which("sbatch") is not None


def ensure_installed(log: list[str]) -> float:
    """Install Slurm and munge through apt when missing; returns the seconds it took. Test
    processes that need it at the same time install it one after another (apt holds a lock
    of its own and fails the second instead of waiting)."""
    if installed():
        return 0.0
    if os.geteuid() != 0:
        raise RuntimeError("Slurm is not installed and installing it needs root (apt-get)")
    with INSTALL_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return 0.0
        return _install(log)


def _install(log: list[str]) -> float:
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    for cmd in (["apt-get", "update", "-qq"], install):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    seconds = time.monotonic() - started
    log.append(f"apt-get install {' '.join(PACKAGES)}: {seconds:.1f} s")
    return seconds


def mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


class LocalSlurm:
    """One Slurm cluster; `env()` is the environment in which sbatch & co. talk to it."""

    def __init__(self, netns_nodes: int = 0) -> None:
        self.netns_nodes = netns_nodes
        # Under /tmp and world-traversable: munged runs as user munge and must reach its socket.
        self.dir = Path(tempfile.mkdtemp(prefix="paperscale-slurm-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.conf = self.dir / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.tag = f"{os.getpid() % 100000}"
        # Job ids of this cluster start here, so that clusters started by concurrent test
        # processes on one host never hand out the same ids at the same time.
        self.first_job_id = 1000 + (os.getpid() % 10000) * 100 + 50 * bool(netns_nodes)
        self.held: dict[int, socket.socket] = {}  # listening sockets of hold_ports()
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.nodes: list[str] = []

    # --------------------------------------------------------------------------- set-up

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _munge(self) -> Path:
        sock_dir, key_dir = self.dir / "munge", self.dir / "munge-key"
        sock_dir.mkdir()
        key_dir.mkdir()
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        for path, mode in ((sock_dir, 0o755), (key_dir, 0o700), (key, 0o400)):
            shutil.chown(path, "munge", "munge")
            path.chmod(mode)
        socket_path = sock_dir / "munge.socket"
        self._start(
            [
                "/usr/sbin/munged",
                "--foreground",
                f"--socket={socket_path}",
                f"--key-file={key}",
                f"--pid-file={sock_dir / 'munged.pid'}",
                f"--seed-file={sock_dir / 'munged.seed'}",
                f"--log-file={sock_dir / 'munged.log'}",
            ],
            "munged",
            user="munge",
        )
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self.logs()}")
            time.sleep(0.1)
        return socket_path

    def _network(self) -> str:
        """A bridge with one veth pair per node; returns the controller's address."""
        bridge = f"psbr{self.tag}"
        self._ip("link", "add", bridge, "type", "bridge")
        self.links.append(bridge)
        self._ip("addr", "add", f"{self.subnet}.1/24", "dev", bridge)
        self._ip("link", "set", bridge, "up")
        hosts = ["127.0.0.1 localhost", f"{self.subnet}.1 {socket.gethostname()}"]
        addresses = {name: f"{self.subnet}.{i + 2}" for i, name in enumerate(self.nodes)}
        for i, name in enumerate(self.nodes):
            ns, outer, inner = f"{name}-ns", f"psv{self.tag}{i}", f"psv{self.tag}{i}p"
            self._ip("netns", "add", ns)
            self.namespaces.append(ns)
            # As real nodes are: an interface that reaches no other node, listed first (a
            # management network, docker0), and the node's own name on 127.0.1.1 in its hosts
            # file, as Debian writes it.
            wrong, wrong_peer = f"psw{self.tag}{i}", f"psw{self.tag}{i}p"
            self._ip("-n", ns, "link", "add", wrong, "type", "veth", "peer", "name", wrong_peer)
            self._ip("-n", ns, "addr", "add", f"10.254.{i}.1/24", "dev", wrong)
            self._ip("-n", ns, "link", "set", wrong, "up")
            self._ip("-n", ns, "link", "set", wrong_peer, "up")
            own = [f"127.0.1.1 {name}"]
            own += [f"{addr} {other}" for other, addr in addresses.items() if other != name]
            (self.dir / f"hosts-{name}").write_text("\n".join([*hosts, *own]) + "\n")
            self._ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self.links.append(outer)
            self._ip("link", "set", inner, "netns", ns)
            self._ip("link", "set", outer, "master", bridge)
            self._ip("link", "set", outer, "up")
            self._ip("-n", ns, "addr", "add", f"{self.subnet}.{i + 2}/24", "dev", inner)
            self._ip("-n", ns, "link", "set", inner, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
        return f"{self.subnet}.1"

    def _ip(self, *args: str) -> None:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

    def _write_conf(self, munge_socket: Path, ctld_addr: str) -> None:
        host = socket.gethostname()
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir()
        for name in self.nodes:
            (d / "spool" / name).mkdir()
        lines = [
            "ClusterName=paperscale",
            f"FirstJobId={self.first_job_id}",
            f"SlurmctldHost={host}({ctld_addr})",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/%n/slurmd.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SlurmUser=root",
            "SlurmdUser=root",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MinJobAge=3600",  # finished jobs stay visible to `scontrol show job`
            "KillWait=30",
            "InactiveLimit=0",
            # Jobs of a higher partition tier preempt lower ones by requeuing them (the job
            # gets TERM, then KILL after KillWait), as on clusters with a preemptible queue.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
        ]
        if self.netns_nodes:
            lines += [
                f"NodeName={name} NodeAddr={self.subnet}.{i + 2} CPUs=1 RealMemory=1000 "
                "State=UNKNOWN"
                for i, name in enumerate(self.nodes)
            ]
        else:
            cpus = os.cpu_count() or 1
            lines.append(
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} "
                f"RealMemory={int(mem_mb() * 0.9)} State=UNKNOWN"
            )
        lines += [
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
            "PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1",
            "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, cmd: list[str], name: str, user: str | None = None) -> subprocess.Popen:
        out = open(self.dir / f"{name}.out", "w")  # noqa: SIM115 -- kept open while it runs
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env(),
            user=user,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 120) -> None:
        munge_socket = self._munge()
        if self.netns_nodes:
            self.nodes = [f"ps{self.tag}n{i + 1}" for i in range(self.netns_nodes)]
            ctld_addr = self._network()
        else:
            self.nodes = [socket.gethostname()]
            ctld_addr = "127.0.0.1"
        self._write_conf(munge_socket, ctld_addr)
        self._start(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        if self.netns_nodes:
            for name in self.nodes:
                # the node's network; its own host name and /etc/hosts; the host's /sys (slurmd
                # wants the cgroup mounts, which `ip netns exec` would hide)
                inner = (
                    f"mount --bind {self.dir / f'hosts-{name}'} /etc/hosts && hostname {name} && "
                    f"exec /usr/sbin/slurmd -D -N {name} -f {self.conf}"
                )
                self._start(
                    [
                        *("nsenter", f"--net=/run/netns/{name}-ns"),
                        *("unshare", "--mount", "--uts", "sh", "-c", inner),
                    ],
                    f"slurmd-{name}",
                )
        else:
            self._start(["/usr/sbin/slurmd", "-D", "-f", str(self.conf)], "slurmd")
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {self.logs()}")
            states = self.query(["sinfo", "-h", "-N", "-o", "%N %T"]) or ""
            # one line per node and partition: every node must be there and idle
            node_states = dict(x.split()[:2] for x in states.splitlines() if x.strip())
            if len(node_states) == len(self.nodes) and set(node_states.values()) == {"idle"}:
                return
            time.sleep(0.3)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s ({states!r}): {self.logs()}")

    def query(self, cmd: list[str]) -> str | None:
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=60)
        return proc.stdout if proc.returncode == 0 else None

    def logs(self, tail: int = 1500) -> str:
        out = []
        for path in sorted([*self.dir.glob("*.out"), *self.dir.glob("log/*.log")]):
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name}\n{path.read_text()[-tail:]}")
        return "\n".join(out)

    def hold_ports(self, ports: list[int]) -> list[int]:
        """Listen on each port (all addresses) until `stop()`, as another program would;
        returns those of `ports` held now (one that something else holds is left to it)."""
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("", port))
                sock.listen()
            except OSError:
                sock.close()
                continue
            self.held[port] = sock
        return [p for p in ports if p in self.held]

    # ------------------------------------------------------------------------- tear-down

    def stop(self) -> None:
        """Cancel what is left, stop every daemon by pid, remove namespaces and links."""
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env(), timeout=30)
            time.sleep(0.5)
        for proc in reversed(self.procs):  # slurmd(s), slurmctld, then munged
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        for sock in self.held.values():
            sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)
