"""Where the installed parts of torch-mojo are. In an editable install the
Python files stay in the source tree while the compiled ones are installed
beside the _C module, so paths are taken from _C's location."""

import importlib.util
import os


def package_dir():
    spec = importlib.util.find_spec("torch_mojo._C")
    if spec is None or spec.origin is None:
        raise ImportError("torch_mojo._C is not installed: build torch-mojo first (`make build`)")
    return os.path.dirname(spec.origin)


def library_dir():
    return os.path.join(package_dir(), "lib")


def mojoccl_path():
    return os.path.join(library_dir(), "libmojoccl.so")
