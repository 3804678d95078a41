"""What a shared library asks of the dynamic loader, read from its ELF
dynamic section (64-bit little-endian: x86_64, aarch64), and the file the
loader would give it for each library it needs, in ld.so's order:

1. an object already loaded under the same soname (the loader reuses it);
2. the library's DT_RPATH, where it has no DT_RUNPATH;
3. LD_LIBRARY_PATH;
4. its DT_RUNPATH;
5. the ldconfig cache, then /lib64, /usr/lib64, /lib, /usr/lib.

$ORIGIN in a path is the library's own directory. Step 1 is the caller's:
it knows what its process has loaded.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass, field

DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
PT_LOAD, PT_DYNAMIC = 1, 2
DEFAULT_DIRECTORIES = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


@dataclass
class Dynamic:
    needed: list[str] = field(default_factory=list)
    soname: str | None = None
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)


def dynamic_section(path: str) -> Dynamic:
    """The library's needs and search paths; empty for a file that is not a
    64-bit little-endian ELF object with a dynamic section."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:6] != b"\x7fELF\x02\x01":
        return Dynamic()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for index in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if kind == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return Dynamic()
    entries = []
    for position in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, position)
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((_file_offset(loads, value) for tag, value in entries if tag == DT_STRTAB), None)
    if strtab is None:
        return Dynamic()

    def text(offset: int) -> str:
        start = strtab + offset
        return data[start:data.index(b"\0", start)].decode(errors="replace")

    found = Dynamic()
    origin = os.path.dirname(os.path.realpath(path))
    for tag, value in entries:
        if tag == DT_NEEDED:
            found.needed.append(text(value))
        elif tag == DT_SONAME:
            found.soname = text(value)
        elif tag in (DT_RPATH, DT_RUNPATH):
            directories = [each.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                           for each in text(value).split(":") if each]
            (found.rpath if tag == DT_RPATH else found.runpath).extend(directories)
    return found


def _file_offset(loads, address: int) -> int | None:
    for vaddr, offset, size in loads:
        if vaddr <= address < vaddr + size:
            return address - vaddr + offset
    return None


def soname(path: str) -> str:
    """The name the loader knows a library by: its DT_SONAME, else its file name."""
    return dynamic_section(path).soname or os.path.basename(path)


def resolve_needed(path: str, needed: str, environ=None) -> str | None:
    """The file the loader would open for `needed`, a library that `path`
    needs, when no loaded object has that soname (steps 2 to 5 above)."""
    environ = os.environ if environ is None else environ
    own = dynamic_section(path)
    directories = [*(own.rpath if not own.runpath else []),
                   *filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")), *own.runpath]
    for directory in directories:
        candidate = os.path.join(directory, needed)
        if os.path.exists(candidate):
            return candidate
    return in_ldconfig_cache(needed) or next((os.path.join(directory, needed) for directory in DEFAULT_DIRECTORIES
                 if os.path.exists(os.path.join(directory, needed))), None)


def in_ldconfig_cache(soname: str) -> str | None:
    """Where the ldconfig cache (`ldconfig -p`) puts `soname`, if it does."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(ldconfig):
            listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
            for line in listing.splitlines():
                name, _, path = line.strip().partition(" => ")
                if name.split(" ")[0] == soname and os.path.exists(path):
                    return path
            break
    return None
