"""Installs tfp_autobatch, the recursive NUTS kernel and their tools."""
import setuptools

setuptools.setup(
    name="tfp_autobatch",
    version="0.1.0",
    description=("Program-counter autobatching of recursive, control-heavy "
                 "TensorFlow programs, and a batched recursive NUTS kernel."),
    # `benchmarks` is not installed: it runs from a checkout
    # (`python -m benchmarks.nuts` in the repository root), and a top-level
    # package of that name in site-packages could shadow a user's own.
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
                 "matplotlib>=3.8", "arviz>=0.21,<1", "import-linter>=2.1"],
        "bench": ["matplotlib>=3.8", "tqdm>=4.66"],
        # Stan's NUTS as a peer in benchmarks/nuts.py (needs a C++ compiler).
        "stan": ["pystan>=3.10"],
    },
)
