"""Small helpers every layer may use (they import nothing else of minillm's).

    c_kernels.py   build a C file once with the system compiler, load it, expose it as a torch op
    native_ops.py  those ops' CPU kernels in C++ (torch_ops.cpp), built once against torch's headers
    paths.py       where minillm caches things
    validate.py    strict checks of option values, with messages that name the field
    registry.py    one generic registry of pluggable things by name
"""


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of b hold a items."""
    return -(-a // b)
