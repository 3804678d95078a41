"""What the libfabric a process loads offers on this machine (its version and
providers, from fi_getinfo), and which provider a communicator spanning
nodes would open among them: what `torch-mojo info` and the doctor report."""

import ctypes
import os


# libfabric's C API, for its version and providers (fabric.h, stable in 1.x).
class _FabricAttributes(ctypes.Structure):
    _fields_ = [("fabric", ctypes.c_void_p), ("name", ctypes.c_char_p), ("prov_name", ctypes.c_char_p),
                ("prov_version", ctypes.c_uint32), ("api_version", ctypes.c_uint32)]


class _Info(ctypes.Structure):
    pass


_Info._fields_ = [
    ("next", ctypes.POINTER(_Info)), ("caps", ctypes.c_uint64), ("mode", ctypes.c_uint64),
    ("addr_format", ctypes.c_uint32), ("src_addrlen", ctypes.c_size_t), ("dest_addrlen", ctypes.c_size_t),
    ("src_addr", ctypes.c_void_p), ("dest_addr", ctypes.c_void_p), ("handle", ctypes.c_void_p),
    ("tx_attr", ctypes.c_void_p), ("rx_attr", ctypes.c_void_p), ("ep_attr", ctypes.c_void_p),
    ("domain_attr", ctypes.c_void_p), ("fabric_attr", ctypes.POINTER(_FabricAttributes)),
    ("nic", ctypes.c_void_p),
]


def libfabric_details(path: str) -> dict:
    """The version of the libfabric at `path` and the providers it offers on
    this machine (utility providers as `tcp;ofi_rxm`), from fi_getinfo."""
    library = ctypes.CDLL(path)
    library.fi_version.restype = ctypes.c_uint32
    version = library.fi_version()
    library.fi_getinfo.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                                   ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(_Info))]
    library.fi_freeinfo.argtypes = [ctypes.POINTER(_Info)]
    head = ctypes.POINTER(_Info)()
    providers = []
    if library.fi_getinfo(version, None, None, 0, None, ctypes.byref(head)) == 0:
        entry = head
        while entry:
            attributes = entry.contents.fabric_attr
            name = attributes.contents.prov_name.decode() if attributes and attributes.contents.prov_name else None
            if name and name not in providers:
                providers.append(name)
            entry = entry.contents.next
        library.fi_freeinfo(head)
    return {"version": f"{version >> 16}.{version & 0xFFFF}", "providers": providers}


# libfabric providers that drive a fabric NIC, and those that run over
# sockets (the others run over shared memory, or are utility layers).
HARDWARE_PROVIDERS = ("cxi", "verbs", "efa", "psm2", "psm3", "opx", "usnic")
SOCKET_PROVIDERS = ("tcp", "sockets", "udp", "net")


def fabric_provider_choice(providers: list[str]) -> dict:
    """The provider a communicator spanning nodes would open, among the
    `providers` libfabric offers here ("tcp" is offered as "tcp;ofi_rxm"),
    and whether it is offered."""
    from torch_mojo.env import BY_NAME
    from torch_mojo.mojoccl import Library

    chosen = os.environ.get("MOJOCCL_FABRIC_PROVIDER") or None
    setting = chosen or BY_NAME["MOJOCCL_FABRIC_PROVIDER"].default

    def offered(provider):
        return any(name == provider or name.startswith(provider + ";") for name in providers)

    if setting == "auto":
        order = Library().fabric_auto_providers()  # libmojoccl's order: fabric NICs', then sockets
        provider = next((name for name in order if offered(name)), order[-1])
        source = "MOJOCCL_FABRIC_PROVIDER=auto" if chosen else "auto, the default"
    else:
        provider, source = setting, "MOJOCCL_FABRIC_PROVIDER" if chosen else "the default"
    return {"provider": provider, "source": source, "offered": offered(provider)}
