"""Products split among several ranks: the bitonic row partition, communicators (an in-process group of
threads, MPI ranks through mpi4py, NCCL between GPUs on device arrays), SpMV, SpGEMM and PageRank over them,
ranks given only their rows of a graph no GPU holds whole (``sharded_product``; ``generated_product`` for a
Kronecker graph no rank builds), and the launcher (``--distributed`` under mpirun, ``--gpus N``)."""
from .comm import Communicator, LocalGroup, MpiComm
from .launch import rank_comm, spawn
from .generated import generated_product
from .nccl import NcclComm, SoloDevice
from .pagerank import pagerank_on_devices, pull_product
from .partition import RowPartition, bitonic_partition
from .shard import sharded_product
from .spgemm import DistributedSpGEMM
from .spmv import DistributedSpMV, local_rows, split_own_columns

__all__ = ["Communicator", "DistributedSpGEMM", "DistributedSpMV", "LocalGroup", "MpiComm", "NcclComm", "RowPartition",
           "SoloDevice", "bitonic_partition", "generated_product", "local_rows", "pagerank_on_devices", "pull_product",
           "rank_comm", "sharded_product", "spawn", "split_own_columns"]
