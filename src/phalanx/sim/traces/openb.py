"""Alibaba GPU cluster trace v2023 ("openb"), as used by FGD (USENIX ATC'23).

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,
gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`. A pod with one GPU and
`gpu_milli < 1000` shares a GPU; otherwise it takes `num_gpu` whole GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, GpuRequest, Node, PodSet, TaskRequest, Workload
from phalanx.sim.traces.rows import read_rows

# GPU memory (MiB) per model, from the FGD artifact's table; undisclosed models (G1-G3) get 32 GiB.
GPU_MEMORY_MIB = {"T4": 15109, "V100M16": 16160, "P100": 16280, "A10": 22731, "V100M32": 32510, "A100": 81251}
DEFAULT_GPU_MEMORY_MIB = 32768


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]
    creation_time: float
    deletion_time: float
    line: int
    qos: str = ""  # LS (latency-sensitive services), BE (best effort), Burstable, Guaranteed

    @property
    def request(self) -> TaskRequest:
        if self.num_gpu == 0:
            gpu = GpuRequest.none()
        elif self.num_gpu == 1 and self.gpu_milli < 1000:
            gpu = GpuRequest.fraction(self.gpu_milli / 1000)
        else:
            gpu = GpuRequest.whole(self.num_gpu)
        return TaskRequest(self.cpu_milli, self.memory_mib, gpu, gpu_models=self.gpu_spec)

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000

    def workload(
        self, name: str | None = None, creation_time: float = 0.0, preemptible: bool = True
    ) -> Workload:
        return Workload(
            name or self.name,
            (PodSet("pod", 1, self.request),),
            creation_time=creation_time,
            preemptible=preemptible,
        )


def load_nodes(path: str | Path, include_cpu_nodes: bool = True) -> list[Node]:
    nodes = []
    for row in read_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        ngpu = row.int("gpu")
        model = row.text("model", "")
        if ngpu and not model:
            raise SpecError(row.where, f"node has {ngpu} GPUs but no model")
        if not ngpu and not include_cpu_nodes:
            continue
        mem = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
        gpus = tuple(Gpu(j, model, mem) for j in range(ngpu))
        # the row's own errors name file:line already; only the Node's need it prepended
        name, cpu, mem_mib = row.text("sn"), row.int("cpu_milli"), row.int("memory_mib")
        try:
            nodes.append(Node(name, cpu, mem_mib, gpus))
        except SpecError as e:
            raise e.located(row.where) from None
    if not nodes:
        raise SpecError(str(path), "no nodes in file")
    return nodes


def load_pods(path: str | Path) -> list[OpenbPod]:
    pods = []
    names: set[str] = set()
    for row in read_rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num = row.int("num_gpu")
        milli = row.int("gpu_milli", default=0)
        if num > 0 and not 0 < milli <= 1000:
            raise SpecError(row.where, f"gpu_milli must be in 1..1000 for a GPU pod, got {milli}")
        if num > 1 and milli != 1000:
            raise SpecError(row.where, f"a {num}-GPU pod must take whole GPUs (gpu_milli 1000), got {milli}")
        name = row.text("name")
        if name in names:
            raise SpecError(row.where, f"duplicate pod name {name!r}")
        names.add(name)
        spec = frozenset(x for x in row.text("gpu_spec", "").split("|") if x)
        pods.append(
            OpenbPod(
                name,
                row.int("cpu_milli"),
                row.int("memory_mib"),
                num,
                milli if num else 0,
                spec,
                row.float("creation_time", 0.0, None),
                row.float("deletion_time", 0.0, None),
                row.line,
                row.text("qos", ""),
            )
        )
    if not pods:
        raise SpecError(str(path), "no pods in file")
    return pods
