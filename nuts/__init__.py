"""A recursive No-U-Turn Sampler, batched over chains by tfp_autobatch."""
from nuts.inference_data import summary
from nuts.inference_data import to_inference_data
from nuts.kernel import NoUTurnSampler
from nuts.kernel import NUTSKernelResults
from nuts.progress import SamplingInterrupted
from nuts.windowed import default_nuts_trace_fn
from nuts.windowed import windowed_adaptive_nuts

__all__ = ["NoUTurnSampler", "NUTSKernelResults", "windowed_adaptive_nuts",
           "default_nuts_trace_fn", "to_inference_data", "summary",
           "SamplingInterrupted"]
