"""Starting the ranks of a run on several GPUs: as one rank of an ``mpirun`` job (``--distributed``), or by
spawning them (``--gpus N`` runs the same command as N ranks through ``mpiexec``)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .. import gpu


def rank_comm(device: int | None = None):
    """This process's rank of the MPI job it was started in, with NCCL between the job's GPUs (one per rank:
    rank modulo the GPUs present, unless ``device``).

    Example (under ``mpirun -n 4``):
        >>> comm = rank_comm(); comm.rank, comm.size  # doctest: +SKIP
        (2, 4)
    """
    from .comm import MpiComm
    from .nccl import NcclComm
    return NcclComm(MpiComm(), device)


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--gpus 4`` or ``--gpus=4``).

    Example:
        >>> without_option(["pagerank", "g.npz", "--gpus", "4", "--top", "5"], "--gpus")
        ['pagerank', 'g.npz', '--top', '5']
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def spawn(gpus: int, argv: list[str]) -> int:
    """Run ``python -m tuner ARGV --distributed`` as ``gpus`` MPI ranks (one per GPU) and return its exit code.

    Example (on a machine with 4 GPUs, Open MPI or MPICH, and mpi4py):
        >>> spawn(4, ["pagerank", "rmat:25"])  # doctest: +SKIP
        0
    """
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    present = gpu.device_count()
    if present < gpus:
        raise ValueError(f"--gpus {gpus} asks for more GPUs than this machine has ({present})")
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        raise OSError("--gpus starts one MPI rank per GPU with mpiexec, which is not on PATH: install Open MPI or "
                      "MPICH and the mpi extra (pip install 'sparse-tuner[mpi]')")
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers run as root; Open MPI refuses unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [mpiexec, "-n", str(gpus), sys.executable, "-m", "tuner", *argv, "--distributed"]
    return subprocess.call(command, env=env)
