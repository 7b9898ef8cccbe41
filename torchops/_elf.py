"""Read the shared-library dependencies (DT_NEEDED) of an ELF file, without binutils.

setup.py uses it after linking to refuse a library that carries its own copy of libstdc++
(`static_libstdcxx_error`); a test uses it on the built library.
"""
import struct

_DT_NEEDED, _DT_STRTAB = 1, 5
_PT_LOAD, _PT_DYNAMIC = 1, 2


def needed_libraries(path):
    """The DT_NEEDED entries of an ELF shared object, in order. Raises ValueError for a non-ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        phoff, = struct.unpack_from(end + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
        ph_fmt, dyn_fmt = end + "IIQQQQQQ", end + "qQ"
    else:
        phoff, = struct.unpack_from(end + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x2A)
        ph_fmt, dyn_fmt = end + "IIIIIIII", end + "iI"
    loads, dynamic = [], None
    for i in range(phnum):
        fields = struct.unpack_from(ph_fmt, data, phoff + i * phentsize)
        if is64:
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = fields
        else:
            p_type, p_offset, p_vaddr, _, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []

    def file_offset(vaddr):  # DT_STRTAB holds a virtual address: map it through the LOAD segments
        for v, o, size in loads:
            if v <= vaddr < v + size:
                return vaddr - v + o
        raise ValueError(f"{path}: string table address {vaddr:#x} is in no LOAD segment")

    entries, strtab, step = [], None, struct.calcsize(dyn_fmt)
    for off in range(dynamic[0], dynamic[0] + dynamic[1], step):
        tag, val = struct.unpack_from(dyn_fmt, data, off)
        if tag == 0:
            break
        if tag == _DT_NEEDED:
            entries.append(val)
        elif tag == _DT_STRTAB:
            strtab = file_offset(val)
    if strtab is None:
        return []
    return [data[strtab + e:data.index(b"\0", strtab + e)].decode() for e in entries]


def static_libstdcxx_error(path, cxx):
    """None if the library depends on the shared libstdc++, else the message the build fails with.

    A library linked with its own copy of libstdc++ (a toolchain that links it statically, e.g. a gcc wrapper
    passing -static-libstdc++) runs its iostream code beside the process's, and every `ostream << integer` in it
    then crashes or prints nothing: its first error message would kill the process or lose its numbers.
    """
    needed = needed_libraries(path)
    if any(n.startswith("libstdc++.so") for n in needed):
        return None
    return (f"torchops: {path} was linked without the shared libstdc++ (it depends on {needed}): the compiler "
            f"CXX={cxx} links libstdc++ statically, and such a library crashes or loses numbers on its first error "
            "message. Build with the system compiler, e.g. `CXX=/usr/bin/g++ CC=/usr/bin/gcc python setup.py "
            "build_ext --inplace`, or drop -static-libstdc++ from LDFLAGS.")
