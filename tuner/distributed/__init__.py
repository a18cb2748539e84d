"""Products split among several ranks (issue: several GPUs): the bitonic row partition, a communicator
interface with an in-process group, and SpMV over them. The MPI + NCCL communicator that puts the ranks on
GPUs of their own is not written yet."""
from .comm import Communicator, LocalGroup
from .partition import RowPartition, bitonic_partition
from .spmv import DistributedSpMV, local_rows

__all__ = ["Communicator", "DistributedSpMV", "LocalGroup", "RowPartition", "bitonic_partition", "local_rows"]
