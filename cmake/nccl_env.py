"""Where a pip build (SKBUILD) looks for the NCCL of the Python environment it installs
into, best first, as one CMake list (';'-separated) on stdout: each a prefix with
include/nccl.h and lib/libnccl.so.2 (a CUDA PyTorch's nvidia-nccl wheel is
site-packages/nvidia/nccl; a conda environment's NCCL is the environment's prefix).

1. the nvidia.nccl package the interpreter imports (a build without isolation);
2. site-packages by sysconfig of the interpreter's environment (pip's isolated build hides
   them from imports, not from sysconfig), then of $VIRTUAL_ENV (`python -m build` builds in
   an environment of its own but keeps the activated venv's $VIRTUAL_ENV) and of
   $CONDA_PREFIX (an activated conda environment), then of the base interpreter (a venv made
   with --system-site-packages);
3. the user's site-packages (pip install --user);
4. the prefixes, in the same order (a conda environment's include/ and lib/).

Run by CMakeLists.txt with the Python that scikit-build-core runs; tested by
tests/scripts/test_nccl_env.py.
"""
import importlib.util
import os
import site
import sys
import sysconfig

where = []
try:
    spec = importlib.util.find_spec("nvidia.nccl")
    where += list(spec.submodule_search_locations or []) if spec else []
except (ImportError, ValueError):
    pass
bases = [sys.prefix]
bases += [os.environ[v] for v in ("VIRTUAL_ENV", "CONDA_PREFIX") if os.environ.get(v)]
bases += [sys.base_prefix]
for base in bases:
    paths = sysconfig.get_paths(vars={"base": base, "platbase": base})
    where += [paths["purelib"] + "/nvidia/nccl", paths["platlib"] + "/nvidia/nccl"]
where += [site.getusersitepackages() + "/nvidia/nccl"] + bases
print(";".join(dict.fromkeys(where)))
