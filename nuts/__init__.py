"""A recursive No-U-Turn Sampler, batched over chains by tfp_autobatch."""
from nuts.kernel import NoUTurnSampler
from nuts.kernel import NUTSKernelResults

__all__ = ["NoUTurnSampler", "NUTSKernelResults"]
