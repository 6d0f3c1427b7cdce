"""Build blink._C (the tracer and the torch-free core) with torch's C++ extension helpers.

Build with `pip install --no-build-isolation .` so the extension compiles against the torch
that is installed (torch 2.11 to 2.14). CUPTI support is a separate, optional module,
blink._cupti, built only where a CUPTI for torch's CUDA version is found
(csrc/cupti/find_cupti.py; BLINK_WITH_CUPTI=0 skips it, =1 requires it).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def write_build_stamp() -> None:
    """Record what the extension is built against, for the load error in blink/_ext.py."""
    import json
    import sys

    import torch

    stamp = {
        "torch_version": torch.__version__,
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    with open(os.path.join(ROOT, "blink", "_build.json"), "w", encoding="utf-8") as f:
        json.dump(stamp, f)


def get_extensions() -> list:
    core = sorted(glob.glob(os.path.join("csrc", "core", "*.cpp")))
    adapters = sorted(glob.glob(os.path.join("csrc", "torch", "*.cpp")))
    sources = core + adapters + [os.path.join("csrc", "python", "bindings.cpp")]
    debug = os.environ.get("BLINK_DEBUG", "0") == "1"
    # No -std here: torch picks the standard its headers need (C++20 from torch 2.12 on). The
    # torch-free core is C++17 and a test compiles it alone with -std=c++17 to keep it so.
    cxx = ["-O0" if debug else "-O2", "-Wall", "-Wno-unused-function"]
    return [
        CppExtension(
            "blink._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc", "include")],
            extra_compile_args={"cxx": cxx},
        )
    ] + cupti_extensions(cxx)


def cupti_extensions(cxx: list[str]) -> list:
    """blink._cupti where a CUPTI matching torch's CUDA is found; says which in the build log."""
    path = os.path.join(ROOT, "csrc", "cupti", "find_cupti.py")
    spec = importlib.util.spec_from_file_location("blink_find_cupti", path)
    finder = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = finder  # dataclasses look their module up there
    spec.loader.exec_module(finder)
    build, search, line = finder.decide()  # RuntimeError when BLINK_WITH_CUPTI=1 cannot build
    print(line, flush=True)
    if not build:
        return []
    found = search.found
    return [
        CppExtension(
            "blink._cupti",
            sorted(glob.glob(os.path.join("csrc", "cupti", "*.cpp"))),
            include_dirs=[os.path.join(ROOT, "csrc", "include"), *found.include_dirs],
            library_dirs=[found.library_dir],
            libraries=[":" + found.library],  # the exact soname torch loads (libcupti.so.N)
            extra_link_args=[f"-Wl,-rpath,{found.library_dir}"],
            extra_compile_args={"cxx": cxx},
        )
    ]


write_build_stamp()

setup(
    name="blink",
    version="0.1.0",
    description="Predict PyTorch model GPU time and memory without running it on that GPU",
    packages=find_packages(include=["blink", "blink.*"]),
    package_data={"blink": ["data/*.json", "zoo_configs/*.json", "_build.json",
                            "dashboard/static/*"]},
    ext_modules=get_extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    # torch_dynamo_backends: torch.compile(model, backend="blink") finds the backend without
    # an explicit `import blink.compile` (torch/_dynamo/backends/registry.py reads this group).
    entry_points={"console_scripts": ["blink=blink.cli:main"],
                  "torch_dynamo_backends": ["blink=blink.compile:blink_backend"]},
    python_requires=">=3.11",
    zip_safe=False,
)
