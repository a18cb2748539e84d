"""Products split among several ranks: the bitonic row partition, the communicator interface (an in-process
group of threads, or MPI ranks through mpi4py with host-array collectives), and SpMV and SpGEMM over them. Collectives
on device arrays through NCCL, which several GPUs need to be fast, are not written yet."""
from .comm import Communicator, LocalGroup, MpiComm
from .partition import RowPartition, bitonic_partition
from .spgemm import DistributedSpGEMM
from .spmv import DistributedSpMV, local_rows

__all__ = ["Communicator", "DistributedSpGEMM", "DistributedSpMV", "LocalGroup", "MpiComm", "RowPartition", "bitonic_partition",
           "local_rows"]
