"""The one C part, built where a compiler is: the zygote's clone loop and a child's set-up
(worker/engine/_nativechild.c). Without a compiler the install still succeeds and the
zygote runs the same steps in Python, at about 1 ms more CPU per snippet."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "codepool.worker.engine._nativechild",
            ["worker/engine/_nativechild.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        )
    ]
)
