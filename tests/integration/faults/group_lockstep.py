"""An engine group on one machine, with real processes: N refitd daemons (members 0..N-1 of one
group, each restartable with failpoints), each serving one rank of one engine (the example
engine, shm, --reconnect), the ranks running forward steps in lockstep over a shared-memory
barrier (tools/examples/lockstep.h) and logging each step's tag; a group refit is the example
trainer with --group feeding every member.

The lockstep checker: step n is the same forward step on every rank, so a step that mixed
versions shows as two tags for one n (mixed_steps())."""
import json
import subprocess
import time
from pathlib import Path

from conftest import REFITD, TRAINER, FaultNode, h, wait_for  # noqa: F401

REFITCTL = h.REFITCTL

# The demo model as an engine of two tensor-parallel ranks per member (example_engine --spec
# --tp-rank: each rank holds its shards of the attention matrices, the rest replicated).
TP2_SPEC = """model: demo-llama
tensor_parallel: {size: 2}
defaults:
  format: auto
rules:
  - match: "model.layers.{L}.self_attn.{q,k,v}_proj.weight"
    shard: {dim: 0}
  - match: "model.layers.{L}.self_attn.o_proj.weight"
    shard: {dim: 1}
"""


class RankedMember(FaultNode):
    """A member whose refitd serves several engine ranks (one example engine process each)."""

    def __init__(self, tmp, config, failpoints, ranks, rank_args, env=None):
        self.ranks = ranks
        self.rank_args = rank_args  # rank -> its lockstep arguments
        self.rank_engines = []
        super().__init__(tmp, config, failpoints, env=env)

    def start_engine(self):
        self.engines += 1
        spec = self.tmp / "spec.yaml"
        for r in range(self.ranks):
            log = self.tmp / f"engine.{self.engines}.rank{r}.log"
            shm = h.new_shm("group")
            self.shms.append(shm)
            proc = h.start_engine(self.address, log, "--shm", shm, "--reconnect", "--spec", spec, "--tp-rank", r,
                                  *self.rank_args[r], env=self.env, marker='"registered"')
            self.rank_engines.append(proc)
            if r == 0:
                self.engine, self.engine_log, self.shm = proc, log, shm
        self.wait_registered()

    def wait_registered(self):
        wait_for(lambda: "all_ranks_in=true" in self.log(), what="every engine rank registered with refitd")

    def stop(self):
        for p in self.rank_engines[1:]:
            h.stop(p, timeout=30)
        return super().stop()


class EngineGroup:
    def __init__(self, tmp: Path, members: int = 3, decision_ms: int = 1500, failpoints=None, hold: int = 2,
                 grouped: bool = True, ranks_per_member: int = 1, peers: bool = False,
                 peers_unreachable: str = "", gpu=None):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.size = members
        self.decision_ms = decision_ms
        self.ranks = members * ranks_per_member  # the engine's ranks, over every member
        self.barrier = tmp / "lockstep"
        self.barrier.write_bytes(b"\0" * (18 * self.ranks))  # lockstep.h Bytes()
        self.nodes = []
        self.tags = 0
        # peers: every member knows the others' addresses (group.addresses) and asks them for the
        # group's version when it starts joining (late join); peers_unreachable: what it does while
        # none answers (group.peers_unreachable; "" the default, hold).
        # gpu: {"device": D, "trainer_gpu": T, "env": {...} or None}: every member stages on GPU D
        # and takes the NCCL data plane, its engine's parameters in GPU D's memory, and the trainer
        # pushes from GPU T. With one GPU (env given) each member's refitd gets its own NCCL_HOSTID
        # (NCCL's socket transport over loopback), as the trainer does through this environment.
        self.gpu = gpu
        addresses = json.dumps([f"unix:{tmp / f'member{i}' / 'refitd.sock'}" for i in range(members)])
        for i in range(members):
            d = tmp / f"member{i}"
            d.mkdir()
            config = (f"hold: {hold}\n"
                      f"group: {{name: engine-a, members: {members}, member: {i}, decision_timeout_ms: {decision_ms}"
                      f"{f', addresses: {addresses}' if peers else ''}"
                      f"{f', peers_unreachable: {peers_unreachable}' if peers_unreachable else ''}}}\n"
                      if grouped else "")
            config += "engine: {pause_timeout_ms: 5000, resume_timeout_ms: 5000}\n"
            fp = (failpoints or {}).get(i, "")
            env, gpu_args = None, []
            if gpu is not None:
                config += f"staging: device\ndata_plane: {{transport: nccl, device: {gpu['device']}}}\n"
                env = {k: f"{v}-member{i}" if k == "NCCL_HOSTID" else v for k, v in (gpu["env"] or {}).items()}
                gpu_args = ["--gpu", gpu["device"]]
            if ranks_per_member == 1:
                args = gpu_args + ["--lockstep", self.barrier, "--lockstep-rank", i, "--lockstep-size", self.ranks,
                                   "--steps", d / "steps0"]
                self.nodes.append(FaultNode(d, config, fp, env=env, engine_args=[str(a) for a in args]))
                continue
            (d / "spec.yaml").write_text(TP2_SPEC.replace("size: 2", f"size: {ranks_per_member}"))
            config += f"model_spec: {d / 'spec.yaml'}\n"
            rank_args = {r: gpu_args + ["--lockstep", self.barrier, "--lockstep-rank", i * ranks_per_member + r,
                                        "--lockstep-size", self.ranks, "--steps", d / f"steps{r}"]
                         for r in range(ranks_per_member)}
            self.nodes.append(RankedMember(d, config, fp, ranks_per_member, rank_args, env=env))

    @property
    def addresses(self):
        return [n.address for n in self.nodes]

    def new_tag(self, prefix="g"):
        self.tags += 1
        return f"{prefix}{self.tags}"

    def refit(self, *args, refits=1, tag=None, timeout=120, check=True, deadline_ms=0, timeout_ms=0):
        """One trainer process: `refits` group refits tagged <tag>-0, <tag>-1, ... Returns
        (CompletedProcess, JSON lines)."""
        tag = tag or self.new_tag()
        cmd = [str(TRAINER), "--group", "--tag", tag, "--refits", str(refits), "--no-verify", "--seed",
               str(self.tags)]
        for a in self.addresses:
            cmd += ["--address", a]
        if self.gpu is not None:
            cmd += ["--gpu", str(self.gpu["trainer_gpu"])]
        if deadline_ms:
            cmd += ["--group-deadline-ms", str(deadline_ms)]
        if timeout_ms:
            cmd += ["--group-timeout-ms", str(timeout_ms)]
        p = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
        lines = h.json_lines(p.stdout)
        if check:
            assert p.returncode == 0, p.stdout + p.stderr
        return p, lines

    def fanout_refit(self, refits=1, timeout=120):
        """A plain fan-out (no group): every daemon commits on its own."""
        cmd = [str(TRAINER), "--refits", str(refits), "--no-verify", "--tag", self.new_tag("f")]
        for a in self.addresses:
            cmd += ["--address", a]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p, h.json_lines(p.stdout)

    # --- the lockstep checker ---
    def steps(self):
        """{(member, rank): {step: tag}} from every engine rank's steps log."""
        out = {}
        for i, n in enumerate(self.nodes):
            for path in sorted(n.tmp.glob("steps*")):
                rows = {}
                for line in path.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 2:
                        rows[int(parts[0])] = parts[1]
                out[(i, path.name)] = rows
        return out

    def mixed_steps(self):
        """Steps that ran with different tags on different ranks."""
        by_rank = self.steps()
        common = set.intersection(*(set(r) for r in by_rank.values())) if by_rank else set()
        return sorted(s for s in common if len({by_rank[r][s] for r in by_rank}) > 1)

    def step_count(self):
        return min(len(r) for r in self.steps().values())

    def last_step_tags(self):
        by_rank = self.steps()
        return {r: rows[max(rows)] if rows else None for r, rows in by_rank.items()}

    def wait_steps_with(self, tag, timeout=20.0):
        """Every rank runs steps again, all with `tag`'s weights."""
        start = self.step_count()
        wait_for(lambda: self.step_count() >= start + 3 and set(self.last_step_tags().values()) == {tag},
                 timeout=timeout, what=f"every rank stepping with '{tag}' (last steps: {self.last_step_tags()})")

    # --- status ---
    def status(self, i):
        p = subprocess.run([str(REFITCTL), "status", "--json", "--address", self.nodes[i].address],
                           capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout)

    def members_status(self):
        p = subprocess.run([str(REFITCTL), "status", "--json", "--members", ",".join(self.addresses)],
                           capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout)

    def restart(self, i, failpoints=""):
        """Kills member i's refitd (SIGKILL) if alive and starts it again; its engine registers again."""
        n = self.nodes[i]
        h.kill(n.daemon)
        n.start_daemon(failpoints)
        n.wait_registered()

    def restart_with_fresh_engine(self, i, daemon=True, failpoints=""):
        """Kills member i's engine rank processes and (`daemon`) its refitd (SIGKILL), then starts
        them again (refitd with `failpoints`): the new ranks hold their initial weights (no tag)
        while the group is at its version."""
        n = self.nodes[i]
        for p in getattr(n, "rank_engines", []) or [n.engine]:
            h.kill(p)
        if hasattr(n, "rank_engines"):
            n.rank_engines = []
        if daemon:
            h.kill(n.daemon)
            n.start_daemon(failpoints)
        n.start_engine()

    def close(self):
        for n in self.nodes:
            for p in getattr(n, "rank_engines", []):
                h.kill(p)
            h.kill(n.engine)
            h.kill(n.daemon)
            h.unlink_shm(*n.shms)


def wait_group(group, pred, what, timeout=20.0):
    wait_for(pred, timeout=timeout, what=what)


def elapsed_ms(t0):
    return (time.monotonic() - t0) * 1000
