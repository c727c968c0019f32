"""Compiler options of code built against //third_party:python."""

PYTHON_COPTS = [
    "-isystem",
    "/usr/include/python3.11",
    # pybind11's own warnings are not ours to fix.
    "-Wno-unused-value",
]
