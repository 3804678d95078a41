"""The environment a rank runs with, reviewed: torch-mojo's variables (the
table in torch_mojo.env), NCCL's (the names the NCCL or RCCL library that
would be loaded reads), libfabric's (the parameters the loaded libfabric
declares, with their types), and HPE's advice for Slingshot's `cxi`
provider.

Each finding is (severity, message): "error" where the job would fail,
"warning" where a setting has no effect or works against the job.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re

from torch_mojo import env

ERROR, WARNING = "error", "warning"

# HPE's settings for collective libraries on Slingshot (NCCL/RCCL with the
# aws-ofi plugin, and any libfabric job at scale), with the reason.
CXI_ADVICE = {
    "FI_MR_CACHE_MONITOR": ("userfaultfd", "the default monitor can miss freed GPU memory and hang"),
    "FI_CXI_DEFAULT_CQ_SIZE": ("131072", "a small completion queue overflows with many peers"),
    "FI_CXI_DISABLE_HOST_REGISTER": ("1", "host memory registration can deadlock with GPU drivers"),
    "FI_CXI_RX_MATCH_MODE": ("hybrid", "hardware matching alone fails when its list fills up"),
}

# NCCL variables whose values are a fixed set (NCCL ignores others, or
# fails at init).
NCCL_CHOICES = {
    "NCCL_DEBUG": ("VERSION", "WARN", "INFO", "TRACE", "ABORT"),
    "NCCL_IB_DISABLE": ("0", "1"),
    "NCCL_P2P_DISABLE": ("0", "1"),
    "NCCL_SHM_DISABLE": ("0", "1"),
    "NCCL_NET_GDR_LEVEL": ("LOC", "PIX", "PXB", "PHB", "SYS", "0", "1", "2", "3", "4", "5"),
    "NCCL_CROSS_NIC": ("0", "1", "2"),
}

# fi_param_type
_STRING, _INT, _BOOL, _SIZE_T = range(4)
_BOOLEANS = {"0", "1", "true", "false", "yes", "no", "on", "off"}


class _Param(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int), ("help", ctypes.c_char_p),
                ("value", ctypes.c_char_p)]


def libfabric_parameters(path: str) -> dict[str, int]:
    """{name: fi_param_type} of every parameter the libfabric at `path`
    (with the providers it loaded) declares."""
    library = ctypes.CDLL(path)
    library.fi_getparams.argtypes = [ctypes.POINTER(ctypes.POINTER(_Param)), ctypes.POINTER(ctypes.c_int)]
    library.fi_freeparams.argtypes = [ctypes.POINTER(_Param)]
    params, count = ctypes.POINTER(_Param)(), ctypes.c_int()
    if library.fi_getparams(ctypes.byref(params), ctypes.byref(count)) != 0:
        return {}
    found = {params[index].name.decode(): params[index].type for index in range(count.value)}
    library.fi_freeparams(params)
    return found


def nccl_names(path: str) -> set[str]:
    """The NCCL_* names the NCCL (or RCCL) library at `path` reads: NCCL
    builds each variable's name as one string literal."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as contents:
        return {name.decode() for name in re.findall(rb"\x00(NCCL_[A-Z0-9_]{2,})\x00", contents)}


def _unknown(name: str, known, what: str) -> tuple[str, str]:
    return WARNING, f"{name} is not {what} and has no effect" + env.closest_hint(name, known)


def review_ours(environ) -> list[tuple[str, str]]:
    review = env.review_environment(environ)
    return ([(ERROR, f"{problem}: init_process_group will refuse it") for problem in review.invalid.values()]
            + [(WARNING, note) for note in review.unknown.values()])


def review_nccl(environ, library: str | None) -> list[tuple[str, str]]:
    """NCCL_* variables against the library that would read them (None: no
    NCCL or RCCL library is found, so nothing reads them)."""
    names = sorted(name for name in environ if name.startswith("NCCL_"))
    if not names or library is None:
        return []
    try:
        known = nccl_names(library)
    except (OSError, ValueError) as error:
        return [(WARNING, f"the NCCL_* variables cannot be checked: {library} cannot be read ({error})")]
    findings = []
    for name in names:
        if name not in known:
            findings.append(_unknown(name, known, f"a variable {os.path.basename(library)} reads"))
        elif name in NCCL_CHOICES and environ[name] not in NCCL_CHOICES[name]:
            findings.append((WARNING, f"{name}={environ[name]} is not one of {', '.join(NCCL_CHOICES[name])}"))
    return findings


def review_libfabric(environ, parameters: dict[str, int], slingshot: bool) -> list[tuple[str, str]]:
    """FI_* variables against the loaded libfabric's parameters, and HPE's
    advice where collectives cross Slingshot (`slingshot`)."""
    findings = []
    # Without the loaded libfabric's parameters there is nothing to judge by.
    for name in sorted(name for name in environ if name.startswith("FI_") and parameters):
        kind = parameters.get(name)
        if kind is None:
            # A provider that is not loaded here declares nothing: only
            # names of loaded providers' prefixes can be judged.
            if _declared_prefix(name, parameters):
                findings.append(_unknown(name, parameters, "a libfabric parameter"))
            continue
        value = environ[name]
        if kind == _BOOL and value.lower() not in _BOOLEANS:
            findings.append((ERROR, f"{name}={value} is not a boolean (0/1, true/false, yes/no, on/off)"))
        elif kind in (_INT, _SIZE_T) and not re.fullmatch(r"-?\d+" if kind == _INT else r"\d+", value):
            findings.append((ERROR, f"{name}={value} is not {'an integer' if kind == _INT else 'a size in bytes'}"))
    if slingshot:
        for name, (value, reason) in CXI_ADVICE.items():
            if environ.get(name) != value:
                now = f"is {environ[name]}" if name in environ else "is unset"
                findings.append((WARNING, f"{name} {now}: HPE recommends {name}={value} on Slingshot ({reason})"))
    return findings


def _declared_prefix(name: str, parameters) -> bool:
    """Whether libfabric declares parameters of `name`'s kind, so that a
    name it lacks is a typo: core names (FI_<NAME>), or names of a loaded
    provider's prefix (FI_TCP_... when tcp is loaded). A provider that is
    not loaded here (cxi off Slingshot) declares nothing to judge by."""
    parts = name.split("_")
    if len(parts) == 2:
        return True
    prefix = f"{parts[0]}_{parts[1]}_"
    return any(known.startswith(prefix) for known in parameters)
