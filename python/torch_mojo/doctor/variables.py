"""The environment a rank runs with, reviewed: torch-mojo's variables (the
table in torch_mojo.env), NCCL's and RCCL's (the names the library that
would be loaded reads), libfabric's (the parameters the loaded libfabric
declares, with their types), the network plugin RCCL/NCCL would load and
the variables that steer it, and the settings sites publish for the node's
network and GPUs (torch_mojo.site_settings).

Each finding is (severity, message): "error" where the job would fail,
"warning" where a setting has no effect or works against the job.
"""

from __future__ import annotations

import ctypes
import glob
import mmap
import os
import re
import socket

from torch_mojo import env, launcher, libraries, site_settings
from torch_mojo.doctor.filesystems import SHARED_FILESYSTEMS, filesystem_of

ERROR, WARNING = "error", "warning"

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


def names_in_library(path: str, prefix: str = "NCCL_") -> set[str]:
    """The `prefix`* variable names the library at `path` reads (NCCL, RCCL
    and their plugins keep each name as one string literal)."""
    pattern = rb"\x00(" + re.escape(prefix.encode()) + rb"[A-Z0-9_]{2,})(?=\x00)"  # NULs shared by neighbours
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as contents:
        return {name.decode() for name in re.findall(pattern, contents)}


def _unknown(name: str, known, what: str) -> tuple[str, str]:
    return WARNING, f"{name} is not {what} and has no effect" + env.closest_hint(name, known)


def review_ours(environ) -> list[tuple[str, str]]:
    review = env.review_environment(environ)
    return ([(ERROR, f"{problem}: init_process_group will refuse it") for problem in review.invalid.values()]
            + [(WARNING, note) for note in review.unknown.values()])


def review_nccl(environ, library: str | None) -> list[tuple[str, str]]:
    """NCCL_* variables against the library that would read them (None: no
    NCCL or RCCL library is found, so nothing reads them)."""
    reads_rccl_names = bool(library) and "rccl" in os.path.basename(library)
    names = sorted(name for name in environ
                   if name.startswith("NCCL_") or (name.startswith("RCCL_") and reads_rccl_names))
    if not names or library is None:
        return []
    try:
        known = names_in_library(library) | (names_in_library(library, "RCCL_") if reads_rccl_names else set())
    except (OSError, ValueError) as error:
        return [(WARNING, f"the NCCL_* variables cannot be checked: {library} cannot be read ({error})")]
    findings = []
    for name in names:
        if name not in known:
            findings.append(_unknown(name, known, f"a variable {os.path.basename(library)} reads"))
        elif name in NCCL_CHOICES and environ[name] not in NCCL_CHOICES[name]:
            findings.append((WARNING, f"{name}={environ[name]} is not one of {', '.join(NCCL_CHOICES[name])}"))
    return findings


def review_libfabric(environ, parameters: dict[str, int]) -> list[tuple[str, str]]:
    """FI_* variables against the loaded libfabric's parameters."""
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
    return findings


def review_site_settings(environ, network: str, gpu: str) -> list[tuple[str, str]]:
    """The settings sites publish for this node's network and GPUs that
    the environment lacks or sets otherwise."""
    findings = []
    title = site_settings.machine_title(network, gpu)
    for setting in site_settings.for_machine(network, gpu):
        value = environ.get(setting.name)
        if not setting.doctor_checks or (value is not None and setting.accepts(value)):
            if setting.node_local and value and filesystem_of(value) in SHARED_FILESYSTEMS:
                findings.append((WARNING, f"{setting.name}={value} is on a shared {filesystem_of(value)} "
                                 f"filesystem: put it on node-local disk ({setting.reason})"))
            continue
        now = f"is {value}" if value is not None else "is unset"
        findings.append((WARNING, f"{setting.name} {now}: {setting.source} recommends {setting.name}="
                         f"{setting.value} for {title} ({setting.reason}); `torch-mojo modulefile --network "
                         f"{network} --gpu {gpu}` sets it"))
    return findings


# Where the cxi driver shows each Slingshot NIC's settings.
CXI_DEVICES = "/sys/class/cxi"


def review_rendezvous_gets(environ, devices: str = CXI_DEVICES) -> list[tuple[str, str]]:
    """FI_CXI_RDZV_PROTO=alt_read against the NICs' rendezvous gets
    (rdzv_get_en, which the scheduler turns off for a job launched so)."""
    if environ.get("FI_CXI_RDZV_PROTO") != "alt_read":
        return []
    still_on = []
    for path in sorted(glob.glob(os.path.join(devices, "cxi*", "device", "properties", "rdzv_get_en"))):
        try:
            with open(path) as file:
                if file.read().strip() != "0":
                    still_on.append(path.split(os.sep)[-4])
        except OSError:
            continue
    if not still_on:
        return []
    how = site_settings.rendezvous_gets_off(launcher.scheduler(environ))
    return [(WARNING, f"FI_CXI_RDZV_PROTO=alt_read, but rendezvous gets are on ({', '.join(still_on)}: "
             f"rdzv_get_en=1): libfabric keeps its default protocol, without a word; launch the job with them off "
             f"({how})")]


# The networks NCCL and RCCL have built in; any other name NCCL_NET gives
# is a plugin's.
BUILT_IN_NETWORKS = ("IB", "Socket")


def review_net_plugin(environ, kind: str | None) -> list[tuple[str, str]]:
    """The plugin RCCL or NCCL (`kind`; None: no GPU library here, either)
    would load, against NCCL_NET and NCCL_NET_PLUGIN. Both set is right:
    NCCL_NET_PLUGIN names a plugin file with a suffix (libnccl-net-ofi.so),
    NCCL_NET makes init fail where it does not load."""
    forced, named = environ.get("NCCL_NET"), environ.get("NCCL_NET_PLUGIN")
    if kind is None and not (forced or named):
        return []
    lookups = [libraries.find_net_plugin(each, environ) for each in ([kind] if kind else ["rccl", "nccl"])]
    found = next((lookup for lookup in lookups if lookup.path), None)
    looked_for = " or ".join(lookup.library for lookup in lookups)
    findings = []
    if named and named != "none" and found is None:
        findings.append((ERROR, f"NCCL_NET_PLUGIN={named} names a plugin that is not found ({looked_for} on the "
                         "library path): RCCL/NCCL then use sockets between nodes, or fail at init where NCCL_NET "
                         "is set; put the plugin's lib directory on LD_LIBRARY_PATH, or unset NCCL_NET_PLUGIN"))
    elif forced and forced not in BUILT_IN_NETWORKS and found is None:
        findings.append((ERROR, f"NCCL_NET={forced} asks for a plugin's network and no plugin is found "
                         f"({looked_for} on the library path): RCCL/NCCL fail at init; {site_settings.PLUGIN_ADVICE}"))
    plugin_names = sorted(name for name in environ if name.startswith("OFI_NCCL_"))
    if found and plugin_names:
        known = names_in_library(found.path, "OFI_NCCL_")
        findings += [_unknown(name, known, f"a variable {os.path.basename(found.path)} reads")
                     for name in plugin_names if known and name not in known]
    return findings


def interface_matches(pattern: str, names: list[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME picks, as NCCL reads it: a comma-
    separated list of prefixes, `=` for exact names, a leading `^` for
    the ones to leave out."""
    exclude = pattern.startswith("^")
    exact = pattern.lstrip("^").startswith("=")
    entries = [entry for entry in pattern.lstrip("^").lstrip("=").split(",") if entry]
    chosen = [name for name in names if any(name == entry if exact else name.startswith(entry) for entry in entries)]
    return [name for name in names if name not in chosen] if exclude else chosen


def review_socket_interface(environ) -> list[tuple[str, str]]:
    pattern = environ.get("NCCL_SOCKET_IFNAME")
    if not pattern:
        return []
    names = [name for _, name in socket.if_nameindex()]
    if interface_matches(pattern, names):
        return []
    return [(ERROR, f"NCCL_SOCKET_IFNAME={pattern} matches none of this node's interfaces ({', '.join(names)}): "
             "RCCL/NCCL fail at init (\"no socket interface found\"); name one of them")]


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
