"""Build hook for the optional compiled helper, ``ultradict_ng._helper._native``.

Everything else is configured in pyproject.toml.  The extension is marked
``optional``: where it cannot be compiled (no C compiler, no Python headers)
the install still succeeds and the package uses its ``atomics``-based path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ultradict_ng._helper._native",
            sources=[
                "ultradict_ng/_helper/_native.c",
                "ultradict_ng/_helper/keyhash.c",
                "ultradict_ng/_helper/table.c",
                "ultradict_ng/_helper/unpack.c",
                "ultradict_ng/_helper/tablecache.c",
            ],
            depends=["ultradict_ng/_helper/tablecache.h"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99"],
        )
    ]
)
