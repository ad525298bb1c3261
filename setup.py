"""Builds profkit's C extension (the perf script folding core); everything else is in
pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("profkit._fold", ["profkit/_fold.c"],
                             extra_compile_args=["-O2", "-std=c99", "-D_GNU_SOURCE"],
                             optional=False)])
