"""Resident warps per SM from a kernel's resources (the MAX_ACT_WARP/SM of paper 003's equation 1)."""
from __future__ import annotations


def active_warps_per_sm(registers: int, shared_bytes: int, block: int, threads_per_sm: int = 2048,
                        registers_per_sm: int = 65536, shared_bytes_per_sm: int = 233472,
                        blocks_per_sm: int = 32) -> int:
    """Warps of one kernel resident on one SM, limited by threads, registers, shared memory and blocks.

    Registers are allocated per warp in units of 256; each block also reserves 1 KB of shared memory.

    Example:
        >>> active_warps_per_sm(registers=32, shared_bytes=0, block=256)
        64
        >>> active_warps_per_sm(registers=128, shared_bytes=0, block=256)
        16
    """
    warps_per_block = -(-block // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = registers_per_sm // (regs_per_warp * warps_per_block)
    by_threads = threads_per_sm // block
    by_shared = shared_bytes_per_sm // (shared_bytes + 1024)
    blocks = max(0, min(by_regs, by_threads, by_shared, blocks_per_sm))
    return blocks * warps_per_block
