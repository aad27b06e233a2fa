"""Installs tfp_autobatch, the recursive NUTS kernel and their tools."""
import setuptools

setuptools.setup(
    name="tfp_autobatch",
    version="0.1.0",
    description=("Program-counter autobatching of recursive, control-heavy "
                 "TensorFlow programs, and a batched recursive NUTS kernel."),
    # `benchmarks` and `examples` are not installed: they run from a
    # checkout (`python -m benchmarks.nuts` in the repository root), and
    # top-level packages of those names in site-packages could shadow a
    # user's own.
    packages=setuptools.find_packages(include=["tfp_autobatch*", "nuts*"]),
    python_requires=">=3.10",
    install_requires=[
        # `tensorflow`, not `tensorflow-cpu`: tf-keras requires `tensorflow`,
        # so naming the CPU build installed both into one package folder.
        "tensorflow==2.21.*",
        "tensorflow-probability==0.25.*",
        "tf-keras==2.21.*",
        "numpy>=1.26",
        "absl-py>=2.0",
        "gast>=0.5",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100",
                 "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
                 "matplotlib>=3.8", "import-linter>=2.1", "tqdm>=4.66",
                 # Both ArviZ APIs side by side, so that nuts.inference_data
                 # is tested with each: 0.x as `arviz` (which the tutorial's
                 # plots use), 1.x as arviz-base + arviz-stats (Python 3.11+).
                 "arviz>=0.21,<1",
                 "arviz-base>=0.8; python_version >= '3.11'",
                 "arviz-stats>=0.8; python_version >= '3.11'",
                 # benchmarks/ess_models.py's models (tests/test_benchmarks_ess.py)
                 "inference-gym>=0.0.5"],
        # inference-gym: the ESS benchmark's models (their data ship with it).
        "bench": ["matplotlib>=3.8", "tqdm>=4.66", "arviz>=0.21",
                  "inference-gym>=0.0.5"],
        # Stan's NUTS as a peer in benchmarks/nuts.py (needs a C++ compiler).
        "stan": ["pystan>=3.10"],
        # DyNet's on-the-fly batching as a peer in benchmarks/neural.py.
        "dynet": ["dynet38"],
    },
)
