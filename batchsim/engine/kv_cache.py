"""The paged KV cache: a pool of fixed-size blocks and who holds how many.

Only counts are simulated (no block tables): a request holds ``ceil(tokens / block_size)``
blocks for the tokens it has computed or reserved. Capacity comes from memory:
``(memory x gpu_memory_utilization - weights - activation reserve) / bytes per block``, per GPU
under tensor parallelism (each GPU holds its share of every block).

This module imports only :mod:`batchsim.engine.request` and :mod:`batchsim.errors`.
"""

from __future__ import annotations

from batchsim.engine.request import Request
from batchsim.errors import ConfigError


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


def kv_capacity_blocks(
    *,
    memory_bytes: float,
    gpu_memory_utilization: float,
    weight_bytes: float,
    activation_reserve_bytes: float,
    block_bytes: float,
) -> int:
    """Number of KV blocks that fit on one GPU.

    Args:
        memory_bytes: GPU memory capacity (bytes).
        gpu_memory_utilization: Fraction of it the engine may use (0-1].
        weight_bytes: Weights held by one GPU (bytes).
        activation_reserve_bytes: Peak activation memory kept free for the forward pass.
        block_bytes: KV bytes of one block on one GPU.

    Raises:
        ConfigError: The weights and activation reserve leave no room for a single block.
    """
    free = memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
    blocks = int(free // block_bytes) if block_bytes > 0 else 0
    if blocks < 1:
        raise ConfigError(
            f"model does not fit: {memory_bytes * gpu_memory_utilization / 1e9:.1f} GB usable "
            f"per GPU (engine.gpu_memory_utilization={gpu_memory_utilization}) minus "
            f"{weight_bytes / 1e9:.1f} GB of weights and {activation_reserve_bytes / 1e9:.1f} GB "
            "activation reserve leaves no KV cache; use a larger GPU, "
            "parallel.tensor_parallel_size, or a smaller engine.dtype"
        )
    return blocks


class KVCacheManager:
    """Block accounting for the whole engine: the GPU pool and the host swap space.

    Args:
        num_blocks: Total blocks in the GPU pool.
        block_size: Tokens per block.
        num_cpu_blocks: Blocks of host memory for swapped-out requests (vLLM's
            ``swap_space``).
    """

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0):
        assert num_blocks >= 1 and block_size >= 1 and num_cpu_blocks >= 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free_blocks = num_blocks
        self.max_used_blocks = 0
        self.num_cpu_blocks = num_cpu_blocks
        self.num_free_cpu_blocks = num_cpu_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_needed(self, request: Request, num_tokens: int) -> int:
        """Extra blocks ``request`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, num_blocks_for(num_tokens, self.block_size) - request.num_blocks)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return num_blocks_for(num_tokens, self.block_size) <= self.num_blocks

    def allocate(self, request: Request, num_tokens: int) -> bool:
        """Grow ``request`` to ``num_tokens`` tokens; False (no change) if the pool is short."""
        need = num_blocks_for(num_tokens, self.block_size) - request.num_blocks
        if need <= 0:
            return True
        if need > self.num_free_blocks:
            return False
        self.num_free_blocks -= need
        request.num_blocks += need
        used = self.num_blocks - self.num_free_blocks
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        return True

    def take(self, num_blocks: int) -> None:
        """Account for ``num_blocks`` blocks that callers already assigned to requests
        (bulk growth of a decode stretch, checked beforehand to fit)."""
        self.num_free_blocks -= num_blocks
        assert self.num_free_blocks >= 0, "KV blocks over-committed"
        used = self.num_blocks - self.num_free_blocks
        if used > self.max_used_blocks:
            self.max_used_blocks = used

    def free(self, request: Request) -> None:
        """Return all of ``request``'s blocks (GPU and host) to their pools."""
        self.num_free_blocks += request.num_blocks
        request.num_blocks = 0
        self.num_free_cpu_blocks += request.num_cpu_blocks
        request.num_cpu_blocks = 0
        assert self.num_free_blocks <= self.num_blocks, "freed more KV blocks than allocated"
        assert self.num_free_cpu_blocks <= self.num_cpu_blocks, "freed more host blocks"

    def can_swap_out(self, request: Request) -> bool:
        """The host swap space can take all of ``request``'s GPU blocks."""
        return request.num_blocks <= self.num_free_cpu_blocks

    def swap_out(self, request: Request) -> int:
        """Move ``request``'s blocks to host memory; return how many were copied."""
        moved = request.num_blocks
        assert moved <= self.num_free_cpu_blocks, "host swap space over-committed"
        self.num_free_blocks += moved
        self.num_free_cpu_blocks -= moved
        request.num_cpu_blocks += moved
        request.num_blocks = 0
        return moved

    def can_swap_in(self, request: Request, num_tokens: int) -> bool:
        """The GPU pool can take ``request``'s swapped blocks and grow it to ``num_tokens``."""
        need = max(request.num_cpu_blocks, num_blocks_for(num_tokens, self.block_size))
        return need <= self.num_free_blocks

    def swap_in(self, request: Request, num_tokens: int) -> int:
        """Copy ``request``'s blocks back and grow it to ``num_tokens`` tokens; return how many
        blocks were copied. The caller checked :meth:`can_swap_in`."""
        moved = request.num_cpu_blocks
        self.num_free_cpu_blocks += moved
        request.num_cpu_blocks = 0
        request.num_blocks = 0
        grown = self.allocate(request, max(num_tokens, moved * self.block_size))
        assert grown, "swap-in without room"
        return moved
